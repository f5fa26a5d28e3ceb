"""Freeze the targets' related starters for the stop, end the job's own after it, thaw the rest.

Why freeze: a restart loop whose server gets SIGTERM starts it again as soon as it exits,
before any later signal reaches the loop; a frozen loop (SIGSTOP, which no process can catch)
starts nothing. So the plan's starters (relation.py) are frozen before the first SIGTERM to a
target. Once the targets are gone, the job's own (fate "stop": launchers, shell loops) get
SIGTERM and SIGCONT (a stopped process acts on a signal only once continued), and SIGKILL
after the grace; the others (fate "freeze": a Python launcher, a notebook kernel) get SIGCONT,
as they were, and are named by the verdict. Every signal goes by (pid, start time), is
audited, and the ledger (state/frozen.py) lists the frozen ones until they are thawed or ended.
"""
import os
import signal
import time

from ..policy import relation
from ..procs import procfs
from ..state import frozen as ledger
from .targets import ExitWaiter


class Freezer:
    def __init__(self, audit):
        self.audit = audit
        self.frozen: dict = {}  # (pid, start) -> row, frozen and not yet thawed or ended
        self.stopped_before: set = set()  # (pid, start) found stopped already: never continued by the thaw
        self.programs: dict = {}  # (pid, start) -> where its argv began when frozen (an exec moves it)
        self.errors: list = []

    def freeze(self, rows):
        """SIGSTOP each row not frozen yet, after writing the ledger that lists it. One stopped
        already (someone's `kill -STOP`) is left as it was: frozen is what it is, and the thaw
        must not start what the teardown did not stop."""
        new = [r for r in rows if (r["pid"], r["start_time"]) not in self.frozen
               and (r["pid"], r["start_time"]) not in self.stopped_before]
        for r in list(new):
            stat = procfs.read_stat(r["pid"])
            if stat is not None and stat["start_time"] == r["start_time"] and stat["state"] in ("T", "t"):
                self.stopped_before.add((r["pid"], r["start_time"]))
                new.remove(r)
            elif stat is not None:
                self.programs[(r["pid"], r["start_time"])] = stat["arg_start"]
        if not new:
            return
        for r in new:
            self.frozen[(r["pid"], r["start_time"])] = r
        try:
            ledger.write(list(self.frozen.values()))
        except OSError as exc:
            self.errors.append("could not write the freeze ledger: %s" % exc)
        self._send(new, signal.SIGSTOP, "SIGSTOP")

    def settle_plan(self, rows):
        """The plan's starters to freeze (`rows`): freeze those the early batch did not, and thaw
        one the early batch froze that the plan does not list (it is not the plan's to hold)."""
        keep = {(r["pid"], r["start_time"]) for r in rows}
        extra = [r for k, r in self.frozen.items() if k not in keep]
        if extra:
            self._send(extra, signal.SIGCONT, "SIGCONT")
            self._forget(extra)
        self.freeze(rows)

    def _send(self, rows, sig, name):
        for r in rows:
            try:
                result = procfs.signal_if_same(r["pid"], r["start_time"], sig)
            except OSError as exc:
                result = "error: %s" % exc
            self.audit.log(r, name, result)

    def end(self, rows, grace_s):
        """SIGTERM + SIGCONT each frozen row of `rows`, wait up to grace_s for them to exit,
        SIGKILL the rest. Returns the rows still alive after that (stuck)."""
        rows = [r for r in rows if (r["pid"], r["start_time"]) in self.frozen]
        if not rows:
            return []
        self._send(rows, signal.SIGTERM, "SIGTERM")
        self._send(rows, signal.SIGCONT, "SIGCONT")
        waiter = ExitWaiter()
        try:
            deadline = time.monotonic() + grace_s
            alive = self._alive(rows)
            while alive and time.monotonic() < deadline:
                waiter.wait(alive, deadline - time.monotonic())
                alive = self._alive(rows)
            alive = self._same_program(alive)
            if alive:
                self._send(alive, signal.SIGKILL, "SIGKILL")
                deadline = time.monotonic() + 2.0
                while alive and time.monotonic() < deadline:
                    waiter.wait(alive, deadline - time.monotonic())
                    alive = self._alive(rows)
        finally:
            waiter.close()
        self._forget(rows)
        return alive

    def _same_program(self, rows):
        """The rows still running the program they were frozen in; one that exec'd another since
        (`bash -c 'SRV; exec bash'` became someone's interactive shell, which ignores SIGTERM) is
        not what the plan listed: never SIGKILLed, logged, and named by the verdict if it lives."""
        out = []
        for r in rows:
            stat = procfs.read_stat(r["pid"])
            was = self.programs.get((r["pid"], r["start_time"]))
            if stat is not None and was and stat["arg_start"] and stat["arg_start"] != was:
                self.audit.log(r, "no SIGKILL", "it runs another program since it was frozen (exec): left as it is")
                continue
            out.append(r)
        return out

    def interrupt(self, terminals, since_ticks):
        """Ctrl-C (relation.interrupt_loop) at each terminal's prompt whose foreground job was a
        target: a loop typed there ends instead of starting the server again. The shell itself
        is never signalled (an interactive shell ignores SIGTERM, and SIGHUP ends its jobs)."""
        for link in terminals:
            def send(leader, pgid, link=link):
                try:
                    os.killpg(pgid, signal.SIGINT)
                    result = "sent"
                except OSError as exc:
                    result = "error: %s" % exc
                self.audit.log(dict(leader, cmdline=leader.get("comm")),
                               "SIGINT to group %d (Ctrl-C at the prompt of PID %d)" % (pgid, link["pid"]), result)

            relation.interrupt_loop(link, since_ticks, send)

    def thaw(self):
        """SIGCONT every row still frozen; the ledger goes."""
        rows = list(self.frozen.values())
        self._send(rows, signal.SIGCONT, "SIGCONT")
        self._forget(rows)

    def _forget(self, rows):
        for r in rows:
            self.frozen.pop((r["pid"], r["start_time"]), None)
        try:
            ledger.write(list(self.frozen.values()))
        except OSError as exc:
            self.errors.append("could not update the freeze ledger: %s" % exc)

    @staticmethod
    def _alive(rows):
        return [r for r in rows if procfs.same_process(r["pid"], r["start_time"])]
