"""Render `invoke reset`: each precondition with its answer, the command, what happened.

Why its own view: the reset is the one task that can take a GPU (and, through NVLink, its
peers) away from everything on it, so the operator must see every check it made and the
exact command before anything runs, and the same lines after it ran.
"""
from __future__ import annotations

from ..agent.wire import codes, records
from .render import Col, note as wrap, safe, safe_lines, shown, table


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
    lines = [f"== {alias} ({r.hostname}) GPU {r.gpu}", checks, *quiesce_lines(r), head]
    if output:
        lines.append("  " + safe_lines(output).replace("\n", "\n  "))
    if r.note:
        lines.append(safe(r.note))
    if r.code == codes.EXIT_REBOOT_NEEDED:
        lines.append(f"REBOOT NEEDED: GPU {r.gpu} could not be reset with nothing blocking it; see runbooks/"
                     "gpu-unusable-after-teardown.md (reset, then reboot)")
    return "\n".join(lines)


def quiesce_lines(r: records.ResetResult) -> list:
    """--quiesce: the daemons it stops (a dry run: would stop), each step it took, in order,
    and the GPU's health read again after the reset."""
    q = r.quiesce
    if not q:
        return []
    if not q.get("steps"):
        daemons = q.get("daemons") or []
        return [wrap(f"would stop: {d['unit']} ({d['name']}) and start it again after", indent="  ")
                for d in daemons] or ["  no daemon that blocks a reset runs (persistence mode is still checked)"]
    lines = [wrap(f"{i}. {step}", indent="  ", hang="     ") for i, step in enumerate(q["steps"], 1)]
    h = q.get("health") or {}
    if h:
        lines.append(wrap(f"health after: {h.get('verdict')}" + (f" ({'; '.join(h.get('reasons') or [])})"
                                                                  if h.get("reasons") else ""), indent="  "))
    return lines
