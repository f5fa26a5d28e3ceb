"""How an argv reaches a process on a host, through ssh, sudo and `pct exec`, exactly, and
what it means when it did not.

Why: quoting by hand through three shells (ssh, then `pct exec`, then `bash -c`) breaks on
the first odd argument; here a command stays a list of arguments until the one hop that
re-parses a string, and is quoted once for it.

The whole account: docs/design-notes.md (scripts/reach/route.py)."""
from __future__ import annotations

import shlex

from ..config.route import PctHop, Route, SshHop, SudoHop
from ..config.sshopts import known_hosts_files
from . import login, ssh
from .ssh import SSH_UNREACHABLE, keepalive_lost, ssh_timed_out

RAN_PREFIX = "=====gpu-pivot-ran"


def wrap(route: Route, argv: list, for_paste: bool = False, ssh_log: str | None = None) -> list:
    """argv behind every hop of `route`, outermost first; `ssh_log`: where the ssh hop writes its
    own messages (-E); `for_paste`: the ssh hop with the host's own options only (one_liner)."""
    if not argv:
        raise ValueError("empty command")
    out = list(argv)
    for hop in reversed(route.hops):
        out = _behind(hop, out, for_paste, ssh_log)
    return out


def _behind(hop: SshHop | SudoHop | PctHop, argv: list, for_paste: bool, ssh_log: str | None) -> list:
    """argv behind one hop. sudo -n: sudo that wants a password (or a terminal, `requiretty`)
    fails at once, exit 1, instead of waiting for an answer nobody can type (become_failure);
    its `--` ends sudo's own options, so a command starting with `-` is a command. sudo and pct
    exec argv as given: no quoting."""
    if isinstance(hop, SshHop):
        return ssh.command(hop, argv, for_paste, ssh_log)
    if isinstance(hop, SudoHop):
        return ["sudo", "-n", "--", *argv]
    return ["pct", "exec", hop.ctid, "--", *argv]


def one_liner(route: Route, argv: list) -> str:
    """The line to paste into a POSIX shell on the operator's machine."""
    return shlex.join(wrap(route, argv, for_paste=True))


_PROOF = 'printf "%s\\n" "$1" >&2; '  # the proof line, first: ran_line(nonce), the script's $1
# An operator's command (`alias`): a child of sh, not exec'd, as ssh reports a command killed
# by a signal as 255, the same as its own failure, and sh's wait turns that death into 128+N;
# a missing or non-executable command is one line naming the host (sh's own names none).
_OPERATOR = (
    _PROOF + 'alias=$2; shift 2; '
    'case "$1" in */*) [ -f "$1" ] && [ -x "$1" ] ;; *) command -v "$1" >/dev/null 2>&1 ;; esac || { '
    'if [ -e "$1" ]; then printf "gpu-pivot: %s: %s: not executable\\n" "$alias" "$1" >&2; exit 126; fi; '
    'printf "gpu-pivot: %s: %s: command not found\\n" "$alias" "$1" >&2; exit 127; }; '
    '"$@"')


def marked(route: Route, argv: list, nonce: str, alias: str | None = None) -> list:
    """`argv` behind a line on stderr that proves the far side ran (ran_line(nonce)), then exec;
    with `alias`, an operator's command run as sh's child (_OPERATOR). The one proof wrapper.

    Why: ssh exits 255 both when it fails and when the remote command exits 255, and
    asking the ControlMaster socket (`ssh -O check`) cannot tell them apart when there is
    no socket (ControlPath=none: the check itself exits 255). A line printed by `sh` on
    the host before the command can only come from the far side; on this machine (no ssh)
    nothing is added. Behind a sudo hop the line comes from root's side of sudo, so it
    also proves sudo ran the command (become_failure)."""
    if route.ssh is None:
        return list(argv)
    if alias is not None:
        return ["sh", "-c", _OPERATOR, "gpu-pivot", ran_line(nonce), alias, *argv]
    return ["sh", "-c", _PROOF + 'shift; exec "$@"', "gpu-pivot", ran_line(nonce), *argv]


def ssh_failed(route: Route, returncode: int, ran: bool, stderr: str = "") -> bool:
    """Was this exit ssh's own failure, not the remote command's?

    255 with no proof that the far side ran (`ran`: the marked() line was seen): ssh's.
    255 after that line: the remote command's own exit 255, unless ssh said its
    keep-alive went unanswered (the connection died mid-call: ssh's, a time-out)."""
    if returncode != SSH_UNREACHABLE or route.ssh is None:
        return False
    return not ran or keepalive_lost(stderr)




def ran_line(nonce: str) -> str:
    return f"{RAN_PREFIX} {nonce}====="


def unreachable(alias: str, stderr: str, ran: bool = False, hop: SshHop | None = None) -> HostUnreachable:
    """The error for ssh's own exit 255: HostTimedOut when ssh said it waited in vain,
    HostKeyFailed when it refused the host's key (`hop`: the ssh hop, for its known_hosts and
    keys), LoginRefused when the host refused the login (login.refused)."""
    if "Host key verification failed" in stderr:
        return host_key_failed(alias, stderr, hop)
    refused = login.refused(alias, stderr, hop)
    if refused is not None:
        return LoginRefused(refused)
    tail = " | ".join(line for line in stderr.strip().splitlines() if line.strip() and RAN_PREFIX not in line)[-300:]
    if ssh_timed_out(stderr):
        where = "; the command had started there and may still finish (see `invoke status`)" if ran else ""
        return HostTimedOut(f"{alias}: host timed out (ssh: {tail or 'no answer'}){where}")
    return HostUnreachable(f"{alias}: host unreachable (ssh exit 255: {tail or 'nothing on stderr'})")


def route_failure(route: Route, alias: str, code: int, ran: bool, ssh_said: str, stderr: str,
                  what: str = "the agent"):
    """The error for a call that never reached its command: ssh's own failure (ssh_failed),
    decided from ssh's -E log alone (a remote command cannot fake it) and shown with that log, or
    the call's stderr when the log is empty; else sudo's refusal (become_failure); else None.
    One place for every call over a route (agent calls, `run`, `logs --follow`); `what` names
    the command in sudo's line."""
    if ssh_failed(route, code, ran, ssh_said):
        return unreachable(alias, ssh_said or stderr, ran, route.ssh)
    return become_failure(route, alias, code, ran, stderr, what)


SUDO_REFUSED = 1  # sudo's own exit code for every refusal; otherwise it exits with its command's code


def become_failure(route: Route, alias: str, code: int, ran: bool, stderr: str, what: str = "the agent"):
    """SudoRefused when the route's sudo hop refused to run the command, else None.

    Decided by the exit code and the proof line (marked), never by sudo's words, which are
    translated (the host's LANG): the line is printed by the command's wrapper once sudo runs it
    as root, so sudo's exit 1 without it is sudo's own refusal: a password wanted (no NOPASSWD
    rule), a terminal wanted (requiretty: there is none, sudo -n never opens one) or no rule for
    the command; nothing ran. sudo's words follow in the line, for the operator."""
    if route.become is None or ran or code != SUDO_REFUSED:
        return None
    hop = route.ssh
    user, _, where = hop.dest.rpartition("@") if hop else ("", "", "this machine")
    said = " | ".join(line.strip() for line in stderr.splitlines() if line.strip() and RAN_PREFIX not in line)
    said = f"; it said: {said[-200:]}" if said else ""
    rule = f"`{user} ALL=(root) NOPASSWD: ALL`" if user else "`USER ALL=(root) NOPASSWD: ALL` for the ssh user"
    return SudoRefused(f"{alias}: sudo on {where} refused to run {what} as root without a password or a terminal "
                       f"(exit 1{said}); {alias.upper()}_BECOME=sudo needs a sudoers rule there such as {rule}, "
                       "and no requiretty for that user; nothing ran")


def host_key_failed(alias: str, stderr: str, hop: SshHop | None) -> HostKeyFailed:
    """One line for ssh's "Host key verification failed": the host as ssh names it, whether its
    key changed or is unknown, and the known_hosts file (from ssh's own words, else the host's
    UserKnownHostsFile option, else ssh's default)."""
    import re

    host = re.search(r"(?:Host key for|host key is known for) (\S+)", stderr)
    name = host.group(1) if host else (hop.dest.rsplit("@", 1)[-1] if hop else alias)
    offending = re.search(r"Offending \S+ key in (.+?):(\d+)\s*$", stderr, re.M)
    if offending:
        where = f"{offending.group(1)} (line {offending.group(2)})"
        what = (f"the key {name} sent does not match the one {where} holds; if the host was reinstalled, check "
                f"its new key, then: ssh-keygen -f {shlex.quote(offending.group(1))} -R {shlex.quote(name)}")
    else:
        files = known_hosts_files(hop.opts) if hop else []
        where = " and ".join(files) if files else ("~/.ssh/known_hosts (or the UserKnownHostsFile your ~/.ssh/config "
                                                   "sets for it)")
        what = f"no key for {name} is known in {where}; add the host's key there once its fingerprint is checked"
    return HostKeyFailed(f"{alias}: host key verification failed for {name}: {what}; nothing ran there")


class HostUnreachable(RuntimeError):
    """ssh itself failed (exit 255): the host was not reached, nothing ran there."""


class HostKeyFailed(HostUnreachable):
    """ssh refused the host's key (changed, or unknown with StrictHostKeyChecking=yes): the
    host was not reached, nothing ran there; exit 3 like any unreachable host, on its own line."""


class LoginRefused(HostUnreachable):
    """The host answered and refused the login (the user or its key): nothing ran there; exit 3
    like an unreachable host, in its own words (login.py)."""


class SudoRefused(HostUnreachable):
    """sudo on the host would not run the command without a password or a terminal, or has no
    rule for it (become_failure): nothing ran there; exit 3 like an unreachable host."""


class HostTimedOut(HostUnreachable):
    """No answer in time: ssh's connect or keep-alive timeout, or the call's deadline.
    Its own exit code (codes.EXIT_TIMED_OUT); a HostUnreachable for code that only
    needs to know the host gave no result."""

