"""The processes one teardown signals: the approved plan, and what they fork meanwhile.

Why a set that grows: a server that forks on SIGTERM (a shutdown helper, a worker
restarted by its parent) or a holder that double-forks out of its tree would otherwise
never be signalled, and "FREED" would be printed with it still holding the GPU. The plan
the operator approves says so ("processes a target forks during the teardown are
signalled too"); nothing else is ever added. New descendants are learnt from the fork
watch (forkwatch.py: kernel fork events where available) and from the /proc parent
chain and the sessions targets lead, at each poll.

Every signal is sent by (pid, start time) through a pidfd (procfs.signal_if_same); one
that fails (permission denied) is never counted as sent, and makes the teardown not free.

The whole account: docs/design-notes.md (scripts/agent/teardown/targets.py)."""
import os
import select
import signal
import time

from ..policy import rules
from ..procs import procfs, procscan

STOPPED = ("T", "t")
FALLBACK_POLL_S = 0.005  # without pidfds: a few /proc/PID/stat reads per tick


def key(t):
    return (t["pid"], t["start_time"])


class ExitWaiter:
    """Sleep until one of some processes exits: a pidfd per process, opened once and kept.
    Used for a teardown's targets and for the holders `verify --wait` waits on."""

    def __init__(self):
        self._pidfds: dict = {}  # (pid, start) -> pidfd, or None: none to be had

    def _pidfd(self, k):
        if k not in self._pidfds:
            fd = None
            if hasattr(os, "pidfd_open"):
                try:
                    fd = os.pidfd_open(k[0])
                except OSError:  # gone (ESRCH), or no pidfds in this kernel (ENOSYS)
                    fd = None
                if fd is not None and procfs.start_time(k[0]) != k[1]:
                    os.close(fd)  # the pid names another process now: ours is gone
                    fd = None
            self._pidfds[k] = fd
        return self._pidfds[k]

    def wait(self, alive, timeout, extra_fds=()):
        """Block until one of `alive` (dicts with pid and start_time) exits, an fd in
        `extra_fds` turns readable, or `timeout` seconds pass. Callers re-check what is
        alive: this only decides when to look. Without a pidfd for some process (Python <
        3.9, kernel < 5.3, or it is already gone) it sleeps FALLBACK_POLL_S instead."""
        if timeout <= 0:
            return
        fds = [self._pidfd(key(t)) for t in alive]
        if not fds or None in fds or not hasattr(select, "poll"):
            time.sleep(min(timeout, FALLBACK_POLL_S))
            return
        poller = select.poll()
        for fd in fds + [f for f in extra_fds if f is not None]:
            poller.register(fd, select.POLLIN)
        poller.poll(max(1, int(timeout * 1000)))

    def close(self):
        for fd in self._pidfds.values():
            if fd is not None:
                os.close(fd)
        self._pidfds = {}


class Targets:
    def __init__(self, planned, audit, watch=None, chain=(), protect=(), since_ticks=0, scope_uid=None):
        self.items = list(planned)
        self.since_ticks = since_ticks  # only processes started after this (clock ticks since boot) are adopted
        self.scope_uid = scope_uid
        self.keys = {key(t) for t in self.items}
        self.audit = audit
        self.watch = watch
        self.chain = set(chain)
        self.protect = list(protect)
        self.failed = []          # signals that could not be sent: {"pid", "signal", "result"}
        self.added = []           # descendants adopted during the teardown
        self.term_at = {}         # key -> monotonic time SIGTERM was sent
        self.killed = set()
        self.exits = ExitWaiter()  # pidfds of the targets waited on

    def extend(self, planned):
        """More planned targets (the plan's batch after the early one: agent/teardown/early.py)."""
        new = [t for t in planned if key(t) not in self.keys]
        self.items.extend(new)
        self.keys.update(key(t) for t in new)
        return new

    def signal(self, targets, sig, name):
        sent_at = time.monotonic()
        results = [(t, send(t, sig)) for t in targets]  # all at once; the log after
        for t, result in results:
            self.audit.log(t, name, result)
            if result not in ("sent", "gone", "reused"):
                self.failed.append({"pid": t["pid"], "signal": name, "result": result, "cmdline": t.get("cmdline")})
                continue
            if result != "sent":
                continue
            if sig == signal.SIGTERM:
                self.term_at.setdefault(key(t), sent_at)
                self._cont_if_stopped(t)
            elif sig == signal.SIGKILL:
                self.killed.add(key(t))

    def _cont_if_stopped(self, t):
        stat = procfs.read_stat(t["pid"])
        if stat and stat["start_time"] == t["start_time"] and stat["state"] in STOPPED:
            try:
                result = procfs.signal_if_same(t["pid"], t["start_time"], signal.SIGCONT)
            except PermissionError:
                result = "permission denied"
            self.audit.log(t, "SIGCONT", result)

    def alive(self, among=None):
        return [t for t in (self.items if among is None else among) if procfs.same_process(t["pid"], t["start_time"])]

    def running(self, among=None):
        """Those still running their own code: alive and not in their exit (procfs.exiting).
        What a teardown waits on and escalates; alive() is what it reports as stuck."""
        return [t for t in (self.items if among is None else among) if not procfs.exiting(t["pid"], t["start_time"])]

    def wait(self, alive, timeout, extra_fds=()):
        """Block until one of `alive` exits, the fork watch's socket (in `extra_fds`) turns
        readable, or `timeout` passes (ExitWaiter.wait)."""
        self.exits.wait(alive, timeout, extra_fds)

    def close(self):
        self.exits.close()

    def adopt_new(self, procs=None):
        """New descendants of targets (fork events, parent chain, session): signal
        SIGTERM at once and return them. `procs` is a fresh /proc table, when the caller has one."""
        found = {}
        if self.watch is not None:
            for pid, start, parent in self.watch.poll():
                found[(pid, start)] = parent
        if procs is None and (self.watch is None or self.watch.mode != "connector"):
            # only the stat of each process: who is whose; the rest is read for what is adopted
            procs = {p: i for p, i in ((p, procfs.read_stat(p)) for p in procscan.all_pids()) if i}
        if procs:
            found.update(self._by_parentage(procs))
        new = []
        for (pid, start), parent in sorted(found.items()):
            if (pid, start) in self.keys:
                continue
            info = (procs or {}).get(pid)
            info = info if info and "argv" in info else procscan.basic(pid)
            if not info or info["start_time"] != start or procfs.finished(info) or start < self.since_ticks:
                continue  # gone, reused, or there before the teardown: the plan decided about it
            if self.scope_uid is not None and info["uid"] != self.scope_uid:
                continue
            if rules.protect_reason(info, self.chain, self.protect):
                continue
            t = {k: info.get(k) for k in ("pid", "start_time", "ppid", "pgid", "state", "comm", "argv", "cmdline")}
            t["reason"] = "forked by target %s during the teardown" % parent
            t["gpu_mib"], t["devices"], t["write_files"], t["via"] = {}, [], [], "signal"
            self.keys.add((pid, start))
            self.items.append(t)
            self.added.append(t)
            new.append(t)
        if new:
            self.signal(new, signal.SIGTERM, "SIGTERM")
        return new

    def _by_parentage(self, procs):
        """Processes whose parent chain reaches a live target, or that sit in a session a
        target leads (a double fork without setsid keeps the session; every member of a
        session descends from its leader). Not a process group: a shell puts pipeline
        siblings (`torchrun | tee log`) in the server's group, and what they start is not ours."""
        live = {t["pid"]: t for t in self.items
                if t["pid"] in procs and procs[t["pid"]]["start_time"] == t["start_time"]}
        out = {}
        for pid, info in procs.items():
            if info["start_time"] < self.since_ticks or (pid, info["start_time"]) in self.keys:
                continue  # there before the teardown: the plan decided about it (and most of a big host is)
            chain = procscan.ancestors(pid, procs)[1:]
            parent = next((p for p in chain if p in live), None)
            if parent is None and info["sid"] in live and info["sid"] != pid:
                parent = info["sid"]
            if parent is not None:
                out[(pid, info["start_time"])] = parent
        return out

    def escalate(self, grace_s, among=None):
        """SIGKILL those of `among` (default: the adopted descendants) that still run their
        own code grace_s after their SIGTERM."""
        now = time.monotonic()
        due = [t for t in (self.added if among is None else among)
               if key(t) not in self.killed and now - self.term_at.get(key(t), now) >= grace_s]
        late = self.running(due) if due else []  # /proc is read only for those whose grace is over
        if late:
            self.signal(late, signal.SIGKILL, "SIGKILL")
        return late


def send(row, sig):
    """Signal the process a row names (pid + start time): 'sent', 'gone', 'reused', or why
    not in words ('permission denied', 'error: ...'), never an exception."""
    try:
        return procfs.signal_if_same(row["pid"], row["start_time"], sig)
    except PermissionError:
        return "permission denied"
    except OSError as exc:
        return "error: %s" % exc
