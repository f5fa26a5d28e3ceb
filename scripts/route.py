"""Route: how an argv reaches a process on a host, through ssh and `pct exec`, exactly.

Why: commands used to be quoted by hand through three shells (`ssh ... 'pct exec 129 -- bash -c
"... awk \\"{print \\\\\\$2}\\" ..."'`). Here a command stays a list of arguments until
the one hop that re-parses a string:

- ssh joins its command words with spaces and the remote login shell re-parses them,
  so the inner argv becomes ONE `shlex.join` string (one quoting for that shell layer);
- `pct exec CTID -- argv` execs argv as given (lxc-attach), so no quoting at all;
- `bash -c SCRIPT` takes SCRIPT as one argument: it is just an element of argv here.

`wrap()` gives an argv to run from Python; `one_liner()` gives the same thing as one
line for a terminal (the terminal's shell is one more layer: one more shlex.join).
"""
from __future__ import annotations

import hashlib
import os
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .agent.contract import statedir

SSH_UNREACHABLE = 255
CONTROL_DIR_ENV = "GPU_PIVOT_CONTROL_DIR"
CONTROL_PERSIST_S = 120


def control_dir(base: str | None = None) -> Path:
    """Where ssh ControlMaster sockets live: private, and short enough for a socket name.

    A unix socket path holds about 104 bytes and ssh appends a 40-character %C hash plus
    a temporary suffix, so a long configured directory is swapped for a short one
    derived from it (same directory every time for the same setting).
    Private and checked (statedir.private_dir: created 0700, or ours, not a link, not
    group/other writable): the default lives in /tmp, where another user could create
    it first and plant a socket that our ssh would take for its master connection.
    A refused directory raises StateDirError, one line naming it.
    """
    configured = base or os.environ.get(CONTROL_DIR_ENV)
    base = configured or _default_base()
    if len(base) > 40:
        base, configured = f"/tmp/gpu-pivot-ssh-{os.getuid()}-{hashlib.sha1(base.encode()).hexdigest()[:10]}", None
    return Path(statedir.private_dir(base, parents=bool(configured), env=CONTROL_DIR_ENV))


def _default_base() -> str:
    """Root: /run/gpu-pivot/ssh, inside a directory no other user can create or enter. Others:
    their private runtime dir when its path is short enough for a socket, else /tmp."""
    if os.geteuid() == 0:
        return os.path.join(statedir.run_dir(), "ssh")
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and len(runtime) < 24 and statedir.is_private(runtime):  # not a dir another user can swap
        return os.path.join(runtime, "gpu-pivot-ssh")
    return f"/tmp/gpu-pivot-ssh-{os.getuid()}"


def control_opts() -> list:
    """ssh options for connection sharing. A default directory that another user squatted
    (possible only for the /tmp fallback) costs the sharing, never the teardown: ssh then
    runs without a master. A directory the operator configured is refused instead (exit 3)."""
    try:
        path = control_dir()
    except statedir.StateDirError:
        if os.environ.get(CONTROL_DIR_ENV):
            raise
        return ["-o", "ControlMaster=no", "-o", "ControlPath=none"]
    return ["-o", "ControlMaster=auto", "-o", f"ControlPath={path}/%C", "-o", f"ControlPersist={CONTROL_PERSIST_S}"]


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
            *control_opts(),
        ]

    def wrap(self, argv: list, for_paste: bool) -> list:
        opts = list(self.opts) if for_paste else self.machine_opts()
        return ["ssh", *opts, self.dest, shlex.join(argv)]

    def describe(self) -> str:
        return "ssh " + " ".join([*map(shlex.quote, self.opts), self.dest]).strip()


@dataclass(frozen=True)
class PctHop:
    """`pct exec CTID -- argv`: Proxmox execs argv inside the container, unquoted."""

    ctid: str

    def wrap(self, argv: list, for_paste: bool) -> list:
        return ["pct", "exec", self.ctid, "--", *argv]

    def describe(self) -> str:
        return f"pct exec {self.ctid}"


@dataclass(frozen=True)
class Route:
    """An ordered list of hops, outermost first. No hops = this machine."""

    hops: tuple = ()

    def wrap(self, argv: list, for_paste: bool = False) -> list:
        if not argv:
            raise ValueError("empty command")
        out = list(argv)
        for hop in reversed(self.hops):
            out = hop.wrap(out, for_paste)
        return out

    def one_liner(self, argv: list) -> str:
        """The line to paste into a POSIX shell on the operator's machine."""
        return shlex.join(self.wrap(argv, for_paste=True))

    @property
    def ssh(self) -> SshHop | None:
        return next((h for h in self.hops if isinstance(h, SshHop)), None)

    def describe(self) -> str:
        return " -> ".join(h.describe() for h in self.hops) or "this machine"

    def ssh_failed(self, returncode: int) -> bool:
        """Was exit 255 ssh's own failure (unreachable, auth), not the remote command's?

        ssh exits 255 both for its own errors and when the remote command exits 255. We
        ask the ControlMaster socket (local, no new connection): if a master is up, ssh
        connected, so the 255 came from the far side.
        """
        if returncode != SSH_UNREACHABLE or self.ssh is None:
            return False
        hop = self.ssh
        check = ["ssh", *hop.machine_opts(), "-O", "check", hop.dest]
        probe = subprocess.run(check, stdin=subprocess.DEVNULL, capture_output=True)
        return probe.returncode != 0


class HostUnreachable(RuntimeError):
    """ssh itself failed (exit 255): the host was not reached, nothing ran there."""
