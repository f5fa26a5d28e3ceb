"""Who the agent runs as on a host, for `invoke ping`: root (and how it became root) or a user.

Why ping says it: an agent that is not root cannot see the device files other users' processes
hold, nor signal them, so a host where it runs as the ssh user answers every call with less
than the truth. An operator setting up `ALIAS_BECOME=sudo` checks here that it took."""
from __future__ import annotations

from scripts.agent.wire import records
from scripts.config.route import SudoHop


def runs_as(p: records.PingResult, become: SudoHop | None) -> str:
    """'root via sudo', 'root' or 'uid N'. Via sudo when the agent saw sudo's SUDO_USER, or the
    route has a sudo hop (`pct exec` after sudo does not pass SUDO_USER into the container)."""
    if p.uid != 0:
        return f"uid {p.uid}"
    return "root via sudo" if p.sudo_user or become is not None else "root"


def ping_suffix(p: records.PingResult, become: SudoHop | None) -> str:
    """What `invoke ping` adds after the host's line: as whom the agent ran, and what not being root costs."""
    who = runs_as(p, become)
    return f"; as {who}" if p.uid == 0 else f"; as {who}, not root: other users' GPU processes are out of its reach"
