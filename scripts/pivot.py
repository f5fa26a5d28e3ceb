"""A pivot: drain -> teardown -> gates -> (deploy: patch) -> launch lint -> start -> ready
-> (deploy: smoke test, roll back on failure) -> prep jobs reported -> audit.

Why one place: the seeds did these by hand, in an order that changed each time, with
fixed sleeps and no rollback. Each step is one agent call; a failed step stops the pivot
with the documented exit code and says what was (not) started.
Exit codes: 0 done; 1 not ready / rolled back / a prep job failed / GPUs not free;
3 unreachable; 4 locked; 5 a gate or the launch lint blocked the start (nothing started).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from . import audit_log, phase_ops
from .render import shorten
from .transport import call_agent

EXIT_OK, EXIT_NOT_READY, EXIT_GATE = 0, 1, 5


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
                           time=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
        audit_log.append(self.host.alias, [self.record])
        self.out(f"{self.host.alias}: pivot to {self.phase.name}: {verdict} ({self.record['wall_s']}s)")
        return code

    # -- the run --------------------------------------------------------------------------
    def run(self) -> int:
        if self.opts.dry_run:
            for i, (name, what) in enumerate(self.steps, 1):
                self.out(f"[{i}/{len(self.steps)}] {name}: {what}")
            self.out("--dry-run: nothing was run")
            return EXIT_OK
        for name, _ in self.steps:
            code = getattr(self, "step_" + name.replace("-", "_"))()
            if code is not None:
                return code
        return self.finish(EXIT_OK, "done")

    def step_drain(self):
        url = self.opts.drain_url or self.phase.drain_metrics
        r = phase_ops.drain(self.host, url, self.phase.drain_timeout,
                            on_progress=lambda p: self.out(f"    draining: {p['running']:g} request(s) in flight ({p['elapsed_s']}s)"))
        d = r.doc
        text = d.get("note") or (f"drained in {d['waited_s']}s" if d["drained"] else
                                 f"still {d['running']:g} in flight after {d['waited_s']}s: continuing (bounded drain)")
        self.say("drain", text)

    def step_teardown(self):
        r = call_agent(self.host, "teardown", self.opts.teardown_args,
                       on_progress=lambda p: self.out(f"    {p.get('phase')}: {len(p.get('alive') or [])} alive, "
                                                      f"GPU MiB used {p.get('mib_left')}"))
        d = r.doc
        if d.get("locked"):
            self.say("teardown", d["error"])
            return self.finish(4, "locked")
        if d.get("actions"):
            audit_log.append(self.host.alias, d["actions"])
        self.say("teardown", f"{'freed' if r.code == 0 else 'NOT FREE'}: {len(d['plan']['targets'])} target(s) stopped, "
                             f"{len(d['plan']['protected'])} protected kept, {d.get('freed_mib', 0)} MiB freed in {d['wall_s']}s")
        if r.code:
            for p in d.get("problems", []):
                self.out("    " + p)
            return self.finish(r.code, "GPUs not free: nothing started")

    def step_gates(self):
        r = phase_ops.gates(self.host, self.phase)
        for g in r.doc["gates"]:
            self.out(f"    {'ok  ' if g['ok'] else 'FAIL'} {g['gate']} ({g['detail']})")
        self.say("gates", "passed" if r.code == 0 else "FAILED: nothing started")
        if r.code:
            return self.finish(EXIT_GATE, "a gate failed: nothing started")

    def step_deploy(self):
        r = phase_ops.deploy(self.host, self.phase, "apply")
        self.say("deploy", f"{r.doc['detail']}: {', '.join(r.doc['files']) or '-'}")
        if r.code:
            return self.finish(EXIT_GATE, "the deploy does not apply: nothing started")

    def step_lint(self):
        r = phase_ops.lint(self.host, list(self.phase.argv), self.phase.gpus)
        for f in r.doc["findings"]:
            self.out(f"    {f['check']}: {f['message']}")
        if r.code and not self.opts.force:
            self.say("lint", "BLOCKED (use --force to start anyway)")
            if self.phase.is_deploy:
                phase_ops.deploy(self.host, self.phase, "rollback")
                self.out("    deploy rolled back")
            return self.finish(EXIT_GATE, "launch lint blocked the start: nothing started")
        self.say("lint", "ok" if not r.code else "findings ignored (--force)")

    def step_start(self):
        r = phase_ops.start(self.host, self.phase)
        if r.code:
            self.say("start", f"FAILED: {r.doc.get('error')}")
            return self.finish(EXIT_NOT_READY, "did not start")
        st = r.doc["state"]
        self.say("start", f"started via {st['how']} ({st.get('unit') or 'pid %s, log %s' % (st['pid'], st['log'])})")

    def step_prep(self):
        self.say("prep", f"{len(self.phase.prep)} job(s) started alongside")

    def step_ready(self):
        r = phase_ops.ready(self.host, self.phase, self.ready_timeout, on_progress=self._ready_progress)
        d = r.doc
        if r.code == 0:
            self.say("ready", f"ready after {d['waited_s']}s ({d['detail']})")
            return None
        self.say("ready", f"NOT READY after {d['waited_s']}s: {d['detail']}")
        self.out("    log tail:\n" + "\n".join("      " + line for line in d["log_tail"]))
        if self.phase.is_deploy:
            return self.rollback("the new server did not become ready")
        return self.finish(EXIT_NOT_READY, "not ready")

    def _ready_progress(self, p: dict) -> None:
        self.out(f"    waiting {p['elapsed_s']:.0f}s: {p['detail']} | log: {shorten(p.get('last_log') or '', 70)}")

    def step_smoke(self):
        r = phase_ops.smoke(self.host, self.phase)
        if r.code == 0:
            self.say("smoke", f"HTTP {r.doc['status']}: {shorten(r.doc['body'], 60)}")
            return None
        self.say("smoke", f"FAILED: {r.doc['error']}")
        if self.phase.is_deploy:
            return self.rollback("the smoke request failed")
        return self.finish(EXIT_NOT_READY, "smoke test failed")

    def step_prep_report(self):
        deadline = time.monotonic() + self.ready_timeout
        while True:
            prep = phase_ops.ready(self.host, self.phase, 0).doc["prep"]
            if all(p["status"] != "running" for p in prep) or time.monotonic() > deadline:
                break
            time.sleep(1.0)
        for p in prep:
            self.out(f"    {p['status']:>10}  {shorten(p['cmd'], 70)}")
        failed = [p for p in prep if p["exit"] != 0]
        self.say("prep-report", f"{len(prep) - len(failed)}/{len(prep)} preparation job(s) exited 0")
        if failed:
            return self.finish(EXIT_NOT_READY, "a preparation job failed")

    def rollback(self, why: str) -> int:
        self.out(f"    rolling back: {why}")
        phase_ops.stop(self.host, self.phase, self.opts.operator)
        r = phase_ops.deploy(self.host, self.phase, "rollback")
        self.out(f"    restored: {', '.join(r.doc['files']) or '-'}")
        phase_ops.start(self.host, self.phase)
        again = phase_ops.ready(self.host, self.phase, self.ready_timeout, on_progress=self._ready_progress)
        state = "old server healthy again" if again.code == 0 else f"old server NOT ready either: {again.doc['detail']}"
        return self.finish(EXIT_NOT_READY, f"rolled back ({why}); {state}")
