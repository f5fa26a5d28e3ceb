"""A pivot: drain -> teardown -> gates -> (deploy: patch) -> launch lint -> start -> ready
-> (deploy: smoke test, roll back on failure) -> prep jobs reported -> audit.

Why one place: by hand, these steps come in a different order each time, with fixed
sleeps and no rollback. Each step is one agent call; a failed step stops the pivot
with the documented exit code (codes.EXIT_CODES) and says what was (not) started.

Why every step is recorded with its exit: the verdict is computed from what happened, never
assumed. A rollback whose stop, restore or start failed is "rollback FAILED at ...", not
"rolled back"; a drain that could not read the server's metrics stops the pivot before
its teardown (unless --no-drain). The pivot ends with a table of its steps (step, result,
exit, seconds), and the same list is the `--json` document and the audit record.

Its exit codes are the task's (`invoke pivot --help` lists them). The words of each step's
result are the views' (Words, made by scripts/cli/pivot_words.py).
"""
from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from ..agent.state import statedir
from ..agent.wire import codes, defaults, records, requests
from ..reach.route import HostUnreachable
from ..reach.transport import AgentError, call_agent, exit_code_for
from . import audit_log, gpu_settings, phase as phase_ops, teardown as teardown_op


@dataclass(frozen=True)
class Words:
    """What a pivot says about each step's result: the views' words (scripts/cli/pivot_words.py
    makes them), passed in by the task. Why passed in: the pivot runs the steps and the views,
    above it, render their results; it never imports them."""

    safe: Callable[[str], str]  # a host's text made printable (escapes, bidi overrides)
    drain_progress: Callable[[dict], str]
    drain_line: Callable[..., str]
    teardown_progress: Callable[[str, dict], str]  # (alias, progress fields)
    teardown_brief: Callable[..., str]
    shm_lines: Callable[..., list]  # the shared memory the stopped targets left: removed or kept
    probe_line: Callable[..., str]  # the probe step's verify result (records.VerifyResult) in one line
    gate_lines: Callable[..., list]
    deploy_line: Callable[..., str]
    lint_lines: Callable[..., list]
    start_line: Callable[..., str]
    ready_line: Callable[..., str]
    ready_progress: Callable[[dict], str]
    log_tail: Callable[..., str]
    smoke_line: Callable[..., str]
    prep_lines: Callable[..., list]
    stop_line: Callable[..., str]
    step_table: Callable[[list], str]  # the steps (step, result, exit, seconds) at the end
    settings_line: Callable[..., str]  # a gpu-settings result in one line (views/gpu_settings.py)
    settings_lines: Callable[..., list]  # each setting written or failed, with its values
    hold_line: Callable[..., str]  # the lock kept from the teardown until ready (the hold's text)
    release_line: Callable[..., str]  # the release of that lock
    intruder_lines: Callable[[list], list]  # processes outside the new phase that opened a GPU


@dataclass
class PivotOptions:
    teardown: requests.Teardown = field(default_factory=requests.Teardown)
    drain_url: str | None = None
    no_drain: bool = False
    dry_run: bool = False
    force: bool = False
    operator: str = "gpu-pivot"
    ready_timeout: float | None = None


class StepFailed(Exception):
    """An agent call of a step gave no result (unreachable, timed out, agent failed)."""

    def __init__(self, code: int, text: str):
        super().__init__(text)
        self.code = code


T = TypeVar("T")
HOLD_MARGIN_S = 300.0  # beyond the ready timeout: the gates, the start and the calls between them
MAX_HOLD_S = 7200.0  # the agent's limit (hostlock.MAX_HOLD_S)


def _attempt(fn: Callable[[], T]) -> T:
    """fn()'s result, or StepFailed with the documented code (transport.exit_code_for) and the
    error's one line, for the errors a step meets on its host."""
    try:
        return fn()
    except (HostUnreachable, AgentError, statedir.StateDirError) as exc:
        raise StepFailed(exit_code_for(exc) or codes.EXIT_UNREACHABLE, str(exc)) from None


class Pivot:
    def __init__(self, host, phase, opts: PivotOptions, words: Words, out=print):
        self.host, self.phase, self.opts, self.words, self.out = host, phase, opts, words, out
        self.steps = self._steps()
        self.n = 0
        self.started = time.monotonic()
        self.step_started = self.started
        self.record: dict = {"event": "pivot", "host": host.alias, "to": phase.name, "operator": opts.operator,
                             "steps": []}
        self.hold_token = secrets.token_hex(8)
        self.held = False  # the host's lock stays ours from the teardown until ready (agent teardown/hold.py)

    @property
    def drain_url(self) -> str | None:
        return self.opts.drain_url or self.phase.drain_metrics

    def _steps(self) -> list:
        """[(name, the method that runs it, what it does in words)], in order."""
        p, steps = self.phase, []
        url = self.drain_url
        if url and self.opts.no_drain:
            steps.append(("drain", self.step_drain,
                          f"skipped (--no-drain): {url} is not read; requests in flight are cut off"))
        elif url:
            steps.append(("drain", self.step_drain, f"wait until {url} shows no in-flight request (at most "
                                                    f"{p.drain_timeout:g}s); stop if it cannot be read"))
        steps.append(("teardown", self.step_teardown,
                      "free the GPUs (plan, SIGTERM all targets, SIGKILL after grace, verify)"))
        steps += self._settings_steps("baseline")
        steps.append(("probe", self.step_probe, f"prove each GPU usable: a CUDA context, {self.host.probe_mib} MiB "
                                                "allocated, touched, freed; NVLink fabric completed"))
        if p.gates:
            steps.append(("gates", self.step_gates, "; ".join(phase_gate_texts(p))))
        if p.is_deploy:
            steps.append(("deploy", self.step_deploy, f"apply {p.patch or 'file copies'} with a backup"))
        if p.is_server and p.lint:
            steps.append(("lint", self.step_lint,
                          "check the launch command (EAGLE vs EAGLE3, TP vs GPUs, port, paths, GPUs free)"))
        steps += self._settings_steps("settings")
        steps.append(("start", self.step_start, " ".join(p.argv) if not p.shell else p.argv[2]))
        if p.prep:
            steps.append(("prep", self.step_prep, f"{len(p.prep)} CPU-only preparation job(s), started with the phase"))
        steps.append(("ready", self.step_ready, f"wait for {p.ready} (at most {self.ready_timeout:g}s)"))
        if p.smoke_url:
            steps.append(("smoke", self.step_smoke, f"one request to {p.smoke_url}"))
        if p.prep:
            steps.append(("prep-report", self.step_prep_report,
                          "wait for each preparation job and report its exit code"))
        return steps

    def _settings_steps(self, name: str) -> list:
        """The baseline after the teardown, the phase's settings before its start: steps only
        where hosts.env gives them, and run only where the host opts in (GPU_APPLY_SETTINGS)."""
        up = self.host.alias.upper()
        want = self.host.gpu_baseline if name == "baseline" else dict(self.phase.gpu_settings)
        if not want:
            return []
        what = (f"{up}_GPU_BASELINE" if name == "baseline" else f"{up}_PHASE_{self.phase.name.upper()}_GPU_SETTINGS")
        if not self.host.apply_settings:
            return [(name, lambda: self.say(name, f"not set: {up}_GPU_APPLY_SETTINGS is not yes (status shows drift)"),
                     f"not set: {up}_GPU_APPLY_SETTINGS is not yes; `invoke status` shows where GPUs differ")]
        shown = ", ".join(f"{k} {v}" for k, v in sorted(want.items()))
        return [(name, lambda: self.step_settings(name, want, what), f"set every GPU to {what} ({shown}), "
                                                                     "all GPUs at once; each change audited")]

    def step_settings(self, name: str, want: dict, what: str):
        r = _attempt(lambda: gpu_settings.apply(self.host, want, self.opts.operator))
        for line in self.words.settings_lines(r.result):
            self.out("    " + line)
        records = gpu_settings.audit_records(r.result, f"pivot to {self.phase.name}: {what}")
        if records:
            audit_log.append(self.host.alias, records)
        self.say(name, self.words.settings_line(r.result), r.code)
        if r.code:
            return self.finish(codes.EXIT_GATE, f"GPU settings ({what}) not set: nothing started")
        return None

    @property
    def ready_timeout(self) -> float:
        return self.opts.ready_timeout or self.phase.ready_timeout

    def say(self, name: str, text: str, code: int = codes.EXIT_OK, numbered: bool = True) -> None:
        """Print and record one step's result with its exit code and its seconds."""
        now = time.monotonic()
        if numbered:
            self.n += 1
            self.out(f"[{self.n}/{len(self.steps)}] {name}: {self.words.safe(text)}")  # host text in it: escaped
        else:
            self.out(f"    {name}: {self.words.safe(text)}")
        self.record["steps"].append({"step": name, "result": text, "exit": code,
                                     "seconds": round(now - self.step_started, 2)})
        self.step_started = now

    def finish(self, code: int, verdict: str) -> int:
        self.release_hold()
        self.record.update(exit_code=code, verdict=verdict, wall_s=round(time.monotonic() - self.started, 2),
                           time=time.strftime(defaults.TIME_FORMAT))
        try:
            audit_log.append(self.host.alias, [self.record])
        except statedir.StateDirError as exc:  # the verdict stands; say the record is missing
            self.record["audit_error"] = str(exc)
            self.out(f"    audit log not written: {exc}")
        self.out(self.words.step_table(self.record["steps"]))
        self.out(f"{self.host.alias}: pivot to {self.phase.name}: {verdict} ({self.record['wall_s']}s)")
        return code

    # -- the run --------------------------------------------------------------------------
    def run(self) -> int:
        if self.opts.dry_run:
            for i, (name, _, what) in enumerate(self.steps, 1):
                self.out(f"[{i}/{len(self.steps)}] {name}: {what}")
            self.out("--dry-run: nothing was run")
            return codes.EXIT_OK
        try:
            for name, step, _ in self.steps:
                self.step_started = time.monotonic()
                try:
                    code = step()
                except StepFailed as exc:
                    self.say(name, f"ERROR: {exc}", exc.code)
                    return self.finish(exc.code, f"{name} failed: {_what_ran(name)}")
                if code is not None:
                    return code
            return self.finish(codes.EXIT_OK, "done")
        finally:  # Ctrl-C or a bug: the lock is not left held until the holder's deadline
            self.release_hold()

    # -- the host's lock, kept from the teardown until the new phase is ready ---------------
    def hold_seconds(self) -> float:
        """How long the holder may keep the lock if this pivot never releases it: the ready
        timeout and a margin, and a deploy's rollback (its stop and a second ready) on top."""
        extra = self.phase.stop_timeout + self.ready_timeout if self.phase.is_deploy else 0.0
        return min(MAX_HOLD_S, self.ready_timeout + HOLD_MARGIN_S + extra)

    def release_hold(self) -> None:
        """End the holder (`release`), once; recorded as the step "lock". A failure is said, and
        the holder's own deadline still ends it."""
        if not self.held:
            return
        self.held = False
        self.step_started = time.monotonic()
        try:
            r = _attempt(lambda: call_agent(self.host, requests.Release(token=self.hold_token)))
        except StepFailed as exc:
            self.say("lock", f"NOT released: {exc} (its holder ends by itself at its deadline)", exc.code,
                     numbered=False)
            return
        self.say("lock", self.words.release_line(r), r.code, numbered=False)

    def step_drain(self):
        if self.opts.no_drain:
            self.say("drain", "skipped (--no-drain)")
            return None
        url = self.drain_url or ""  # the step exists only with a URL (_steps)
        r = _attempt(lambda: phase_ops.drain(self.host, url, self.phase.drain_timeout,
                                             on_progress=lambda p: self.out("    " + self.words.drain_progress(p))))
        self.say("drain", self.words.drain_line(r), r.code)
        if r.code or not r.result.drained:
            return self.finish(codes.EXIT_GATE, "not drained: nothing stopped or started (--no-drain to go ahead)")
        return None

    def step_teardown(self):
        alias = self.host.alias
        def progress(p):  # one line (the view wrapped it to the screen): the task's out fits it, indented
            self.out("    " + " ".join(line.strip() for line in self.words.teardown_progress(alias, p).splitlines()))

        request = self.opts.teardown.replace(hold=(self.hold_seconds(), self.phase.name, self.hold_token))
        self.held = True  # until the answer says otherwise: a call cut off after its holder started is released too
        r = _attempt(lambda: teardown_op.on_host(self.host, request, on_progress=progress))  # audited there
        t: records.TeardownResult = r.result
        self.held = t.hold is not None
        self.say("teardown", self.words.teardown_brief(t), r.code)
        if t.hold is not None:
            self.out("    " + self.words.hold_line(t.hold))
        if not t.ran:  # locked by another teardown, or the host's state dir refused: nothing signalled
            return self.finish(r.code, "locked" if t.locked else "teardown not started: nothing started")
        for line in self.words.shm_lines(t):
            self.out("    " + self.words.safe(line))
        if r.code:
            for problem in t.problems:
                self.out("    " + self.words.safe(problem))
            return self.finish(r.code, "a GPU is not usable (health): nothing started" if r.code == codes.EXIT_UNHEALTHY
                               else "GPUs not free: nothing started")
        return None

    def step_probe(self):
        """verify --probe right after the teardown: a GPU that reads empty but cannot start CUDA
        (or whose fabric is not ready) stops the pivot here, before anything is started."""
        req = requests.Verify(wait=0.0, max_used_mib=self.opts.teardown.max_used_mib, probe_mib=self.host.probe_mib)
        r = _attempt(lambda: call_agent(self.host, req))
        self.say("probe", self.words.probe_line(r.result), r.code)
        if r.code:
            for problem in r.result.problems:
                self.out("    " + self.words.safe(problem))
            return self.finish(r.code, "a GPU is not usable: nothing started")
        return None

    def step_gates(self):
        r = _attempt(lambda: phase_ops.gates(self.host, self.phase))
        for line in self.words.gate_lines(r):
            self.out("    " + line)
        self.say("gates", "passed" if r.code == 0 else "FAILED: nothing started", r.code)
        if r.code:
            return self.finish(codes.EXIT_GATE, "a gate failed: nothing started")
        return None

    def step_deploy(self):
        r = _attempt(lambda: phase_ops.deploy(self.host, self.phase, "apply"))
        self.say("deploy", self.words.deploy_line(r), r.code)
        if r.code:
            return self.finish(codes.EXIT_GATE, "the deploy does not apply: nothing started")
        return None

    def step_lint(self):
        r = _attempt(lambda: phase_ops.lint(self.host, list(self.phase.argv), self.phase.gpus))
        for line in self.words.lint_lines(r):
            self.out("    " + line)
        if r.code and not self.opts.force:
            self.say("lint", "BLOCKED (use --force to start anyway)", r.code)
            verdict = "launch lint blocked the start: nothing started"
            if self.phase.is_deploy:
                undo = self._sub("restore", lambda: phase_ops.deploy(self.host, self.phase, "rollback"),
                                 lambda x: f"restored {', '.join(x.result.files) or '-'}")
                if undo:
                    verdict += "; the deploy's files could NOT be restored (see the restore step)"
            return self.finish(codes.EXIT_GATE, verdict)
        self.say("lint", "ok" if not r.code else "findings ignored (--force)")
        return None

    def step_start(self):
        r = _attempt(lambda: phase_ops.start(self.host, self.phase))
        self.say("start", self.words.start_line(r), r.code)
        if r.code:
            return self.finish(codes.EXIT_FAILED, "did not start")
        return None

    def step_prep(self):
        self.say("prep", f"{len(self.phase.prep)} job(s) started alongside")

    def step_ready(self):
        r = _attempt(lambda: phase_ops.ready(self.host, self.phase, self.ready_timeout,
                                             on_progress=self._ready_progress, intruders=True))
        intruders = r.result.intruders
        self.say("ready", self.words.ready_line(r), codes.EXIT_INTRUDER if intruders and not r.code else r.code)
        for line in self.words.intruder_lines(intruders):
            self.out("    " + self.words.safe(line))  # host text in it: escaped
        if intruders:
            self.record["intruders"] = intruders
        if r.code == 0 and intruders:
            return self.finish(codes.EXIT_INTRUDER, "ready, but a process outside the phase opened a GPU "
                                                    "after the teardown (named above): not the phase's")
        if r.code == 0:
            if not self.phase.smoke_url:
                self.release_hold()
            return None
        self.out("    " + self.words.log_tail(r).replace("\n", "\n    "))
        if self.phase.is_deploy:
            return self.rollback("the new server did not become ready")
        if intruders:
            return self.finish(codes.EXIT_INTRUDER, "not ready, and a process outside the phase opened a GPU "
                                                    "after the teardown (named above)")
        return self.finish(codes.EXIT_FAILED, "not ready")

    def _ready_progress(self, p: dict) -> None:
        self.out("    " + self.words.ready_progress(p))

    def step_smoke(self):
        r = _attempt(lambda: phase_ops.smoke(self.host, self.phase))
        self.say("smoke", self.words.smoke_line(r), r.code)
        if r.code == 0:
            self.release_hold()
            return None
        if self.phase.is_deploy:
            return self.rollback("the smoke request failed")
        return self.finish(codes.EXIT_FAILED, "smoke test failed")

    def step_prep_report(self):
        deadline = time.monotonic() + self.ready_timeout
        while True:
            r = _attempt(lambda: phase_ops.ready(self.host, self.phase, 0))
            if all(p["status"] != "running" for p in r.result.prep) or time.monotonic() > deadline:
                break
            time.sleep(1.0)
        for line in self.words.prep_lines(r):
            self.out("    " + line)
        prep = r.result.prep
        failed = [p for p in prep if p["exit"] != 0]
        self.say("prep-report", f"{len(prep) - len(failed)}/{len(prep)} preparation job(s) exited 0",
                 codes.EXIT_FAILED if failed else codes.EXIT_OK)
        if failed:
            return self.finish(codes.EXIT_FAILED, "a preparation job failed")
        return None

    # -- rollback: each part recorded with its exit; the verdict follows from them ---------
    def _sub(self, name: str, call, words) -> int:
        """One part of a rollback: run it, record 'rollback NAME' with its exit; returns the exit."""
        self.step_started = time.monotonic()
        try:
            r = _attempt(call)
        except StepFailed as exc:
            self.say(f"rollback {name}", f"ERROR: {exc}", exc.code, numbered=False)
            return exc.code
        self.say(f"rollback {name}", words(r), r.code, numbered=False)
        return r.code

    def rollback(self, why: str) -> int:
        self.out(f"    rolling back: {self.words.safe(why)}")
        parts = [
            ("stop", lambda: phase_ops.stop(self.host, self.phase, self.opts.operator), self.words.stop_line),
            ("restore", lambda: phase_ops.deploy(self.host, self.phase, "rollback"),
             lambda r: f"restored {', '.join(r.result.files) or '-'}" if r.code == 0 else self.words.deploy_line(r)),
            ("start", lambda: phase_ops.start(self.host, self.phase), self.words.start_line),
            ("ready", lambda: phase_ops.ready(self.host, self.phase, self.ready_timeout,
                                              on_progress=self._ready_progress), self.words.ready_line),
        ]
        for name, call, words in parts:
            code = self._sub(name, call, words)
            if code:
                later = [n for n, _, _ in parts[[p[0] for p in parts].index(name) + 1:]]
                skipped = f"; not tried: {', '.join(later)}" if later else ""
                return self.finish(code if code in (codes.EXIT_UNREACHABLE, codes.EXIT_TIMED_OUT)
                                   else codes.EXIT_FAILED,
                                   f"rollback FAILED at {name} (exit {code}) after {why}{skipped}")
        return self.finish(codes.EXIT_FAILED, f"rolled back ({why}); old server healthy again")


def phase_gate_texts(phase) -> list:
    """Each gate in words: a command as written, a file count as 'at least N files match GLOB'."""
    return [g if isinstance(g, str) else f"at least {dict(g)['min']} files match {dict(g)['glob']}"
            for g in phase.gates]


def _what_ran(step: str) -> str:
    before_teardown = step in ("drain", "teardown")
    return "nothing stopped or started" if step == "drain" else (
        "the teardown's result is unknown (see `invoke status`)" if before_teardown else "see the steps above")

