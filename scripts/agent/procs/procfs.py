"""/proc readers and identity-safe signalling.

Why pid + start time: a pid is reused after its process dies, and a teardown that waits
seconds between scan and kill could otherwise hit a stranger. A process is identified by
(pid, start time in clock ticks since boot from /proc/PID/stat field 22). Signals go
through a pidfd where the kernel and Python have one (the fd pins the process, so the
check and the signal cannot race); elsewhere the start time is checked just before kill.
"""
import os
import signal
import time

from . import textsafe

PROC = "/proc"
# The pids this agent forked for its own work (the scan's workers, procs/fanout.py): they run
# the agent's program, so a pattern naming it names them; never a target while this agent is
# their parent (rules.protect_reason).
OWN_WORKERS: set = set()
# The CUDA probe's child while it runs (gpu/probe.py): its short-lived context is the agent's
# own, never a holder or a compute process of a scan made meanwhile (holders/scan.py).
OWN_PROBES: set = set()
READ_CHUNK = 1 << 16


def read_record(path):
    """A /proc file that is one record (stat, cmdline), in one read: the kernel hands such a
    file over whole, so a read shorter than asked for is its end (only a longer one is read
    on). A scan reads two of these per process; the read that would only see EOF is ~20% of
    that cost. Errors as read_bytes."""
    return read_bytes(path, record=True)


def read_bytes(path, record=False):
    """The whole file, read with os.read until EOF (a /proc file may come in several pieces;
    `record`: see read_record). Why not open().read(): a scan reads three or more small /proc
    files per process, before the first signal and again to confirm FREED, and the buffered
    file object costs ~3 us of each ~5 us read (~15% of a scan: bench/scan_reads.py). Errors
    are open()'s: FileNotFoundError, PermissionError, ProcessLookupError (the process went
    away mid-read)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks: list = []
        while True:
            chunk = os.read(fd, READ_CHUNK)
            if not chunk or (record and not chunks and len(chunk) < READ_CHUNK):
                return chunk if chunk else b"".join(chunks)
            chunks.append(chunk)
    finally:
        os.close(fd)


def read_stat(pid, proc=PROC):
    """Parsed /proc/PID/stat, or None when the process is gone. comm may hold ') ' itself,
    so the fields are taken after the LAST ')'."""
    try:
        raw = textsafe.decode(read_record("%s/%d/stat" % (proc, pid)))  # comm is any 15 bytes its process chose
    except (FileNotFoundError, ProcessLookupError):
        return None
    lpar, rpar = raw.index("("), raw.rindex(")")
    rest = raw[rpar + 2:].split()
    return {
        "pid": pid,
        "comm": raw[lpar + 1:rpar],
        "state": rest[0],
        "ppid": int(rest[1]),
        "pgid": int(rest[2]),
        "sid": int(rest[3]),
        "tty_nr": int(rest[4]),  # the controlling terminal (0: none)
        "tpgid": int(rest[5]),   # that terminal's foreground process group
        "flags": int(rest[6]),
        "threads": int(rest[17]),
        "start_time": int(rest[19]),
        # where the argv area begins: an exec moves it (a new stack), a title rewritten in
        # place does not; 0 where /proc hides it (another user's process, not root)
        "arg_start": int(rest[45]) if len(rest) > 45 else 0,
    }


def start_time(pid, proc=PROC):
    stat = read_stat(pid, proc)
    return stat["start_time"] if stat else None


def ticks_now():
    """Now in /proc's start_time unit (clock ticks since boot): a process whose start_time is
    at least this started at or after now."""
    return int(time.clock_gettime_ns(time.CLOCK_BOOTTIME) // (1_000_000_000 // os.sysconf("SC_CLK_TCK")))


def finished(stat):
    """True when the process has exited: a zombie whose threads are all gone. A zombie
    LEADER with live threads is still running (and may hold a GPU)."""
    return stat["state"] in ("Z", "X") and stat["threads"] <= 1


PF_EXITING = 0x4  # a task flag (stat field 9): the thread is in the kernel's exit path


def exiting(pid, start, proc=PROC):
    """True when (pid, start) has exited, or every thread of it is in the kernel's exit path
    (PF_EXITING): it runs none of its own code any more - it cannot fork, respawn, or open a
    GPU again - and what it holds is being released. Why a teardown needs it: such a process
    needs no SIGKILL and no grace period waited out (one stuck in its exit, in a driver or on
    a dead mount, would cost the whole grace and a useless SIGKILL); the GPUs are then the
    settle window's to judge. Not exiting: any thread still running its code (a leader that
    called pthread_exit while the others work on, a server handling SIGTERM itself). Whether
    the GPU is free is never decided here: NVML's read and the /proc holder scan decide it
    (NVML lists a CUDA process among the GPU's compute processes until its exit has ended)."""
    stat = read_stat(pid, proc)
    if stat is None or stat["start_time"] != start or finished(stat):
        return True
    if not stat["flags"] & PF_EXITING:
        return False  # its leader runs: one read, the usual answer while a target lives
    threads = "%s/%d/task" % (proc, pid)
    try:
        tids = sorted(os.listdir(threads))
        for tid in tids:
            task = read_stat(int(tid), threads)
            if task is None or not task["flags"] & PF_EXITING:
                return False  # running, or gone under us: not sure, and the next look decides
        # A thread listed, read as exiting, then gone may have started another first (a relay
        # of short-lived threads): only the same threads twice will do.
        return sorted(os.listdir(threads)) == tids
    except FileNotFoundError:
        return True
    except OSError:
        return False  # cannot tell: it counts as running


def same_process(pid, start, proc=PROC):
    """True while (pid, start) still names a live process (not one that has exited)."""
    stat = read_stat(pid, proc)
    return bool(stat) and stat["start_time"] == start and not finished(stat)


def signal_if_same(pid, start, sig):
    """Send `sig` to pid only if it is still the process that started at `start`.

    Returns 'sent', 'gone' (exited, or a zombie), or 'reused' (the pid now names another
    process: nothing sent). PermissionError propagates: the caller reports it.
    """
    pidfd = None
    if hasattr(os, "pidfd_open") and hasattr(signal, "pidfd_send_signal"):
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            return "gone"
        except OSError:
            pidfd = None  # ENOSYS on old kernels: fall back to the checked kill
    try:
        stat = read_stat(pid)
        if stat is None or finished(stat):
            return "gone"
        if stat["start_time"] != start:
            return "reused"
        if pidfd is not None:
            signal.pidfd_send_signal(pidfd, sig)
        else:
            os.kill(pid, sig)
        return "sent"
    except ProcessLookupError:
        return "gone"
    finally:
        if pidfd is not None:
            os.close(pidfd)


def signal_number(name):
    """The number of a signal named 'USR1' or 'SIGUSR1' (a phase's checkpoint stop); None for
    anything else, and for KILL and STOP, which no job can catch."""
    text = name.upper() if isinstance(name, str) else ""
    sig = getattr(signal, text if text.startswith("SIG") else "SIG" + text, None)
    if not isinstance(sig, signal.Signals) or "_" in text or sig in (signal.SIGKILL, signal.SIGSTOP):
        return None
    return int(sig)


def uids(pid):
    """[real, effective, saved, fs] uid of a process (/proc/PID/status), or None. One reader for every
    "is every uid of it X" rule (protected names, the sandbox's members, Slurm job cgroups)."""
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("Uid:"):
                    return [int(x) for x in line.split()[1:]]
    except (OSError, ValueError):
        pass
    return None
