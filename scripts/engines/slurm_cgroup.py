"""Which running Slurm job a process belongs to, judged from cgroups only Slurm can make.

Why so strict: the epilog and prolog excuse a holder of the job's GPU that is in ANOTHER
job's cgroup (the same user's next job on a shared GPU). A path component `job_<N>`
proves nothing by itself: systemd delegates `user@UID.service` to its user (cgroup v2, and
name=systemd on v1), so any user can `mkdir .../job_99` there and move a leftover into it.
So only Slurm's own layouts count, anchored at the hierarchy's root:

- cgroup v1 (proctrack/cgroup, task/cgroup): `/slurm[_<node>]/uid_<U>/job_<N>/...` in a
  controller hierarchy (never a named one such as name=systemd), and the process's uids
  must all be U: a process of another user in a job's cgroup is not that job's.
- cgroup v2: `/system.slice/[<node>_]slurmstepd.scope/job_<N>/...` in the unified tree.

The whole account: docs/design-notes.md (scripts/engines/slurm_cgroup.py)."""
from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable, Mapping
from pathlib import Path

from ..agent.procs import procfs

V1_JOB = re.compile(r"/slurm(?:_[^/]+)?/uid_([0-9]+)/job_([0-9]+)(?=/|$)")
V2_JOB = re.compile(r"/system\.slice/(?:[^/]+_)?slurmstepd\.scope/job_([0-9]+)(?=/|$)")
ANY_JOB = re.compile(r"/job_[0-9]+(?:/|$)")  # what merely looks like a job's cgroup
MOUNTINFO = "/proc/self/mountinfo"
UNIFIED = "cgroup2"


def mounts(mountinfo: str = MOUNTINFO) -> dict:
    """{hierarchy key: mount point} of the cgroup hierarchies mounted at their root: the
    key is a v1 controller (or `name=...`) or UNIFIED for cgroup2. The mount table is the
    kernel's, so no user can point a key elsewhere."""
    out: dict = {}
    try:
        lines = Path(mountinfo).read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 3 or fields[3] != "/":
            continue
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
        if tail[0] == "cgroup2":
            out.setdefault(UNIFIED, point)
        elif tail[0] == "cgroup":
            for option in tail[2].split(","):
                out.setdefault(option, point)
    return out


def root_only(path: str) -> bool:
    """Is `path` a directory (not a link) of root's that no one else may write to?"""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == 0 and not st.st_mode & 0o022


def _claim(line: str, hierarchies: Mapping, uids, trusted: Callable[[str], bool]):
    """(job id or None when the line names no job, ok): one /proc/PID/cgroup line."""
    number, _, rest = line.partition(":")
    controllers, _, path = rest.partition(":")
    if not ANY_JOB.search(path):
        return None, True
    if number == "0" and not controllers:
        m, key, uid = V2_JOB.match(path), UNIFIED, None
        job = m.group(1) if m else None
    else:
        names = [c for c in controllers.split(",") if c]
        m = V1_JOB.match(path)
        if not m or not names or any(c.startswith("name=") for c in names):
            return None, False
        key, uid, job = names[0], int(m.group(1)), m.group(2)
    if not m or key not in hierarchies:
        return None, False
    if uid is not None and (not uids or any(u != uid for u in uids)):
        return None, False  # another user's process in this job's cgroup: not the job's
    parts = m.group(0).strip("/").split("/")
    base = hierarchies[key]
    dirs = [os.path.join(base, *parts[:i]) for i in range(1, len(parts) + 1)]
    return job, all(trusted(d) for d in dirs)


def job_in(text: str, uids, hierarchies: Mapping, trusted: Callable[[str], bool] = root_only) -> str | None:
    """The one Slurm job a process's /proc/PID/cgroup `text` names, or None: when no line
    names a job, when a line names one outside Slurm's layouts (or in a directory a user
    could have made), or when two lines name different jobs."""
    jobs = set()
    for line in text.splitlines():
        job, ok = _claim(line, hierarchies, uids, trusted)
        if not ok:
            return None
        if job is not None:
            jobs.add(job)
    return jobs.pop() if len(jobs) == 1 else None


def job_of(pid, start_time=None) -> str | None:
    """The running Slurm job the process is in (see job_in), or None; None too when it is
    gone or the pid now names another process (its start time differs)."""
    try:
        pid = int(pid)
        text = Path(f"/proc/{pid}/cgroup").read_text()
    except (OSError, TypeError, ValueError):
        return None
    uids = procfs.uids(pid)
    if start_time is not None and procfs.start_time(pid) != start_time:
        return None
    return job_in(text, uids, mounts())
