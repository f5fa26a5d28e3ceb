"""Render `invoke reset`: each precondition with its answer, the command, what happened.

Why its own view: the reset is the one task that can take a GPU (and, through NVLink, its
peers) away from everything on it, so the operator must see every check it made and the
exact command before anything runs, and the same lines after it ran.
"""
from __future__ import annotations

from ..agent.wire import records
from .render import Col, safe, safe_lines, shown, table


def report(alias: str, r: records.ResetResult) -> str:
    output = r.output  # a command's output: its lines kept, each escaped (safe_lines)
    r = shown(r)  # every other host string escaped (render.shown)
    rows = [["ok" if c["ok"] else "NO", c["check"], c["detail"]] for c in r.checks]
    cmd = " ".join(safe(a) for a in r.command)
    if r.ran:
        head = f"ran: {cmd}"
    elif r.ready:
        head = f"would run: {cmd}   (dry run: add --yes to run it)"
    else:
        head = f"refused: {cmd} was NOT run"
    checks = table(["", "precondition", Col("detail", "wrap", 24)], rows, "  ")  # a long detail wraps
    lines = [f"== {alias} ({r.hostname}) GPU {r.gpu}", checks, head]
    if output:
        lines.append("  " + safe_lines(output).replace("\n", "\n  "))
    if r.note:
        lines.append(safe(r.note))
    return "\n".join(lines)
