"""A pivot's words: each step's result as the phase and teardown views say it, and the table
of its steps at the end.

Why here: the pivot (scripts/ops/pivot.py) runs the steps and is below the views; the task
hands it these words (WORDS), so `invoke pivot` and `invoke start/stop/teardown` say a result
the same way.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ..agent.wire import records
from ..ops.pivot import Words
from . import gpu_settings as settings_view, health as health_view, phase as phase_view, teardown as teardown_view
from .render import Col, command, record, safe, table

if TYPE_CHECKING:
    from ..agent.wire.rows import LockHold


def step_table(steps: list) -> str:
    """The pivot's steps as a table: step, result, exit, seconds."""
    rows = [[s["step"], s["result"], str(s["exit"]), f"{s['seconds']:.2f}"] for s in steps]
    return table(["step", Col("result", "wrap", 24), "exit", "seconds"], rows)  # a long result wraps to COLUMNS


def _clock(epoch) -> str:
    try:
        return time.strftime("%H:%M:%S", time.localtime(float(epoch)))
    except (TypeError, ValueError, OverflowError, OSError):
        return "?"


def hold_line(hold: LockHold) -> str:
    """The lock the pivot keeps from its teardown until its phase is ready, as its text says."""
    return (f"lock: kept for phase {hold.get('phase')} until it is ready (holder pid {hold.get('pid')}; "
            f"ends by itself at {_clock(hold.get('until'))})")


def release_line(x) -> str:
    r: records.ReleaseResult = record(x)
    if r.released:
        return f"released (held {r.held_s}s)" if r.held_s is not None else "released"
    return r.error or r.note or "not released"


def intruder_lines(intruders: list) -> list:
    """Each process outside the new phase that held a GPU after the teardown: pid, user, devices,
    command (nothing was signalled)."""
    return [f"INTRUDER pid {i['pid']} ({i.get('user')}) holds {', '.join(i.get('devices') or []) or 'GPU memory'}: "
            f"{command(i, 60)}" for i in intruders]


WORDS = Words(
    safe=safe,
    drain_progress=phase_view.drain_progress,
    drain_line=phase_view.drain_line,
    teardown_progress=teardown_view.progress_line,
    teardown_brief=teardown_view.brief,
    shm_lines=teardown_view.shm_lines,
    probe_line=health_view.probe_line,
    gate_lines=phase_view.gate_lines,
    deploy_line=phase_view.deploy_line,
    lint_lines=phase_view.lint_lines,
    start_line=phase_view.start_line,
    ready_line=phase_view.ready_line,
    ready_progress=phase_view.ready_progress,
    log_tail=phase_view.log_tail,
    smoke_line=phase_view.smoke_line,
    prep_lines=phase_view.prep_lines,
    stop_line=phase_view.stop_line,
    step_table=step_table,
    settings_line=settings_view.settings_line,
    settings_lines=settings_view.settings_lines,
    hold_line=hold_line,
    release_line=release_line,
    intruder_lines=intruder_lines,
)
