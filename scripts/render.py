"""Plain-text tables for people; --json output is produced elsewhere from the same data.

Why no dependency: the tables are simple, must paste cleanly into an incident channel, and
must never break a run on a host where a rendering library is missing.
"""
from __future__ import annotations

import re

_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def safe(text) -> str:
    """Text from a host (command lines, titles, errors) made safe for a terminal: control
    characters and bidi overrides become \\xNN / \\uNNNN, so a process titled with escape
    sequences cannot erase "NOT FREE" from the screen. The agent escapes too; this is the
    second line of defence for anything else a host sends."""
    return _UNSAFE.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 256 else f"\\u{ord(m.group()):04x}",
                       str(text))


def table(headers: list, rows: list, indent: str = "") -> str:
    cells = [[str(h) for h in headers]] + [["" if c is None else safe(c) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = []
    for n, row in enumerate(cells):
        lines.append(indent + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        if n == 0:
            lines.append(indent + "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def shorten(text: str, width: int = 60) -> str:
    text = safe(" ".join(str(text).split()))
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
