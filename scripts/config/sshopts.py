"""Which ssh options a hosts.env may carry: none that runs a local command or loads local code.

Why: a hosts.env may come from a shared repository, and gpu-pivot runs ssh with its options
on the operator's machine (often as root). `-o ProxyCommand=...` in a committed file would
run whatever its author wrote, on every `invoke ping`. Options that execute or load
something locally belong in ~/.ssh/config, which only its owner writes.

The whole account: docs/design-notes.md (scripts/config/sshopts.py)."""
from __future__ import annotations

import re

from .errors import ConfigError, show

# ssh(1) getopt string (OpenSSH 9.x): a letter followed by ':' takes an argument.
_OPTSTRING = "1246ab:c:e:fgi:kl:m:no:p:qstvw:xAB:CD:E:F:GI:J:KL:MNO:P:QR:S:TVW:XYy"
_TAKES_ARG = {c for i, c in enumerate(_OPTSTRING) if c != ":" and _OPTSTRING[i + 1:i + 2] == ":"}
_FLAGS = {c for c in _OPTSTRING if c != ":"} - _TAKES_ARG

_RUNS = "runs a local command"
_LOADS = "loads a local library (code run by ssh)"
_READS = "reads other ssh configuration, which can run local commands"
FORBIDDEN_KEYWORDS = {
    "proxycommand": ("ProxyCommand", _RUNS),
    "localcommand": ("LocalCommand", _RUNS),
    "permitlocalcommand": ("PermitLocalCommand", "enables LocalCommand, which runs a local command"),
    "knownhostscommand": ("KnownHostsCommand", _RUNS),
    "xauthlocation": ("XAuthLocation", "names the program ssh runs for X11 forwarding"),
    "pkcs11provider": ("PKCS11Provider", _LOADS),
    "smartcarddevice": ("SmartcardDevice", _LOADS),
    "securitykeyprovider": ("SecurityKeyProvider", _LOADS),
    "match": ("Match", "selects configuration and its `exec` runs a local command"),
    "host": ("Host", _READS),
    "include": ("Include", _READS),
}
FORBIDDEN_FLAGS = {
    "F": ("-F", "reads another ssh config file, which can run local commands"),
    "I": ("-I", _LOADS),
}
_WRITES = "writes or binds a local path (as root: any file)"
FORBIDDEN_KEYWORDS.update({
    "controlpath": ("ControlPath", "names the local socket ssh creates or trusts (gpu-pivot sets its own private "
                                   "one; only ControlPath=none is allowed)"),
    "identityagent": ("IdentityAgent", "names a local socket ssh trusts"),
    "localforward": ("LocalForward", "binds a local port or socket: " + _WRITES),
    "dynamicforward": ("DynamicForward", "binds a local port"),
    "streamlocalbindunlink": ("StreamLocalBindUnlink", "removes a local file before binding: " + _WRITES),
    "remotecommand": ("RemoteCommand", "replaces the command gpu-pivot sends"),
})
FORBIDDEN_FLAGS.update({
    "E": ("-E", "appends ssh's log to a local file: " + _WRITES),
    "S": ("-S", "names the local control socket (gpu-pivot sets its own private one)"),
    "L": ("-L", "binds a local port or socket: " + _WRITES),
    "D": ("-D", "binds a local port"),
    "M": ("-M", "makes this ssh a control master (gpu-pivot manages its own)"),
    "f": ("-f", "sends ssh to the background, away from gpu-pivot's deadline"),
    "N": ("-N", "runs no remote command"),
    # ssh's own messages (to gpu-pivot's -E file) are how a refused or timed-out host is told
    # from a remote command that exits 255; these silence them or clash with -E
    "q": ("-q", "silences ssh's own messages, which tell an unreachable or timed-out host from the command's exit"),
    "y": ("-y", "sends ssh's messages to syslog, where gpu-pivot cannot tell a dead host from the command's exit"),
})
# Allowed only with these values: with them ssh never writes the known-hosts file (so a
# UserKnownHostsFile naming any file stays read-only) and host keys stay checked.
_ONLY_VALUES = {
    "stricthostkeychecking": ({"yes"}, "must be yes: other values let ssh write host keys to a local file and "
                                        "accept unknown hosts"),
    "updatehostkeys": ({"no"}, "must be no: other values let ssh rewrite a local known-hosts file"),
    "loglevel": ({"error", "info", "verbose", "debug", "debug1", "debug2", "debug3"},
                 "QUIET and FATAL silence ssh's own messages, which tell an unreachable or timed-out host from the "
                 "command's exit"),
}


def _value_of(arg: str) -> str:
    rest = re.sub(r"^\s*[^\s=]*\s*=?\s*", "", arg)
    return re.sub(r"[\"']", "", rest).strip().lower()


_TAIL = "hosts.env may come from a shared repo — put it in ~/.ssh/config"


def option_keyword(arg: str) -> str:
    """The keyword of an `-o` argument, as ssh would look it up: 'ProxyCommand=x' -> 'proxycommand'.

    Quotes and backslashes are dropped from the keyword (ssh accepts `"ProxyCommand" x`), so a
    quoted spelling is caught too; that may refuse a spelling ssh itself would reject, never the reverse."""
    match = re.match(r"\s*([^\s=]*)", arg)  # always matches (every part may be empty)
    word = match.group(1) if match else ""
    return re.sub(r"[\"'\\]", "", word).lower()


def _refuse(label: str, value: str, name: str, why: str) -> None:
    raise ConfigError(f"{label}={show(value)}: {name} {why}; {_TAIL}")


def _check_o(label: str, value: str, arg: str) -> None:
    keyword = option_keyword(arg)
    if keyword in _ONLY_VALUES:
        allowed, why = _ONLY_VALUES[keyword]
        if _value_of(arg) not in allowed:
            _refuse(label, value, keyword, why)
        return
    if keyword == "controlpath" and re.fullmatch(r"\s*[^\s=]*\s*=?\s*[\"']?none[\"']?\s*", arg, re.IGNORECASE):
        return  # ControlPath=none: no socket at all (documented)
    hit = FORBIDDEN_KEYWORDS.get(keyword)
    if hit:
        _refuse(label, value, *hit)


def options(opts: tuple | list):
    """Each option in `opts` as ssh's getopt reads its argv: (letter, its argument) for one that
    takes one (None: the value is missing, at the end), (letter, "") for a flag, clustered ones
    (`-vo X`) one by one; ("", word) for a word that is not an option (a destination, `--`)."""
    i = 0
    while i < len(opts):
        tok = opts[i]
        i += 1
        if tok == "--" or not tok.startswith("-") or tok == "-":
            yield "", tok
            continue
        j = 1
        while j < len(tok):
            c = tok[j]
            j += 1
            if c in _TAKES_ARG:
                if j < len(tok):
                    yield c, tok[j:]
                elif i < len(opts):
                    yield c, opts[i]
                    i += 1
                else:
                    yield c, None
                break
            yield c, ""


def check_ssh_opts(label: str, value: str, opts: tuple) -> None:
    """Refuse any option in `opts` (ALIAS_SSH_OPTS split like a shell) that runs or loads local code."""
    for c, arg in options(opts):
        if not c:
            raise ConfigError(f"{label}={show(value)}: {show(arg)} is not an ssh option "
                              "(SSH_OPTS holds options only; the destination is the ALIAS_SSH key)")
        if c in FORBIDDEN_FLAGS:
            _refuse(label, value, *FORBIDDEN_FLAGS[c])
        if c in _TAKES_ARG:
            if arg is None:
                raise ConfigError(f"{label}={show(value)}: ssh option -{c} needs a value")
            if c == "o":
                _check_o(label, value, arg)
        elif c not in _FLAGS:
            raise ConfigError(f"{label}={show(value)}: -{c} is not an ssh option")


def known_hosts_files(opts: tuple | list) -> list:
    """The UserKnownHostsFile values among a host's ssh options (`-o K=V`, `-oK V`), in order:
    the files ssh checked a refused host key against, for the line that says so."""
    out = []
    for c, arg in options(opts):
        if c != "o" or not arg:
            continue
        m = re.match(r"\s*[\"']?userknownhostsfile[\"']?\s*(?:=\s*|\s+)(.*)", arg, re.IGNORECASE)
        if m:
            out += [w.strip("\"'") for w in m.group(1).split()]
    return out
