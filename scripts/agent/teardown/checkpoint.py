"""A stop that lets a training phase checkpoint: its signal, then a wait, then TERM -> KILL.

Why: a job killed mid-step loses everything since its last checkpoint. A phase that declares
a stop (hosts.env STOP_SIGNAL, STOP_CHECKPOINT, STOP_IDLE, STOP_DEADLINE) gets, before the
teardown or its own stop signals anything else, that signal sent to its own processes only
(the ones its start recorded: state/phasestate.py, each by pid + start time), then a wait
of up to the deadline for a checkpoint or for its idle condition. A checkpoint counts when
a file matching the glob is new since the signal, a regular file (lstat: a link is never
followed), owned by a uid of the job, and no process of the job holds any such new file
open for writing (/proc/PID/fdinfo flags). Files are only stat'ed; nothing is opened,
changed or removed. The job exiting ends the wait too. Each outcome is audited with its path
and its seconds.
"""
import glob
import os
import signal
import stat
import subprocess
import time

from ..procs import procfs
from ..state import phasestate
from ..wire import codes, defaults, frame
from . import targets

POLL_S = 0.1  # between looks at the glob and the job's open files
IDLE_EVERY_S = 0.5  # between runs of the idle condition
IDLE_RUN_S = 30.0  # the longest one run of the idle condition may take
REALTIME_COARSE = 5  # CLOCK_REALTIME_COARSE: the clock a file's mtime is read from


def declared(texts):
    """The stops the call declares (--checkpoint-stop's texts), each checked: one line naming a
    bad value (UsageError)."""
    return [_checked(text) for text in texts or []]


def of_spec(spec):
    """The checkpoint stop a phase's spec declares (config/phases.py Phase), checked; None
    without STOP_SIGNAL."""
    if not spec.get("stop_signal"):
        return None
    stop = {"phase": spec.get("name"), "signal": spec["stop_signal"], "to": spec.get("stop_signal_to", "top"),
            "checkpoint": spec.get("stop_checkpoint"),
            "idle": spec.get("stop_idle"), "deadline_s": spec.get("stop_deadline")}
    bad = _bad_field(stop)
    if bad:
        raise codes.UsageError("--spec: %s" % bad)
    return stop


def _checked(text):
    try:
        stop = frame.decode_spec(text)
    except ValueError:
        stop = None
    if not isinstance(stop, dict):
        raise codes.UsageError("--checkpoint-stop %r: not a base64 JSON object" % text[:80])
    bad = _bad_field(stop)
    if bad:
        raise codes.UsageError("--checkpoint-stop: %s" % bad)
    return stop


def _bad_field(stop):
    phase, deadline = stop.get("phase"), stop.get("deadline_s")
    if not isinstance(phase, str) or not phase or "/" in phase or phase in (".", ".."):
        return "phase %r: not a plain name" % (phase,)
    if procfs.signal_number(stop.get("signal")) is None:
        return "signal %r: not a signal a job can catch" % (stop.get("signal"),)
    if stop.get("to", "top") not in ("top", "all"):
        return "to %r: top or all" % (stop.get("to"),)
    if stop.get("checkpoint") is not None and not str(stop["checkpoint"]).startswith("/"):
        return "checkpoint %r: must be an absolute glob" % (stop["checkpoint"],)
    if not (stop.get("checkpoint") or stop.get("idle")):
        return "phase %s: neither a checkpoint glob nor an idle condition to wait for" % phase
    if not isinstance(deadline, (int, float)) or not 0 <= deadline <= defaults.MAX_WAIT_S:
        return "deadline_s %r: seconds from 0 to %d" % (deadline, defaults.MAX_WAIT_S)
    return None


def waits_for(stop):
    """What the stop waits for, in words (the plan's line and the result)."""
    parts = ["a new closed %s" % stop["checkpoint"]] if stop.get("checkpoint") else []
    parts += ["idle (`%s` exits 0)" % stop["idle"]] if stop.get("idle") else []
    return " or ".join(parts)


def _processes(stop, sel=None, approved=None):
    """The running phase's own processes that this call may signal: in scope (the selection's
    --scope, --scope-uid narrow them as every target) and, after a plan was approved (`approved`:
    its (pid, start time) pairs), in it."""
    state = phasestate.load_state(stop["phase"])
    if not state:
        return None
    procs = phasestate.own_processes(state)
    if stop.get("to", "top") == "top":  # what the launch command started: a process whose parent is not the job's
        own = {p["pid"] for p in procs}
        procs = [p for p in procs if (procfs.read_stat(p["pid"]) or {}).get("ppid") not in own]
    scope, scope_uid = (sel.scope, sel.scope_uid) if sel is not None else (None, None)
    return [p for p in procs if (scope is None or scope in p["cmdline"])
            and (scope_uid is None or (procfs.uids(p["pid"]) or [None])[0] == scope_uid)
            and (approved is None or (p["pid"], p["start_time"]) in approved)]


def planned(texts, sel):
    """The plan's rows: each stop declared (--checkpoint-stop's texts) whose phase runs here and
    has processes in the selection's scope, with the pids it signals."""
    out = []
    for stop in declared(texts):
        procs = _processes(stop, sel)
        if procs:
            out.append(dict(stop, pids=[p["pid"] for p in procs], waits_for=waits_for(stop)))
    return out


class Waiter:
    """One phase's stop once its signal went out: look() until a checkpoint, idle, the job's
    exit or the deadline."""

    def __init__(self, stop, procs, audit):
        self.stop, self.procs, self.audit = stop, procs, audit
        self.uids = {(procfs.uids(p["pid"]) or [None])[0] for p in procs} - {None}
        self.before = _snapshot(stop.get("checkpoint"))
        self.since_ns = time.clock_gettime_ns(REALTIME_COARSE) if hasattr(time, "clock_gettime_ns") else 0
        self.sent = [(p, targets.send(p, procfs.signal_number(stop["signal"]))) for p in procs]
        self.t0 = time.monotonic()
        self.next_idle = self.t0
        self.note = None
        self.result = None
        for p, result in self.sent:
            audit.log(p, signal.Signals(procfs.signal_number(stop["signal"])).name, result)

    def look(self):
        """True once the stop is decided (self.result holds its outcome)."""
        waited = time.monotonic() - self.t0
        alive = [p for p in self.procs if procfs.same_process(p["pid"], p["start_time"])]
        idle = False  # asked before the files are looked at: what the job wrote before it went idle is seen
        if self.stop.get("idle") and time.monotonic() >= self.next_idle:
            self.next_idle = time.monotonic() + IDLE_EVERY_S
            idle = _idle(self.stop["idle"], self.stop["deadline_s"] - waited)
        path = self._checkpoint()
        if path:
            return self._done("checkpoint", path, waited)
        if idle:
            return self._done("idle", None, waited)
        if not alive:
            return self._done("job exited", None, waited)
        if waited >= self.stop["deadline_s"]:
            return self._done("deadline", None, waited)
        return False

    def _checkpoint(self):
        """The newest new checkpoint once no new one is open for writing by the job, else None."""
        pattern = self.stop.get("checkpoint")
        if not pattern:
            return None
        new = []
        for path, st in _matches(pattern).items():
            if st.st_uid not in self.uids:
                self.note = "%s is owned by uid %d, not the job's: not counted" % (path, st.st_uid)
            elif st.st_mtime_ns >= self.since_ns and self.before.get(path) != _ident(st):
                new.append((st.st_mtime_ns, path, st))
        if not new:
            return None
        members = self._members()
        for _, path, st in sorted(new, reverse=True):
            writer = _writer(members, (st.st_dev, st.st_ino))
            if writer is not None:
                self.note = "%s still open for writing by pid %d" % (path, writer)
                return None
        return max(new)[1]

    def _members(self):
        state = phasestate.load_state(self.stop["phase"]) or {}
        pids = {p["pid"] for p in self.procs} | {m["pid"] for m in (phasestate.members(state) if state else [])}
        return sorted(pids)

    def _done(self, outcome, path, waited):
        arrived = outcome == "checkpoint"
        text = {"checkpoint": "checkpoint arrived: %s" % path, "idle": "idle, no new checkpoint",
                "job exited": "the job exited, no checkpoint", "deadline": "no checkpoint by the deadline"}[outcome]
        if self.note and not arrived:
            text += " (%s)" % self.note
        self.result = {"phase": self.stop["phase"], "signal": self.stop["signal"], "waits_for": waits_for(self.stop),
                       "deadline_s": self.stop["deadline_s"], "pids": [p["pid"] for p, r in self.sent if r == "sent"],
                       "outcome": outcome, "arrived": arrived, "checkpoint": path, "waited_s": round(waited, 2),
                       "note": self.note}
        self.audit.log({"pid": None, "cmdline": "phase %s" % self.stop["phase"]}, "checkpoint stop",
                       "%s after %.2fs" % (text, waited), checkpoint=path, arrived=arrived, waited_s=round(waited, 2))
        return True


def run(stops, audit, progress, sel=None, approved=None):
    """Each stop (declared, checked) whose phase runs: its signal, then the waits side by side,
    each to its own deadline; `progress`: Options.emit_progress; `sel`, `approved`: as
    _processes. Returns the outcomes (records: rows.CheckpointStop)."""
    waiters = []
    for stop in stops:
        procs = _processes(stop, sel, approved)
        if procs:
            waiters.append(Waiter(stop, procs, audit))
    started, last = time.monotonic(), 0.0
    pending = list(waiters)
    while pending:
        pending = [w for w in pending if not w.look()]
        now = time.monotonic()
        if pending and now - last >= 0.5:
            last = now
            progress(phase="checkpoint", elapsed_s=round(now - started, 2),
                     problems=[w.note for w in pending if w.note], waiting=[w.stop["phase"] for w in pending])
        if pending:
            time.sleep(POLL_S)
    return [w.result for w in waiters]


def _ident(st):
    return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)


def _matches(pattern):
    """{path: lstat} of the regular files matching the glob (a link is not followed)."""
    out = {}
    for path in glob.glob(pattern) if pattern else ():
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            out[path] = st
    return out


def _snapshot(pattern):
    return {path: _ident(st) for path, st in _matches(pattern).items()}


def _writer(pids, ident):
    """The first pid of `pids` that holds the file (st_dev, st_ino) open for writing, or None."""
    for pid in pids:
        fd_dir = "/proc/%d/fd" % pid
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                st = os.stat("%s/%s" % (fd_dir, fd))
                if (st.st_dev, st.st_ino) != ident:
                    continue
                with open("/proc/%d/fdinfo/%s" % (pid, fd)) as f:
                    flags = next(int(line.split()[1], 8) for line in f if line.startswith("flags:"))
            except (OSError, StopIteration, ValueError):
                continue
            if flags & os.O_ACCMODE:
                return pid
    return None


def _idle(condition, left_s):
    """True when the phase's idle condition (`sh -c`) exits 0 within its time."""
    try:
        return subprocess.run(["sh", "-c", condition], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, cwd="/",
                              timeout=max(0.1, min(IDLE_RUN_S, left_s))).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False
