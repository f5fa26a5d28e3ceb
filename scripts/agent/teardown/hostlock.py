"""One teardown per host at a time, whoever runs it: an flock, plus a look at other users.

Why flock: the kernel drops it when the holder dies (even by SIGKILL), so a crashed
teardown never leaves a stale lock; the file's text only says who to ask.

Why the lock lives in statedir.run_dir(): root's is /run/gpu-pivot/gpu-pivot.lock, in a
directory only root can create or enter, so no other user can create, replace or hold
it (a lock in a world-writable directory such as /run/lock can be created and flock-ed first
by anyone, and a symlink there would make root truncate the file it points to). The file is opened O_NOFOLLOW,
created 0600, never truncated on open, checked to be a regular file we own; who holds
it is written only once the flock is held.

The whole account: docs/design-notes.md (scripts/agent/teardown/hostlock.py)."""
import errno
import fcntl
import json
import os
import socket
import time

from ..procs import procfs, procscan
from ..state import lockpeek, statedir
from ..wire import call

LOCK_NAME = lockpeek.LOCK_NAME
POLL_S = 0.05
MAX_HOLD_S = 2 * 3600  # a pivot's hold (hold.py) ends by itself after at most this
HOLDER_MARK = lockpeek.HOLDER_MARK


class Locked(RuntimeError):
    def __init__(self, holder):
        self.holder = holder
        by = "a pivot" if lockpeek.is_hold(holder) else "another teardown"
        super().__init__("host is locked by %s: %s" % (by, describe(holder)))


describe = lockpeek.describe  # who holds it, in words: `status` says it the same way


def lock_path():
    return os.path.join(statedir.run_dir(), LOCK_NAME)


# -- other users' teardown agents ---------------------------------------------------


def is_teardown_agent(argv):
    """Does this argv have the shape the local side gives a teardown agent
    (`python3 - teardown ... --marker HEX`, call.agent_call)?"""
    return call.agent_call(argv) == "teardown"


def _euid(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("Uid:"):
                    return int(line.split()[2])
    except (OSError, ValueError, IndexError):
        pass
    return None


def teardown_agents(procs=None):
    """Every running gpu-pivot teardown agent this process can see, but itself:
    [{pid, uid, user, cmdline, start_time}]. Processes hidden by /proc's hidepid are not seen.
    `procs`: a scan's table to look in instead of reading /proc again (a teardown has one: on
    a host of 20,000 processes a fresh read is half a second in the way of its wait)."""
    me = os.getpid()
    out = []
    for pid in (procscan.all_pids() if procs is None else sorted(procs)):
        if pid == me:
            continue
        info = procscan.basic(pid) if procs is None else procs[pid]
        if not info or not is_teardown_agent(info["argv"]) or procfs.finished(info):
            continue
        uid = _euid(pid)
        if uid is None:
            continue
        out.append({"pid": pid, "uid": uid, "user": procscan.user_name(uid), "cmdline": info["cmdline"],
                    "start_time": info["start_time"]})
    return out


def concurrent_teardowns(procs=None):
    """Teardown agents of other users running now, as [{pid, user, cmdline}]: root's teardown
    puts this in its result so a teardown beside it is noticed. `procs`: as teardown_agents."""
    euid = os.geteuid()
    return [{"pid": a["pid"], "user": a["user"], "cmdline": a["cmdline"]}
            for a in teardown_agents(procs) if a["uid"] != euid]


def _root_holder():
    """root's running teardown agent, or root's pivot lock holder (hold.py), as a lock holder,
    or None (always None for root). One pass over /proc for both."""
    if os.geteuid() == 0:
        return None
    for pid in procscan.all_pids():
        info = procscan.basic(pid)
        if not info or procfs.finished(info):
            continue
        argv = info["argv"]
        held = lockpeek.is_holder(argv)
        if (held or is_teardown_agent(argv)) and _euid(pid) == 0:
            return {"operator": "root's pivot, waiting for its phase to be ready" if held else "root's teardown",
                    "pid": pid, "host": socket.gethostname(), "since": _started_at(info),
                    "cmdline": HOLDER_MARK if held else info["cmdline"]}
    return None


def _started_at(info):
    return time.time() - procscan.uptime_s() + info["start_time"] / float(procscan.clock_ticks())


# -- the lock -----------------------------------------------------------------------


def _try_flock(fd):
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError as exc:
        if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise
        return False


try_flock = _try_flock


def open_lock(path=None):
    """The lock file, opened (not locked). Raises StateDirError when the directory or the file
    is refused (a symlink, not ours, not a regular file)."""
    return statedir.open_private(path or lock_path(), os.O_RDWR | os.O_CREAT)


def acquire(operator, wait_s=0.0, path=None):
    """Take the lock or raise Locked. Returns the open fd (keep it open while working).

    Raises StateDirError when the directory or the lock file is refused (a symlink,
    not ours, not a regular file).
    """
    fd = open_lock(path)
    try:
        deadline = time.monotonic() + wait_s
        while True:
            holder = None
            if _try_flock(fd):
                holder = _root_holder()
                if holder is None:
                    break
                fcntl.flock(fd, fcntl.LOCK_UN)
            else:
                holder = _read(fd)
            if time.monotonic() >= deadline:
                raise Locked(holder)
            time.sleep(POLL_S)
        write_text(fd, {"operator": operator, "pid": os.getpid(), "host": socket.gethostname(), "since": time.time()})
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_text(fd, holder):
    """Replace the lock's text (only while holding the flock); None empties it."""
    os.ftruncate(fd, 0)
    if holder is not None:
        os.pwrite(fd, json.dumps(holder).encode(), 0)


def _read(fd):
    """Who holds the lock as the file says: a dict, or None for text that is not one."""
    try:
        holder = json.loads(os.pread(fd, 4096, 0).decode("utf-8", "replace") or "null")
    except (ValueError, RecursionError, OSError):
        return None
    return holder if isinstance(holder, dict) else None


read_text = _read


def release(fd):
    try:
        os.ftruncate(fd, 0)
    except OSError:
        pass  # a full or read-only disk must not keep the lock: closing drops it
    finally:
        os.close(fd)  # closing drops the flock
