"""Route: how an argv reaches a process on a host, through ssh and `pct exec`, exactly.

Why: quoting by hand through three shells (`ssh ... 'pct exec 129 -- bash -c
"... awk \\"{print \\\\\\$2}\\" ..."'`) breaks on the first odd argument. Here a command stays a list of arguments until
the one hop that re-parses a string:

- ssh joins its command words with spaces and the remote login shell re-parses them,
  so the inner argv becomes ONE `shlex.join` string (one quoting for that shell layer);
- `pct exec CTID -- argv` execs argv as given (lxc-attach), so no quoting at all;
- `bash -c SCRIPT` takes SCRIPT as one argument: it is just an element of argv here.

`wrap()` gives an argv to run from Python; `one_liner()` gives the same thing as one
line for a terminal (the terminal's shell is one more layer: one more shlex.join).
"""
from __future__ import annotations

import contextlib
import os
import shlex
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..agent.state import statedir

SSH_UNREACHABLE = 255
CONTROL_DIR_ENV = "GPU_PIVOT_CONTROL_DIR"
CONTROL_PERSIST_S = 120
# Why these: without them a host that drops packets kept `invoke ping` silent for 13 minutes
# (the kernel's TCP retries), and a host that froze mid-call held its fleet forever. A dead
# connection is now noticed after CONNECT_TIMEOUT_S, or ALIVE_INTERVAL_S * ALIVE_COUNT once
# connected. A host's ALIAS_SSH_OPTS overrides any of them (ssh keeps the first value it
# reads, and a host's own options come first), e.g. `-o ConnectTimeout=30` for a slow link.
CONNECT_TIMEOUT_S = 10
ALIVE_INTERVAL_S = 5
ALIVE_COUNT = 3
# ssh's own words when it gave up waiting (connect, banner, keep-alive): a time-out, not a refusal
_SSH_TIMEOUT_WORDS = ("timed out", "Timeout, server", "Connection timed out")
RAN_PREFIX = "=====gpu-pivot-ran"
# 36 + "/" + 40 (%C) + 9 (control_name's "-" + 8) + 17 (ssh's ".XXXXXXXXXXXXXXXX") = 103: a
# socket path fits sun_path on Linux (107) and on macOS (103), where operators' laptops run ssh
CONTROL_DIR_MAX = 36


def control_dir(base: str | None = None) -> Path:
    """Where ssh ControlMaster sockets live: private, and short enough for a socket name.

    A unix socket path holds about 104 bytes and a socket's name is ssh's 40-character %C
    hash, 9 characters of ours (control_name) and ssh's 17-character temporary suffix, so a
    directory longer than CONTROL_DIR_MAX is swapped for a short one derived from it (same
    directory every time for the same setting).
    Private and checked (statedir.private_dir: created 0700, or ours, not a link, not
    group/other writable): the default lives in /tmp, where another user could create
    it first and plant a socket that our ssh would take for its master connection.
    A refused directory raises StateDirError, one line naming it.
    """
    configured = base or os.environ.get(CONTROL_DIR_ENV)
    base = configured or _default_base()
    if len(base) > CONTROL_DIR_MAX:
        base, configured = f"/tmp/gpu-pivot-ssh-{os.getuid()}-{_digest(base, 10)}", None
    return Path(statedir.private_dir(base, parents=bool(configured), env=CONTROL_DIR_ENV))


def _default_base() -> str:
    """Root: /run/gpu-pivot/ssh, inside a directory no other user can create or enter. Others:
    their private runtime dir when its path is short enough for a socket, else /tmp."""
    if os.geteuid() == 0:
        return os.path.join(statedir.run_dir(), "ssh")
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    # not a dir another user can swap, and short enough for a socket
    if runtime and len(runtime) <= CONTROL_DIR_MAX - len("/gpu-pivot-ssh") and statedir.is_private(runtime):
        return os.path.join(runtime, "gpu-pivot-ssh")
    return f"/tmp/gpu-pivot-ssh-{os.getuid()}"


def control_name(dest: str, opts: tuple | list) -> str:
    """The master socket's name for one connection: ssh's %C (local host, remote host, port,
    user, ProxyJump as ssh resolves them) and a digest of the destination and every ssh option.

    Why the options too: %C alone let two aliases reaching the same user@host:port share one
    master, so an alias with its own UserKnownHostsFile (or key, or any other option) rode on
    the other's connection and its host-key check never ran."""
    return f"%C-{_digest(chr(0).join([dest, *opts]), 8)}"


def control_path(dest: str, opts: tuple | list, base: str | None = None) -> str:
    """The ControlPath of one connection (%C unexpanded), e.g. for `ssh -S PATH -O exit DEST`;
    `base`: a control directory setting other than this process's (control_dir)."""
    return f"{control_dir(base)}/{control_name(dest, opts)}"


def control_opts(dest: str = "", opts: tuple | list = ()) -> list:
    """ssh options for connection sharing, a master per destination + options (control_name).
    A default directory that another user squatted (possible only for the /tmp fallback)
    costs the sharing, never the teardown: ssh then runs without a master. A directory the
    operator configured is refused instead (exit 3)."""
    try:
        path = control_path(dest, opts)
    except statedir.StateDirError:
        if os.environ.get(CONTROL_DIR_ENV):
            raise
        return ["-o", "ControlMaster=no", "-o", "ControlPath=none"]
    return ["-o", "ControlMaster=auto", "-o", f"ControlPath={path}", "-o", f"ControlPersist={CONTROL_PERSIST_S}"]


@dataclass(frozen=True)
class SshHop:
    """ssh to a destination. Host key checking stays on; BatchMode so it never prompts."""

    dest: str
    opts: tuple = ()

    def machine_opts(self) -> list:
        # User options come first: ssh keeps the first value it sees for an option, so a
        # host's GPU1_SSH_OPTS can override ours (e.g. ControlMaster=no).
        return [
            *self.opts,
            "-o", "BatchMode=yes",
            "-o", f"ConnectTimeout={CONNECT_TIMEOUT_S}",
            "-o", f"ServerAliveInterval={ALIVE_INTERVAL_S}",
            "-o", f"ServerAliveCountMax={ALIVE_COUNT}",
            *control_opts(self.dest, self.opts),
        ]

    def wrap(self, argv: list, for_paste: bool, ssh_log: str | None = None) -> list:
        opts = list(self.opts) if for_paste else self.machine_opts()
        # -E: ssh's own messages (refused, timed out, keep-alive lost) to a file of ours, so
        # a remote command cannot fake them on its stderr (ssh_failed reads only the file).
        log = ["-E", ssh_log] if ssh_log and not for_paste else []
        return ["ssh", *log, *opts, self.dest, shlex.join(argv)]

    def describe(self) -> str:
        return "ssh " + " ".join([*map(shlex.quote, self.opts), self.dest]).strip()


@dataclass(frozen=True)
class PctHop:
    """`pct exec CTID -- argv`: Proxmox execs argv inside the container, unquoted."""

    ctid: str

    def wrap(self, argv: list, for_paste: bool, ssh_log: str | None = None) -> list:
        return ["pct", "exec", self.ctid, "--", *argv]

    def describe(self) -> str:
        return f"pct exec {self.ctid}"


@dataclass(frozen=True)
class SudoHop:
    """`sudo -n -- argv`: the rest of the route runs as root (hosts.env `ALIAS_BECOME=sudo`).

    Why -n: sudo that wants a password (or a terminal, `requiretty`) fails at once, exit 1,
    instead of waiting for an answer nobody can type; become_failure names it. argv passes
    through unquoted (sudo execs it); `--` ends sudo's own options, so a command starting
    with `-` is a command."""

    def wrap(self, argv: list, for_paste: bool, ssh_log: str | None = None) -> list:
        return ["sudo", "-n", "--", *argv]

    def describe(self) -> str:
        return "sudo -n"


@dataclass(frozen=True)
class Route:
    """An ordered list of hops, outermost first. No hops = this machine."""

    hops: tuple = ()

    def wrap(self, argv: list, for_paste: bool = False, ssh_log: str | None = None) -> list:
        """argv behind every hop; `ssh_log`: where the ssh hop writes its own messages (-E)."""
        if not argv:
            raise ValueError("empty command")
        out = list(argv)
        for hop in reversed(self.hops):
            out = hop.wrap(out, for_paste, ssh_log)
        return out

    def one_liner(self, argv: list) -> str:
        """The line to paste into a POSIX shell on the operator's machine."""
        return shlex.join(self.wrap(argv, for_paste=True))

    @property
    def ssh(self) -> SshHop | None:
        return next((h for h in self.hops if isinstance(h, SshHop)), None)

    @property
    def become(self) -> SudoHop | None:
        return next((h for h in self.hops if isinstance(h, SudoHop)), None)

    def describe(self) -> str:
        return " -> ".join(h.describe() for h in self.hops) or "this machine"

    def marked(self, argv: list, nonce: str) -> list:
        """`argv` behind a line on stderr that proves the far side ran (ran_line(nonce)), then exec.

        Why: ssh exits 255 both when it fails and when the remote command exits 255, and
        asking the ControlMaster socket (`ssh -O check`) cannot tell them apart when there is
        no socket (ControlPath=none: the check itself exits 255). A line printed by `sh` on
        the host before it execs the command can only come from the far side. The process
        that runs is still exactly argv (exec); on this machine (no ssh) nothing is added.
        Behind a sudo hop the line comes from root's side of sudo, so it also proves sudo ran
        the command (become_failure)."""
        if self.ssh is None:
            return list(argv)
        return ["sh", "-c", 'printf "%s\\n" "$1" >&2; shift; exec "$@"', "gpu-pivot", ran_line(nonce), *argv]

    def ssh_failed(self, returncode: int, ran: bool, stderr: str = "") -> bool:
        """Was this exit ssh's own failure, not the remote command's?

        255 with no proof that the far side ran (`ran`: the marked() line was seen): ssh's.
        255 after that line: the remote command's own exit 255, unless ssh said its
        keep-alive went unanswered (the connection died mid-call: ssh's, a time-out)."""
        if returncode != SSH_UNREACHABLE or self.ssh is None:
            return False
        return not ran or keepalive_lost(stderr)


SSH_LOG_MAX_BYTES = 256 * 1024


@dataclass
class SshLog:
    """ssh's own messages for one call (`ssh -E path`): the text written after `offset`."""

    path: str
    offset: int = 0
    temporary: bool = False

    def read(self) -> str:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""


@contextlib.contextmanager
def ssh_log(route: Route):
    """Where ssh writes its own messages (-E) during one call; None with no ssh hop.

    One file per destination in the private ControlMaster directory, appended to and read
    from where this call began: the master connection (ControlPersist) was started by an
    earlier call and keeps writing to that call's -E file, and it is the master that says
    "Timeout, server ... not responding" when keep-alives go unanswered (a file per call,
    deleted after it, lost that line). Without a usable private
    directory, a fresh mkstemp file (ssh then runs without a master)."""
    hop = route.ssh
    if hop is None:
        yield None
        return
    try:
        directory = control_dir()
    except statedir.StateDirError:
        fd, path = tempfile.mkstemp(prefix="gpu-pivot-ssh-", suffix=".log")
        os.close(fd)
        try:
            yield SshLog(path, 0, temporary=True)
        finally:
            os.unlink(path)
        return
    name = _digest("\0".join([hop.dest, *hop.opts]), 16) + ".log"
    path = str(directory / name)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        size = os.fstat(fd).st_size
        if size > SSH_LOG_MAX_BYTES:
            os.ftruncate(fd, 0)  # a master appending (O_APPEND) goes on at the new end
            size = 0
    finally:
        os.close(fd)
    yield SshLog(path, size)


def read_ssh_log(log: SshLog | None) -> str:
    """What ssh itself said during the call ("" with no ssh hop or an unreadable file)."""
    return log.read() if log is not None else ""


def ran_line(nonce: str) -> str:
    return f"{RAN_PREFIX} {nonce}====="


def ssh_timed_out(stderr: str) -> bool:
    """Did ssh give up waiting (connect, banner exchange, keep-alive), rather than being refused?"""
    return any(word in stderr for word in _SSH_TIMEOUT_WORDS)


def keepalive_lost(stderr: str) -> bool:
    """ssh's own line when ServerAliveCountMax keep-alives went unanswered."""
    return any(line.startswith("Timeout, server ") and "not responding" in line for line in stderr.splitlines())


def unreachable(alias: str, stderr: str, ran: bool = False, hop: SshHop | None = None) -> HostUnreachable:
    """The error for ssh's own exit 255: HostTimedOut when ssh said it waited in vain,
    HostKeyFailed when it refused the host's key (`hop`: the ssh hop, for its known_hosts)."""
    if "Host key verification failed" in stderr:
        return host_key_failed(alias, stderr, hop)
    tail = " | ".join(line for line in stderr.strip().splitlines() if line.strip() and RAN_PREFIX not in line)[-300:]
    if ssh_timed_out(stderr):
        where = "; the command had started there and may still finish (see `invoke status`)" if ran else ""
        return HostTimedOut(f"{alias}: host timed out (ssh: {tail or 'no answer'}){where}")
    return HostUnreachable(f"{alias}: host unreachable (ssh exit 255: {tail or 'nothing on stderr'})")


def route_failure(route: Route, alias: str, code: int, ran: bool, ssh_said: str, stderr: str,
                  what: str = "the agent"):
    """The error for a call that never reached its command: ssh's own failure (Route.ssh_failed),
    decided from ssh's -E log alone (a remote command cannot fake it) and shown with that log, or
    the call's stderr when the log is empty; else sudo's refusal (become_failure); else None.
    One place for every call over a route (agent calls, `run`, `logs --follow`); `what` names
    the command in sudo's line."""
    if route.ssh_failed(code, ran, ssh_said):
        return unreachable(alias, ssh_said or stderr, ran, route.ssh)
    return become_failure(route, alias, code, ran, stderr, what)


SUDO_REFUSED = 1  # sudo's own exit code for every refusal; otherwise it exits with its command's code


def become_failure(route: Route, alias: str, code: int, ran: bool, stderr: str, what: str = "the agent"):
    """SudoRefused when the route's sudo hop refused to run the command, else None.

    Decided by the exit code and the proof line (Route.marked), never by sudo's words, which are
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


def known_hosts_files(opts: tuple | list) -> list:
    """The UserKnownHostsFile values among a host's ssh options (`-o K=V`, `-oK V`), in order."""
    import re

    out, i = [], 0
    while i < len(opts):
        tok = opts[i]
        i += 1
        arg = tok[2:] if tok.startswith("-o") and len(tok) > 2 else (opts[i] if tok == "-o" and i < len(opts) else "")
        i += tok == "-o"
        m = re.match(r"\s*[\"']?userknownhostsfile[\"']?\s*(?:=\s*|\s+)(.*)", arg, re.IGNORECASE)
        if m:
            out += [w.strip("\"'") for w in m.group(1).split()]
    return out


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


class SudoRefused(HostUnreachable):
    """sudo on the host would not run the command without a password or a terminal, or has no
    rule for it (become_failure): nothing ran there; exit 3 like an unreachable host."""


class HostTimedOut(HostUnreachable):
    """No answer in time: ssh's connect or keep-alive timeout, or the call's deadline.
    Its own exit code (codes.EXIT_TIMED_OUT); a HostUnreachable for code that only
    needs to know the host gave no result."""


def _digest(text: str, chars: int) -> str:
    """A short hex name for `text` (a file name that fits where the text would not). hashlib is
    imported here: only ssh routes need it, and a teardown of this machine should not pay for it."""
    import hashlib

    return hashlib.sha1(text.encode()).hexdigest()[:chars]
