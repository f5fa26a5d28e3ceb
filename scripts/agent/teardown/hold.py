"""Release the host lock a pivot kept from its teardown until its next phase is ready.

Why a holder process: a pivot is several agent calls (teardown, gates, start, ready) and an
flock ends with the call that took it. A teardown asked to (--hold-s) starts a detached holder
that inherits the locked open file, so the flock stays, and the kernel still drops it when the
holder dies, even by SIGKILL. The holder is a few lines of the standard library run with -S:
it opens no file and trusts no path; it waits for SIGTERM or its deadline (the pivot's ready
timeout and a margin: a pivot whose laptop died does not hold the host for good).
`release --token T` ends the holder whose lock text carries T, checked by pid, start time,
uid and argv, and waits until the flock is free. A teardown meanwhile gets exit 4 and the text.
"""
import os
import signal
import sys
import time

from ..options.record import Options
from ..procs import procfs, procscan
from ..wire import codes, records
from . import hostlock

HOLDER_NAME = hostlock.HOLDER_MARK
# argv: -c HOLDER_NAME FD SECONDS. Blocks TERM/INT before waiting so neither is lost; on either,
# or at the deadline, empties the lock's text (the flock is still ours) and exits: the flock ends.
HOLDER_SRC = ("import os,signal,sys,time\n"
              "fd=int(sys.argv[2]);end=time.monotonic()+float(sys.argv[3])\n"
              "sigs=[signal.SIGTERM,signal.SIGINT];signal.pthread_sigmask(signal.SIG_BLOCK,sigs)\n"
              "while time.monotonic()<end and not signal.sigtimedwait(sigs,max(0.0,end-time.monotonic())):\n"
              " pass\n"
              "try:\n os.ftruncate(fd,0)\nexcept OSError:\n pass\n")
RELEASE_WAIT_S = 10.0
POLL_S = 0.02


def holder_argv(fd, seconds):
    return [sys.executable or "python3", "-S", "-c", HOLDER_SRC, HOLDER_NAME, str(fd), "%.3f" % seconds]


def is_holder(argv):
    """Is this argv a lock holder's, exactly as holder_argv makes it (the interpreter aside)?"""
    return list(argv[1:5]) == ["-S", "-c", HOLDER_SRC, HOLDER_NAME] and len(argv) == 7


def hand_over(fd, hold_s, phase, token, operator):
    """Start the holder on the locked `fd`, write the lock's text, close our copy: the flock
    stays with the holder. Returns the text (a dict), which the teardown's result carries."""
    import subprocess  # here: after FREED; the path to a teardown's first signal does not load it
    proc = subprocess.Popen(holder_argv(fd, hold_s), pass_fds=(fd,), stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, cwd="/")
    now = time.time()
    text = {"hold": "pivot", "phase": phase, "token": token, "operator": operator,
            "pid": proc.pid, "start_time": procfs.start_time(proc.pid), "user": procscan.user_name(os.geteuid()),
            "host": os.uname().nodename, "since": now, "until": now + hold_s}
    hostlock.write_text(fd, text)
    os.close(fd)
    return {k: v for k, v in text.items() if k != "token"}


def check_hold_flags(hold_s, phase, token):
    """--hold-s, --hold-phase and --hold-token come together; bad values: UsageError."""
    flags = {"hold_s": hold_s, "hold_phase": phase, "hold_token": token}
    given = [f for f, value in flags.items() if value is not None]
    if given and len(given) < 3:
        raise codes.UsageError("--hold-s, --hold-phase and --hold-token go together (given: %s)"
                               % ", ".join("--" + f.replace("_", "-") for f in given))
    if given and not 0 < hold_s <= hostlock.MAX_HOLD_S:
        raise codes.UsageError("--hold-s %r: must be above 0 and at most %d seconds" % (hold_s,
                                                                                    hostlock.MAX_HOLD_S))
    if given:
        check_token(token, "--hold-token")


def check_token(token, flag):
    if not (8 <= len(token) <= 64 and all(c in "0123456789abcdef" for c in token)):
        raise codes.UsageError("%s %r: must be 8 to 64 lowercase hex digits" % (flag, token))


def add_arguments(parser):
    parser.add_argument("--token", required=True, help="the hold's token (the pivot's teardown got --hold-token)")


def _holder_alive(holder):
    """Is the lock text's pid still the holder we started: same start time, our uid, its argv?"""
    pid, start = holder.get("pid"), holder.get("start_time")
    if not isinstance(pid, int) or not isinstance(start, int) or not procfs.same_process(pid, start):
        return False
    info = procscan.basic(pid)
    return bool(info) and is_holder(info["argv"]) and set(procfs.uids(pid) or [-1]) == {os.geteuid()}


def _result(code, more=(), **fields):
    return code, records.written(records.ReleaseResult, more, code=code, **fields)


def run(opts: Options):
    check_token(opts.token, "--token")
    try:
        fd = hostlock.open_lock()
    except OSError as exc:  # StateDirError too: a link, not ours, not private; nothing is signalled
        return _result(codes.EXIT_UNREACHABLE, released=False, error=str(exc))
    try:
        if hostlock.try_flock(fd):  # nobody holds it: the holder ended (deadline, killed) already
            if (hostlock.read_text(fd) or {}).get("token") == opts.token:
                hostlock.write_text(fd, None)
            return _result(codes.EXIT_OK, released=False, held=False,
                           note="the lock was not held: its holder had ended")
        holder = hostlock.read_text(fd) or {}
        if holder.get("token") != opts.token:
            return _result(codes.EXIT_LOCKED, {"holder": holder}, released=False, held=True,
                           error=str(hostlock.Locked(holder)))
        if _holder_alive(holder):
            procfs.signal_if_same(holder["pid"], holder["start_time"], signal.SIGTERM)
        deadline = time.monotonic() + RELEASE_WAIT_S
        while not hostlock.try_flock(fd):
            if time.monotonic() > deadline:
                error = "the lock's holder (pid %s) did not let go within %gs" % (holder.get("pid"), RELEASE_WAIT_S)
                return _result(codes.EXIT_FAILED, released=False, held=True, error=error)
            time.sleep(POLL_S)
        hostlock.write_text(fd, None)
        since = holder.get("since")
        held_s = round(time.time() - since, 2) if isinstance(since, (int, float)) else None
        return _result(codes.EXIT_OK, released=True, held=True, held_s=held_s)
    finally:
        os.close(fd)  # drops the flock we took to see it free
