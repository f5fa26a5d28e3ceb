"""The host lock's holder in words (describe), and what `status` shows while it is held.

Why peek without taking it: a status that took the flock for a moment would make a teardown
starting then exit 4 (and /proc/locks hides a flock whose taker has exited: a pivot's
holder inherited its). So the text, read from the private run dir as the lock is opened
(statedir.open_private: no link followed, ours, a regular file), counts while the process it
names still runs as that holder. The text is advisory: whatever it holds reads as words.
"""
import json
import os
import time

from ..procs import procfs, procscan, textsafe
from ..wire import call
from . import lastrun, statedir

LOCK_NAME = "gpu-pivot.lock"
HOLDER_MARK = "gpu-pivot-lock-holder"  # a pivot's holder's argv[4] (teardown/hold.py)


def is_hold(holder):
    return isinstance(holder, dict) and holder.get("hold") == "pivot"


def describe(holder):
    """Who holds the lock, in words; each field shown escaped (textsafe.printable) and cut.
    A pivot's holder (teardown/hold.py) says it waits for its phase to be ready."""
    if not isinstance(holder, dict) or not holder:
        return "unknown holder"
    if is_hold(holder):
        return "pivot waiting for ready since %s (holder pid %s, %s, %s, target phase %s; held at most until %s)" % (
            _since(holder.get("since")), _field(holder.get("pid")), _field(holder.get("user")),
            _field(holder.get("operator")), _field(holder.get("phase")), _since(holder.get("until")))
    return "%s (agent pid %s on %s) since %s" % (_field(holder.get("operator")), _field(holder.get("pid")),
                                                _field(holder.get("host")), _since(holder.get("since")))


def _field(value, limit=80):
    return textsafe.printable(value)[:limit]


def _since(value):
    """A lock's `since` (epoch seconds) as local time; its text, escaped, when it is not one."""
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(value)))
    except (TypeError, ValueError, OverflowError, OSError):
        return "an unreadable time (%s)" % _field(value, 40)


def peek():
    """The lock's holder in words while the process its text names still runs as that holder,
    else None (also when unreadable)."""
    try:
        path = os.path.join(lastrun.run_dir(), LOCK_NAME)
        if not os.path.lexists(path):
            return None
        fd = statedir.open_private(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        holder = json.loads(os.pread(fd, 4096, 0).decode("utf-8", "replace") or "null")
    except (OSError, ValueError, RecursionError):
        return None
    finally:
        os.close(fd)
    return describe(holder) if isinstance(holder, dict) and _running(holder) else None


def _running(holder):
    """Is the text's pid still its holder: a pivot's holder with the same start time, or a
    teardown agent? (A holder killed by SIGKILL left its text; the flock went with it.)"""
    pid = holder.get("pid")
    info = procscan.basic(pid) if isinstance(pid, int) and pid > 0 else None
    if not info or procfs.finished(info):
        return False
    if is_hold(holder):
        return info["start_time"] == holder.get("start_time") and is_holder(info["argv"])
    return call.agent_call(info["argv"]) == "teardown"


def is_holder(argv):
    """Is this argv a pivot's lock holder's (teardown/hold.py holder_argv)?"""
    return argv[1:3] == ["-S", "-c"] and argv[4:5] == [HOLDER_MARK]
