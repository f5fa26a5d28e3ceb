"""The words a pivot says each step's result in: the views' functions, handed to the pivot.

Why here: the pivot (scripts/ops/pivot.py) declares the words it needs (Words) and never
imports the views above it; the views render and import no operation. The task layer
sees both, so it puts them together; `invoke pivot` and `invoke start/stop/teardown` then
say a result the same way.
"""
from __future__ import annotations

from scripts.ops.pivot import Words
from scripts.views import (
                           gpu_settings as settings_view,
                           health as health_view,
                           phase as phase_view,
                           pivot as pivot_view,
                           teardown as teardown_view,
)
from scripts.views.render import safe

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
    step_table=pivot_view.step_table,
    settings_line=settings_view.settings_line,
    settings_lines=settings_view.settings_lines,
    hold_line=pivot_view.hold_line,
    release_line=pivot_view.release_line,
    intruder_lines=pivot_view.intruder_lines,
)
