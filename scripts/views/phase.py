"""Render phase results for people: start, ready, stop, gates, deploy, lint, drain, smoke.

Why one module: `invoke start/stop/lint-launch` and each step of `invoke pivot` show the
same results; one renderer per result type keeps their words the same. Each function takes
the contract's record (AgentResult.result, e.g. records.StartResult) or the AgentResult.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..agent.wire import records
from .render import record, shorten, shown

if TYPE_CHECKING:
    from ..agent.wire.rows import PhaseState


def start_line(x) -> str:
    """'started via setsid (pid 812, log /run/gpu-pivot/phase-train.log)' or 'FAILED: why'."""
    r: records.StartResult = record(x)
    if not r.started:
        return f"FAILED: {r.error}"
    st: PhaseState = r.state or {}  # a started phase has one (records.read)
    return f"started via {st['how']} ({st.get('unit') or 'pid %s, log %s' % (st['pid'], st['log'])})"


def stop_line(x) -> str:
    r: records.StopResult = record(x)
    if r.note and not r.stopped:
        return r.note
    if not r.stopped and not r.left:  # a second `stop`: say so, not "stopped []"
        return "nothing to stop: no process of the phase was running"
    from .teardown import checkpoint_result

    return (f"stopped {r.stopped}" + (f", still alive {r.left}" if r.left else "") + (f"; {r.note}" if r.note else "")
            + "".join(f"; {checkpoint_result(c)}" for c in r.checkpoint_stops))


def ready_line(x) -> str:
    r: records.ReadyResult = record(x)
    if r.ready:
        return f"ready after {r.waited_s}s ({r.detail})"
    return f"NOT READY after {r.waited_s}s: {r.detail}"


def ready_progress(p: dict) -> str:
    """A progress line of phase-ready (the fields of frame.parse_progress): the log's last line
    after `| log: ` only where the log has one (an empty `log: ` read as a log cut off)."""
    p = shown(p)
    last = " ".join(str(p.get("last_log") or "").split())
    return f"waiting {p['elapsed_s']:.0f}s: {p['detail']}" + (f" | log: {shorten(last, 70)}" if last else "")


def log_tail(x) -> str:
    r: records.ReadyResult = record(x)
    return "log tail:\n" + "\n".join("  " + line for line in r.log_tail)


def prep_lines(x) -> list:
    """One line per preparation job: its status and command."""
    r: records.ReadyResult = record(x)
    return [f"{p['status']:>10}  {shorten(p['cmd'], 70)}" for p in r.prep]


def gate_lines(x) -> list:
    r: records.GatesResult = record(x)
    return [f"{'ok  ' if g['ok'] else 'FAIL'} {g['gate']} ({g['detail']})" for g in r.gates]


def deploy_line(x) -> str:
    r: records.DeployResult = record(x)
    return f"{r.detail}: {', '.join(r.files) or '-'}"


def lint_lines(x) -> list:
    """'check: message' per finding; none when the launch command is clean."""
    r: records.LintResult = record(x)
    return [f"{f['check']}: {f['message']}" for f in r.findings]


def lint_ok(x) -> str:
    r: records.LintResult = record(x)
    return f"launch command OK ({r.gpus_visible} GPU(s) visible)"


def drain_line(x) -> str:
    r: records.DrainResult = record(x)
    if r.note:
        return r.note
    if r.drained:
        return f"drained in {r.waited_s}s"
    return f"NOT drained: still {r.running:g} in flight after {r.waited_s}s"


def drain_progress(p: dict) -> str:
    return f"draining: {p['running']:g} request(s) in flight ({p['elapsed_s']}s)"


def smoke_line(x) -> str:
    r: records.SmokeResult = record(x)
    return f"HTTP {r.status}: {shorten(r.body, 60)}" if r.ok else f"FAILED: {r.error}"
