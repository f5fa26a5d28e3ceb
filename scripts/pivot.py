"""A pivot: drain -> teardown -> gates -> (deploy: patch) -> launch lint -> start -> ready
-> (deploy: smoke test, roll back on failure) -> prep jobs reported -> audit.

Why one place: done by hand, these steps came in an order that changed each time, with
fixed sleeps and no rollback. Each step is one agent call; a failed step stops the pivot
with the documented exit code (contract.EXIT_CODES) and says what was (not) started.
Exit codes: 0 done; 1 not ready / rolled back / a prep job failed / GPUs not free;
3 unreachable; 4 locked; 5 a gate or the launch lint blocked the start (nothing started).
The words of each step's result are the views' (teardown_view, phase_view).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from . import audit_log, phase_ops, phase_view, teardown_view
from .agent import contract
from .transport import call_agent


@dataclass
class PivotOptions:
    teardown_args: list = field(default_factory=list)
    drain_url: str | None = None
    dry_run: bool = False
    force: bool = False
    operator: str = "gpu-pivot"
    ready_timeout: float | None = None


class Pivot:
    def __init__(self, host, phase, opts: PivotOptions, out=print):
        self.host, self.phase, self.opts, self.out = host, phase, opts, out
        self.steps = self._steps()
        self.n = 0
        self.started = time.monotonic()
        self.record: dict = {"event": "pivot", "to": phase.name, "operator": opts.operator, "steps": []}

    def _steps(self) -> list:
        p, steps = self.phase, []
        url = self.opts.drain_url or p.drain_metrics
        if url:
            steps.append(("drain", f"wait until {url} shows no in-flight request (at most {p.drain_timeout:g}s)"))
        steps.append(("teardown", "free the GPUs (plan, SIGTERM all targets, SIGKILL after grace, verify)"))
        if p.gates:
            steps.append(("gates", "; ".join(p.gates)))
        if p.is_deploy:
            steps.append(("deploy", f"apply {p.patch or 'file copies'} with a backup"))
        if p.is_server and p.lint:
            steps.append(("lint", "check the launch command (EAGLE vs EAGLE3, TP vs GPUs, port, paths, GPUs free)"))
        steps.append(("start", " ".join(p.argv) if not p.shell else p.argv[2]))
        if p.prep:
            steps.append(("prep", f"{len(p.prep)} CPU-only preparation job(s), started with the phase"))
        steps.append(("ready", f"wait for {p.ready} (at most {self.ready_timeout:g}s)"))
        if p.smoke_url:
            steps.append(("smoke", f"one request to {p.smoke_url}"))
        if p.prep:
            steps.append(("prep-report", "wait for each preparation job and report its exit code"))
        return steps

    @property
    def ready_timeout(self) -> float:
        return self.opts.ready_timeout or self.phase.ready_timeout

    def say(self, name: str, text: str) -> None:
        self.n += 1
        self.out(f"[{self.n}/{len(self.steps)}] {name}: {text}")
        self.record["steps"].append({"step": name, "result": text})

    def finish(self, code: int, verdict: str) -> int:
        self.record.update(exit_code=code, verdict=verdict, wall_s=round(time.monotonic() - self.started, 2),
                           time=time.strftime(contract.TIME_FORMAT))
        audit_log.append(self.host.alias, [self.record])
        self.out(f"{self.host.alias}: pivot to {self.phase.name}: {verdict} ({self.record['wall_s']}s)")
        return code

    # -- the run --------------------------------------------------------------------------
    def run(self) -> int:
        if self.opts.dry_run:
            for i, (name, what) in enumerate(self.steps, 1):
                self.out(f"[{i}/{len(self.steps)}] {name}: {what}")
            self.out("--dry-run: nothing was run")
            return contract.EXIT_OK
        for name, _ in self.steps:
            code = getattr(self, "step_" + name.replace("-", "_"))()
            if code is not None:
                return code
        return self.finish(contract.EXIT_OK, "done")

    def step_drain(self):
        url = self.opts.drain_url or self.phase.drain_metrics
        r = phase_ops.drain(self.host, url, self.phase.drain_timeout,
                            on_progress=lambda p: self.out("    " + phase_view.drain_progress(p)))
        self.say("drain", phase_view.drain_line(r))

    def step_teardown(self):
        alias = self.host.alias
        r = call_agent(self.host, "teardown", self.opts.teardown_args,
                       on_progress=lambda p: self.out("    " + teardown_view.progress_line(alias, p)))
        t: contract.TeardownResult = r.result
        self.say("teardown", teardown_view.brief(t))
        if not t.ran:  # locked by another teardown, or the host's state dir refused: nothing signalled
            return self.finish(r.code, "locked" if t.locked else "teardown not started: nothing started")
        if t.actions:
            audit_log.append(alias, t.actions)
        if r.code:
            for problem in t.problems:
                self.out("    " + problem)
            return self.finish(r.code, "GPUs not free: nothing started")

    def step_gates(self):
        r = phase_ops.gates(self.host, self.phase)
        for line in phase_view.gate_lines(r):
            self.out("    " + line)
        self.say("gates", "passed" if r.code == 0 else "FAILED: nothing started")
        if r.code:
            return self.finish(contract.EXIT_GATE, "a gate failed: nothing started")

    def step_deploy(self):
        r = phase_ops.deploy(self.host, self.phase, "apply")
        self.say("deploy", phase_view.deploy_line(r))
        if r.code:
            return self.finish(contract.EXIT_GATE, "the deploy does not apply: nothing started")

    def step_lint(self):
        r = phase_ops.lint(self.host, list(self.phase.argv), self.phase.gpus)
        for line in phase_view.lint_lines(r):
            self.out("    " + line)
        if r.code and not self.opts.force:
            self.say("lint", "BLOCKED (use --force to start anyway)")
            if self.phase.is_deploy:
                phase_ops.deploy(self.host, self.phase, "rollback")
                self.out("    deploy rolled back")
            return self.finish(contract.EXIT_GATE, "launch lint blocked the start: nothing started")
        self.say("lint", "ok" if not r.code else "findings ignored (--force)")

    def step_start(self):
        r = phase_ops.start(self.host, self.phase)
        self.say("start", phase_view.start_line(r))
        if r.code:
            return self.finish(contract.EXIT_FAILED, "did not start")

    def step_prep(self):
        self.say("prep", f"{len(self.phase.prep)} job(s) started alongside")

    def step_ready(self):
        r = phase_ops.ready(self.host, self.phase, self.ready_timeout, on_progress=self._ready_progress)
        self.say("ready", phase_view.ready_line(r))
        if r.code == 0:
            return None
        self.out("    " + phase_view.log_tail(r).replace("\n", "\n    "))
        if self.phase.is_deploy:
            return self.rollback("the new server did not become ready")
        return self.finish(contract.EXIT_FAILED, "not ready")

    def _ready_progress(self, p: dict) -> None:
        self.out("    " + phase_view.ready_progress(p))

    def step_smoke(self):
        r = phase_ops.smoke(self.host, self.phase)
        self.say("smoke", phase_view.smoke_line(r))
        if r.code == 0:
            return None
        if self.phase.is_deploy:
            return self.rollback("the smoke request failed")
        return self.finish(contract.EXIT_FAILED, "smoke test failed")

    def step_prep_report(self):
        deadline = time.monotonic() + self.ready_timeout
        while True:
            r = phase_ops.ready(self.host, self.phase, 0)
            if all(p["status"] != "running" for p in r.result.prep) or time.monotonic() > deadline:
                break
            time.sleep(1.0)
        for line in phase_view.prep_lines(r):
            self.out("    " + line)
        prep = r.result.prep
        failed = [p for p in prep if p["exit"] != 0]
        self.say("prep-report", f"{len(prep) - len(failed)}/{len(prep)} preparation job(s) exited 0")
        if failed:
            return self.finish(contract.EXIT_FAILED, "a preparation job failed")

    def rollback(self, why: str) -> int:
        self.out(f"    rolling back: {why}")
        phase_ops.stop(self.host, self.phase, self.opts.operator)
        r = phase_ops.deploy(self.host, self.phase, "rollback")
        self.out(f"    restored: {', '.join(r.result.files) or '-'}")
        phase_ops.start(self.host, self.phase)
        again = phase_ops.ready(self.host, self.phase, self.ready_timeout, on_progress=self._ready_progress)
        state = "old server healthy again" if again.code == 0 else f"old server NOT ready either: {again.result.detail}"
        return self.finish(contract.EXIT_FAILED, f"rolled back ({why}); {state}")
