"""Where a host is: the hops from this machine to the agent's process, as data.

Why data here and the command lines in scripts/reach/: hosts.env says where a host is (ssh to a
destination with its options, sudo there, `pct exec` into a container), and that is checked and
built with the rest of a host's configuration (hostconfig.py). How an argv crosses these hops
(the ssh command line with gpu-pivot's own options and sockets, the quoting for each layer)
is reach/route.py's and reach/ssh.py's: the configuration never builds a command.
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass


@dataclass(frozen=True)
class SshHop:
    """ssh to a destination, with the host's own ssh options (ALIAS_SSH_OPTS, checked by sshopts.py)."""

    dest: str
    opts: tuple = ()

    def describe(self) -> str:
        return "ssh " + " ".join([*map(shlex.quote, self.opts), self.dest]).strip()


@dataclass(frozen=True)
class PctHop:
    """`pct exec CTID`: into a Proxmox container on the node the route has reached."""

    ctid: str

    def describe(self) -> str:
        return f"pct exec {self.ctid}"


@dataclass(frozen=True)
class SudoHop:
    """Root through sudo on the ssh host (hosts.env `ALIAS_BECOME=sudo`), before any `pct exec`."""

    def describe(self) -> str:
        return "sudo -n"


Hop = SshHop | SudoHop | PctHop


@dataclass(frozen=True)
class Route:
    """An ordered list of hops, outermost first. No hops = this machine."""

    hops: tuple = ()

    @property
    def ssh(self) -> SshHop | None:
        return next((h for h in self.hops if isinstance(h, SshHop)), None)

    @property
    def become(self) -> SudoHop | None:
        return next((h for h in self.hops if isinstance(h, SudoHop)), None)

    def describe(self) -> str:
        return " -> ".join(h.describe() for h in self.hops) or "this machine"
