"""A pivot's words: each step's result as the phase and teardown views say it, and the table
of its steps at the end.

Why here: the pivot (scripts/ops/pivot.py) runs the steps and is below the views; the task
hands it these words (WORDS), so `invoke pivot` and `invoke start/stop/teardown` say a result
the same way.
"""
from __future__ import annotations

from ..ops.pivot import Words
from . import gpu_settings as settings_view, health as health_view, phase as phase_view, teardown as teardown_view
from .render import Col, safe, table


def step_table(steps: list) -> str:
    """The pivot's steps as a table: step, result, exit, seconds."""
    rows = [[s["step"], s["result"], str(s["exit"]), f"{s['seconds']:.2f}"] for s in steps]
    return table(["step", Col("result", "wrap", 24), "exit", "seconds"], rows)  # a long result wraps to COLUMNS


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
)
