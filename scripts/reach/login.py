"""The words for a login the host refused: ssh reached it, and it would not let the user in.

Why its own words: ssh exits 255 for a refused key as for a host that never answered, and
"host unreachable" sent operators to check cables and firewalls of a host that was up and
answering; what was wrong was the user or the key. The line names the user and the key ssh
tried, the hosts.env keys that set them (ALIAS_SSH=USER@HOST, ALIAS_SSH_OPTS='-i KEY') and the
`ssh-copy-id` that authorizes the key there. Read from ssh's own -E log (route.route_failure),
which a remote command cannot write to; its words are OpenSSH's, untranslated.
"""
from __future__ import annotations

import re
import shlex

from ..config.route import SshHop
from ..config.sshopts import option_keyword, options

# OpenSSH's own lines: "USER@HOST: Permission denied (publickey,password)." when every method
# it may try (BatchMode: keys only) was refused, and the server's disconnect when an agent
# offered more keys than its MaxAuthTries.
_DENIED = re.compile(r"^(?:(?P<who>\S+): )?Permission denied \((?P<methods>[^)]*)\)\.?\s*$", re.M)
_TOO_MANY = re.compile(r"^.*Too many authentication failures.*$", re.M)
DEFAULT_KEYS = "ssh's default keys (~/.ssh/id_*, or the IdentityFile ~/.ssh/config sets for it)"


def refused(alias: str, stderr: str, hop: SshHop | None) -> str | None:
    """The one line for ssh's refused login in `stderr` (its -E log), else None."""
    denied = _DENIED.search(stderr)
    said = denied.group(0).strip() if denied else None
    if said is None:
        too_many = _TOO_MANY.search(stderr)
        said = too_many.group(0).strip() if too_many else None
    if said is None:
        return None
    dest = hop.dest if hop else alias
    who = denied.group("who") if denied and denied.group("who") else None
    user, _, host = (who or dest).rpartition("@")
    user = user or _option(hop, "l", "user") or "your local user name"
    keys = _options(hop, "i", "identityfile")
    key_words = f"key {' and '.join(keys)}" if keys else DEFAULT_KEYS
    port = _option(hop, "p", "port")
    copy = ["ssh-copy-id", *(["-i", keys[0]] if keys else []), *(["-p", port] if port else []), dest]
    up = alias.upper()
    return (f"{alias}: login refused: {host or dest} answered, and refused the login of {user} with {key_words} "
            f"(ssh: {said}); nothing ran there. The user is set by {up}_SSH=USER@HOST, the key by "
            f"{up}_SSH_OPTS='-i KEY'; to authorize this key for {user} there: {shlex.join(copy)}")


def _options(hop: SshHop | None, letter: str, keyword: str) -> list:
    """The values of ssh option -LETTER or `-o KEYWORD=VALUE` among the hop's options, in order."""
    out = []
    for c, arg in options(hop.opts if hop else ()):
        if c == letter and arg:
            out.append(arg)
        elif c == "o" and arg and option_keyword(arg) == keyword:
            out.append(re.sub(r"^\s*[^\s=]*\s*=?\s*", "", arg).strip().strip("\"'"))
    return out


def _option(hop: SshHop | None, letter: str, keyword: str) -> str | None:
    """The value ssh uses: the first one given (ssh keeps the first value it reads)."""
    values = _options(hop, letter, keyword)
    return values[0] if values else None
