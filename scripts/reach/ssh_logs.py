"""Pruning ssh's own logs (`ssh -E`, one per destination and options: ssh.ssh_log) so they do
not pile up in the private ControlMaster directory (/run/gpu-pivot/ssh for root).

Why by age, not a count: a log belongs to one destination and is kept across calls, because
the master connection an earlier call started goes on writing to it (its keep-alive time-out
line is what tells a timed-out host from an unreachable one). A fleet of 500 hosts has 500
live logs, so "keep the last N" would delete live ones once the fleet grew past N. A log is
touched at every call that uses it, so one untouched for LOG_KEEP_DAYS belongs to an alias,
an option set or a host no longer used; a master outlives its last call by ControlPersist
(ssh.CONTROL_PERSIST_S, minutes), never by days. The pile only grows when a log is created,
so that is when it is pruned: a call to a known host pays nothing.

The whole account: docs/design-notes.md (scripts/reach/ssh_logs.py)."""
from __future__ import annotations

import os
import re
import stat
import time

LOG_KEEP_DAYS = 7
_LOG_NAME = re.compile(r"[0-9a-f]{16}\.log")


def prune(directory: str, keep_days: float = LOG_KEEP_DAYS, now: float | None = None) -> list:
    """Remove our own logs in `directory` untouched for `keep_days`; the names removed. Never
    raises for a file it could not read or remove: pruning must not cost a call."""
    cutoff = (time.time() if now is None else now) - keep_days * 86400
    removed: list = []
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return removed
    try:
        here = os.fstat(fd)
        if here.st_uid != os.geteuid() or here.st_mode & 0o022:  # not our private directory: touch nothing
            return removed
        for name in os.listdir(fd):
            if not _LOG_NAME.fullmatch(name):
                continue
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and st.st_mtime < cutoff:
                    os.unlink(name, dir_fd=fd)
                    removed.append(name)
            except OSError:
                continue
    finally:
        os.close(fd)
    return removed
