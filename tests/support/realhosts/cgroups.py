"""The real host's own cgroups: a child of the test process's cgroup in every hierarchy.

Why: systemd, dockerd and LXC write cgroups. Inside a cgroup namespace rooted at a child
of OUR cgroup they write only below it, so the machine's `/docker`, `/lxc`, `system.slice`
are untouched, and `down` can prove nothing is left (no process in any of them) and remove
them. The owner holds an flock on each cgroup it made for as long as it lives, and the name
carries its pid, start time and PID namespace: a crashed run's leftovers (no lock held; and, for
an owner of this PID namespace, no such process) are swept at the next session start, a live
run's (another helper's, another xdist worker's in its own PID namespace) never.
"""
from __future__ import annotations

import fcntl
import os
import signal
import time
from pathlib import Path

PREFIX = "gpu-pivot-realhost-"


def hierarchies() -> list[tuple[str, str, str]]:
    """[(mount dir, fstype, options for a fresh mount), ...] of the machine's cgroup mounts."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields, rest = left.split(), right.split()
            where = fields[4]
            if rest and rest[0] in ("cgroup", "cgroup2") and (where == "/sys/fs/cgroup"  # v2 only
                                                                 or where.startswith("/sys/fs/cgroup/")):
                opts = [o for o in rest[2].split(",") if o not in ("rw", "ro")] if rest[0] == "cgroup" else []
                if rest[0] == "cgroup" and not any(not o.startswith("name=") for o in opts):
                    opts.insert(0, "none")
                out.append((fields[4], rest[0], ",".join(opts)))
    return out


def own_paths() -> dict[str, str]:
    """hierarchy mount dir -> this process's cgroup path in it."""
    by_key = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, ctrl, path = line.rstrip("\n").split(":", 2)
            by_key[ctrl] = path
    controllers = _controllers()
    out = {}
    for mnt, fstype, opts in hierarchies():
        # the hierarchy's controllers and name= as /proc/self/cgroup names it: not the mount's
        # flags (the machine's cpuset is mounted `cpuset,clone_children`; missed, its cgroups
        # went to the hierarchy's root, where LXC's lxc/CTID outlived the test and broke the next)
        key = "" if fstype == "cgroup2" else ",".join(o for o in opts.split(",")
                                                       if o in controllers or o.startswith("name="))
        if key in by_key:
            out[mnt] = by_key[key]
    return out


def _controllers() -> set[str]:
    """The v1 controllers this kernel has (/proc/cgroups)."""
    try:
        with open("/proc/cgroups") as f:
            return {line.split()[0] for line in f if line.strip() and not line.startswith("#")}
    except OSError:
        return set()


def _pid_ns() -> str:
    return str(os.stat("/proc/self/ns/pid").st_ino)


def owner_tag() -> str:
    with open("/proc/self/stat") as f:
        start = f.read().rsplit(")", 1)[1].split()[19]
    return f"{os.getpid()}-{start}-ns{_pid_ns()}"


def _owner(name: str) -> tuple[str, str, str | None]:
    """(pid, start, pid namespace or None for an older name) of a cgroup name's owner tag."""
    parts = name[len(PREFIX):].split("-")
    ns = parts[2][2:] if len(parts) > 2 and parts[2].startswith("ns") and parts[2][2:].isdigit() else None
    return parts[0], parts[1] if len(parts) > 1 else "", ns


def _alive(pid: str, start: str) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19] == start
    except (OSError, IndexError):
        return False


_LOCKS: dict[str, int] = {}  # cgroup dir -> the fd whose flock says its owner (this process) lives
_HELD: dict[str, int] = {}  # a made "crashed" cgroup -> its flock fd: other processes' sweeps skip it, ours takes it


def _lock(d: Path) -> int | None:
    """An fd holding d's flock, or None when another live process holds it."""
    try:
        fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return fd
    except OSError:
        os.close(fd)
        return None


def make(name: str, owner: str | None = None) -> list[Path]:
    """Child cgroups named PREFIX<owner>-<name> under ours, one per hierarchy (owner: this
    process's tag, which it locks). Another owner given (a crashed run's, as tests of the sweep
    make): locked too, so that another test process's sweep (a host booting meanwhile) cannot
    take it, but held apart (_HELD) for this process's own sweep to take."""
    dirs = []
    for mnt, path in own_paths().items():
        d = Path(mnt) / path.lstrip("/") / f"{PREFIX}{owner or owner_tag()}-{name}"
        d.mkdir()
        fd = _lock(d)
        if fd is not None:
            (_LOCKS if owner is None else _HELD)[str(d)] = fd
        for knob in ("cpuset.cpus", "cpuset.mems"):  # v1 cpuset refuses tasks until these are set
            if (d / knob).exists():
                (d / knob).write_text((d.parent / knob).read_text())
        dirs.append(d)
    return dirs


def procs_in(d: Path) -> list[int]:
    """Every pid in d and below it."""
    pids = []
    for root, _, files in os.walk(d):
        if "cgroup.procs" in files:
            try:  # a process this PID namespace cannot see may read as 0: never a pid to signal
                pids += [p for p in map(int, Path(root, "cgroup.procs").read_text().split()) if p > 0]
            except OSError:
                pass
    return pids


def remove(d: Path) -> list[str]:
    """rmdir d and everything below, deepest first; returns what could not be removed."""
    left = []
    for root, dirs, _ in os.walk(d, topdown=False):
        for sub in dirs:
            try:
                os.rmdir(os.path.join(root, sub))
            except OSError as exc:
                left.append(f"{os.path.join(root, sub)}: {exc.strerror}")
    try:
        os.rmdir(d)
    except OSError as exc:
        left.append(f"{d}: {exc.strerror}")
    else:
        fd = _LOCKS.pop(str(d), None)
        if fd is not None:
            os.close(fd)
    return left


def kill_and_remove(dirs: list[Path], timeout: float = 5.0) -> list[str]:
    """SIGKILL every process in these cgroups (they are the real host's own), then remove them."""
    deadline = time.monotonic() + timeout
    while True:
        pids = sorted({p for d in dirs if d.exists() for p in procs_in(d)})
        if not pids or time.monotonic() > deadline:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)
    problems = [f"process {p} still in {d}" for d in dirs if d.exists() for p in procs_in(d)]
    for d in dirs:
        if d.exists():
            problems += remove(d)
    return problems


def stale() -> list[Path]:
    """Cgroups of earlier runs whose owner is gone (a crashed run), up to two levels deep: no
    process holds their lock, and an owner of this PID namespace (or of a name from before the
    lock) is no longer running. The caller holds their locks until it removes them."""
    out = []
    ours = _pid_ns()
    for mnt in own_paths():
        for depth in ("", "*/", "*/*/"):  # another shell's run may sit under its own cgroup
            for d in Path(mnt).glob(depth + PREFIX + "*"):
                if not d.is_dir() or str(d) in _LOCKS:
                    continue
                pid, start, ns = _owner(d.name)
                if (ns is None or ns == ours) and _alive(pid, start):
                    continue
                fd = _HELD.pop(str(d), None) or _lock(d)
                if fd is not None:
                    _LOCKS[str(d)] = fd
                    out.append(d)
    return out
