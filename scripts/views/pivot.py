"""A pivot's own words: the table of its steps at the end, the lock it holds and releases,
and the intruders a new phase met.

Why here: the pivot (scripts/ops/pivot.py) runs the steps and is below the views; the task
hands it these with the phase and teardown views' words (scripts/cli/pivot_words.py).
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ..agent.wire import records
from .render import Col, command, record, table

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
