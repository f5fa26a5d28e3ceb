"""Plain-text tables for people; --json output is produced elsewhere from the same data.

Why no dependency: the tables are simple, must paste cleanly into an incident channel, and
must never break a run on a host where a rendering library is missing.
"""
from __future__ import annotations


def table(headers: list, rows: list, indent: str = "") -> str:
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = []
    for n, row in enumerate(cells):
        lines.append(indent + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        if n == 0:
            lines.append(indent + "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def shorten(text: str, width: int = 60) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[: width - 3] + "..."


def age(seconds) -> str:
    """'45s', '12m', '3h', '2d': coarse on purpose, a table column not a timer."""
    if seconds is None:
        return "?"
    s = int(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{s // size}{unit}"
    return f"{s}s"
