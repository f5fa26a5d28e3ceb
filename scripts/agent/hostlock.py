"""One teardown per host at a time: an flock, with who holds it and since when.

Why flock: the kernel drops it when the holder dies (even by SIGKILL), so a crashed
teardown never leaves a stale lock; the file's text only says who to ask.
"""
import errno
import fcntl
import json
import os
import socket
import time

from . import lastrun


class Locked(RuntimeError):
    def __init__(self, holder):
        self.holder = holder
        super().__init__("host is locked by another teardown: %s" % describe(holder))


def describe(holder):
    if not holder:
        return "unknown holder"
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder.get("since", 0)))
    return "%s (agent pid %s on %s) since %s" % (holder.get("operator"), holder.get("pid"), holder.get("host"), since)


def lock_path():
    # The design's /run/lock/gpu-pivot.lock when root; the agent's state dir otherwise.
    if os.geteuid() == 0 and os.path.isdir("/run/lock") and not os.environ.get(lastrun.RUN_DIR_ENV):
        return "/run/lock/gpu-pivot.lock"
    return os.path.join(lastrun.run_dir(), "gpu-pivot.lock")


def acquire(operator, wait_s=0.0, path=None):
    """Take the lock or raise Locked. Returns the open fd (keep it open while working)."""
    path = path or lock_path()
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
            if time.monotonic() >= deadline:
                holder = _read(fd)
                os.close(fd)
                raise Locked(holder)
            time.sleep(0.05)
    me = {"operator": operator, "pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(me).encode(), 0)
    return fd


def _read(fd):
    try:
        return json.loads(os.pread(fd, 4096, 0).decode() or "null")
    except ValueError:
        return None


def release(fd):
    try:
        os.ftruncate(fd, 0)
    finally:
        os.close(fd)  # closing drops the flock
