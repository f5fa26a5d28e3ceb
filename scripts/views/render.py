"""Plain-text tables for people; --json output is produced elsewhere from the same data.

Why no dependency (rich was considered): the tables must paste cleanly into an incident
channel, keep one process per line for grep and awk (rich wraps a long cell over several
lines of box drawing), and never break a run on a machine where a rendering library is
missing. What they need is small and here: fit the width (`COLUMNS`, else the terminal's),
name each process by what it runs (`command`), and colour three verdict words on a
terminal only (`paint`).
"""
from __future__ import annotations

import os
import re
import shlex
import sys
import textwrap
from typing import TYPE_CHECKING

from ..agent.policy import program
from ..agent.procs import textsafe
from ..agent.wire import records

if TYPE_CHECKING:
    from ..agent.wire.rows import ProcessRow

_ANSI = re.compile("\x1b\\[[0-9;]*m")
DEFAULT_WIDTH = 100  # neither COLUMNS nor a terminal (a pipe, a file, a CI log)
ELLIPSIS = "..."


def safe(text) -> str:
    """Text from a host (command lines, titles, file, unit and user names, errors) as one line
    safe for a terminal: control characters (newline and tab too), bidi overrides and
    zero-width marks become \\xNN / \\uNNNN (textsafe.printable: the one rule, the
    agent's too), so a process titled with escape sequences cannot erase "NOT FREE" from the
    screen, nor a title with a newline forge a line of its own."""
    return textsafe.printable(text)


def safe_lines(text) -> str:
    """Several lines a host wrote (a command's output), each made safe; its newlines kept."""
    return "\n".join(safe(line) for line in str(text).split("\n"))


def shown(x):
    """A display copy of a record, document or progress line: every string in it through
    safe(), keys included; numbers, booleans and None as they are. The views render from
    this copy (render.record: status_view, teardown_view, health_view, phase_view), so no string a
    host sent reaches a line raw, whichever f-string prints it; --json and the audit log keep
    the originals."""
    if isinstance(x, str):
        return safe(x)
    if isinstance(x, records.Record):
        return type(x)(**{k: shown(v) for k, v in vars(x).items()})
    if isinstance(x, dict):
        return {shown(k): shown(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(shown(v) for v in x)
    return x


def record(x):
    """The contract's record in `x`, as a view shows it: a display copy (shown: every host
    string escaped). `x` is a record (records.ScanResult, TeardownResult, ...), what carries
    one as `result` (transport.AgentResult), or an agent document (a dict, as --json prints
    it, which names its command) read with records.read_document. The one way every view
    (status_view, health_view, teardown_view, phase_view) takes its input."""
    x = getattr(x, "result", x)
    return shown(records.read_document(x) if isinstance(x, dict) else x)


# -- width and colour ---------------------------------------------------------------------------


def width() -> int:
    """Columns to fit: `COLUMNS` when it is a positive number, else the terminal's, else 100.

    A terminal that reports 0 columns (a serial or IPMI console, `script`, `kubectl exec`)
    does not know its width: 0 is read as unknown, not as a screen no table fits."""
    try:
        cols = int(os.environ.get("COLUMNS", ""))
        if cols > 0:
            return cols
    except ValueError:
        pass
    try:
        cols = os.get_terminal_size(sys.stdout.fileno()).columns
    except (OSError, ValueError, AttributeError):
        return DEFAULT_WIDTH
    return cols if cols > 0 else DEFAULT_WIDTH


def colour_on(stream=None) -> bool:
    """Colour only on a terminal, and never with NO_COLOR set (https://no-color.org) or TERM=dumb."""
    stream = sys.stdout if stream is None else stream
    if os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return False
    return _isatty(stream)


_COLOURS = {"NOT FREE": "1;31", "PROTECTED": "1;33", "FREED": "1;32", "FREE": "1;32"}
_WORDS = re.compile(r"\b(NOT FREE|PROTECTED|FREED|FREE)\b")


def paint(text: str, stream=None) -> str:
    """`text` with NOT FREE in red, PROTECTED in yellow, FREE/FREED in green, on a terminal only.

    Applied to whole lines after the layout (colour codes take no columns), so a table is
    laid out the same with colour or without."""
    if not colour_on(stream):
        return text

    def one(m: re.Match) -> str:
        # "NOT FREE" must not have its FREE coloured twice: the alternation tries it first
        return f"\x1b[{_COLOURS[m.group(1)]}m{m.group(1)}\x1b[0m"

    return _WORDS.sub(one, text)


def visible_len(text: str) -> int:
    return len(_ANSI.sub("", text))


class Progress:
    """Progress for people while something waits: one line rewritten in place on a terminal,
    a line per update elsewhere (a pipe or a CI log keeps every step, with no \\r in it).

    `live=False` (several hosts at once) prints a line per update on a terminal too:
    several live lines would overwrite each other."""

    def __init__(self, stream=None, live: bool = True):
        self.stream = sys.stdout if stream is None else stream
        self.live = live and _isatty(self.stream) and os.environ.get("TERM") != "dumb"  # \x1b[K erases the rest
        self.shown = False

    def update(self, text: str) -> None:
        if self.live:
            self.stream.write("\r" + text[: max(1, width() - 1)] + "\x1b[K")
            self.shown = True
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def done(self) -> None:
        """End the live line (so what is printed next starts on a line of its own)."""
        if self.shown:
            self.stream.write("\n")
            self.stream.flush()
            self.shown = False


def _isatty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


# -- what identifies a process ------------------------------------------------------------------
# The arguments that tell one server or job from another: shown first when a line is short.
KEY_FLAGS = ("--model-path", "--model", "--port", "--tp", "--tp-size", "--tensor-parallel-size",
             "--nproc-per-node", "--nproc_per_node", "--served-model-name", "--speculative-algorithm",
             "--config", "--data", "--speculative-draft-model-path")


def _groups(args: list) -> list:
    """Arguments in groups that belong together: `--port 30000`, `--x=1`, a positional."""
    out, i = [], 0
    while i < len(args):
        arg = args[i]
        if arg.startswith("-") and "=" not in arg and i + 1 < len(args) and not args[i + 1].startswith("-"):
            out.append([arg, args[i + 1]])
            i += 2
        else:
            out.append([arg])
            i += 1
    return out


def _word(arg: str) -> str:
    """One argument as a shell would need it: quoted when it has spaces (a `sh -c` script)."""
    return shlex.quote(arg) if any(c.isspace() for c in arg) or not arg else arg


def _rank(group: list, positional_seen: int) -> int | None:
    """How much an argument group tells this process apart: 0 first; None for the rest."""
    head = group[0]
    if not head.startswith("-"):
        return 0 if positional_seen < 2 else None  # a subcommand, or the script / model a program is given
    flag = head.split("=", 1)[0]
    return 1 + KEY_FLAGS.index(flag) if flag in KEY_FLAGS else None


class Command:
    """A process's command line as a table shows it: its program and key arguments first.

    str() is the whole command without the interpreter's path; fit(n) keeps the program
    and the arguments that identify it (model, port, TP, a subcommand) within n columns,
    dropping the others as `...`."""

    def __init__(self, argv=None, cmdline: str = ""):
        argv = [safe(a) for a in (argv or []) if a is not None] or safe(cmdline).split()
        self.program, args = program.program_of(argv) if argv else (["?"], [])
        self.groups = [[_word(w) for w in g] for g in _groups(args)]
        positional, ranks = 0, []
        for n, g in enumerate(self.groups):
            ranks.append((_rank(g, positional), n))
            positional += not g[0].startswith("-")
        # the order in which groups are kept when not all fit: key ones by rank, then the rest
        self.order = [n for r, n in sorted(x for x in ranks if x[0] is not None)] + \
            [n for r, n in ranks if r is None]

    @classmethod
    def of(cls, record: ProcessRow) -> Command:
        """From a process record of the agent (holder, target, action): argv when it has one."""
        return cls(record.get("argv"), record.get("cmdline") or "")

    def __str__(self) -> str:
        return " ".join(self.program + [w for g in self.groups for w in g])

    def _short(self, keep: list) -> str:
        """The kept groups in their own order (never reordered: `sh -c 'trap …'` stays readable)."""
        return " ".join(self.program + [w for i in sorted(keep) for w in self.groups[i]] + [ELLIPSIS])

    def fit(self, n: int) -> str:
        """Within n columns: the whole command, else the program, then the most telling
        arguments that still fit (in that order), then `...` for the ones left out."""
        full = str(self)
        if len(full) <= n:
            return full
        keep: list = []
        for i in self.order:
            if len(self._short(keep + [i])) <= n:
                keep.append(i)
        text = self._short(keep)
        return text if len(text) <= n else text[: max(1, n - len(ELLIPSIS))] + ELLIPSIS


def command(record: ProcessRow, n: int | None = None) -> str:
    """A record's command (see Command), cut to n columns when n is given."""
    c = Command.of(record)
    return str(c) if n is None else c.fit(n)


# -- tables -------------------------------------------------------------------------------------


class Col:
    """A table column: its header, and how it gives way when the table is wider than the screen.

    fit: None keeps every cell whole; "command" shortens Command cells (Command.fit); "wrap"
    wraps text onto more lines (reasons are never cut); "cut" cuts with `...`.
    optional: the column is left out when no row has anything in it but '-'."""

    def __init__(self, header: str, fit: str | None = None, minimum: int = 12, optional: bool = False):
        self.header, self.fit, self.minimum, self.optional = header, fit, minimum, optional


def _as_col(h) -> Col:
    return h if isinstance(h, Col) else Col(str(h))


def _text(cell) -> str:
    if cell is None:
        return ""
    return str(cell) if isinstance(cell, Command) else safe(cell)


# A column that gives way is never narrower than this (or its header) when the screen is
# narrow; a table's last column narrower than UNDER_BELOW (a command cut inside its program's
# name) goes on a line of its own under each row instead.
NARROWEST = 8
UNDER_BELOW = 20


def _shrink(widths: list, floors: dict, room: int) -> list:
    """`widths` with the columns of `floors` ({index: narrowest}) shrunk, in proportion to what
    each can give, until the row fits `room` columns or they are at their floors."""
    excess = sum(widths) + 2 * (len(widths) - 1) - room
    give = {i: widths[i] - f for i, f in floors.items() if widths[i] > f}
    total = sum(give.values())
    if excess <= 0 or not total:
        return widths
    out = list(widths)
    for i, g in give.items():
        out[i] = widths[i] - min(g, -(-excess * g // total))  # ceil: never overshoot room
    return out


def _header_word(header: str) -> int:
    """The narrowest a header can be: its longest word (it wraps at its spaces)."""
    return max((len(w) for w in header.split()), default=0)


def _widths(cols: list, cells: list, room: int) -> list:
    """Each column's width (cells[0]: the headers): natural, then, until the row fits `room`
    columns, the flexible columns shrunk (not below their minimum or header, in proportion to
    what each can give); on a screen still too narrow, a header wider than its cells wrapped
    at its spaces (`used before` over two lines: nothing is lost), then the flexible columns
    down to NARROWEST. Columns that identify a row (no Col.fit: pid, user, state) never
    shrink below their cells."""
    body = [max((visible_len(r[i]) for r in cells[1:]), default=0) for i in range(len(cols))]
    natural = [max(b, visible_len(c.header)) for b, c in zip(body, cols, strict=True)]
    flex = [i for i, c in enumerate(cols) if c.fit]
    out = _shrink(natural, {i: max(cols[i].minimum, len(cols[i].header)) for i in flex}, room)
    out = _shrink(out, {i: max(body[i] if i not in flex else min(out[i], cols[i].minimum), _header_word(c.header))
                        for i, c in enumerate(cols)}, room)
    return _shrink(out, {i: max(min(cols[i].minimum, NARROWEST), _header_word(cols[i].header)) for i in flex}, room)


def _header_lines(cols: list, widths: list) -> list:
    """The header row, over as many lines as its wrapped headers need, aligned at the bottom:
    the line above the rule names every column."""
    parts = [textwrap.wrap(c.header, w) if len(c.header) > w else [c.header] for c, w in zip(cols, widths, strict=True)]
    depth = max(len(p) for p in parts)
    parts = [[""] * (depth - len(p)) + p for p in parts]
    return ["  ".join(p[k].ljust(w) for p, w in zip(parts, widths, strict=True)).rstrip() for k in range(depth)]


_ESCAPE = re.compile(r"\\(x|u)")
_ESCAPE_END = re.compile(r"(\\x[0-9a-f]{0,2}|\\u[0-9a-f]{0,4}|\\)$")


class _Wrapper(textwrap.TextWrapper):
    """textwrap, except that a word too long for the width is never cut inside an escape
    (textsafe's \\xNN, \\uNNNN) nor just after one: a newline in a host string is shown
    as \\x0a, and cut there the text that followed it would start a line of its own, as a
    forged `local: FREED` line would."""

    def _handle_long_word(self, reversed_chunks, cur_line, cur_len, width):
        chunk = reversed_chunks[-1]
        room = max(width - cur_len, 1)
        if not self.break_long_words or len(chunk) <= room:
            super()._handle_long_word(reversed_chunks, cur_line, cur_len, width)
            return
        # a path is cut after a / when one fits (`/dev/` over `nvidia*`), not inside a name of it
        slash = chunk.rfind("/", 1, room)
        cut = slash + 1 if slash > 0 else room
        while cut > 0:
            tail = _ESCAPE_END.search(chunk[:cut])
            if tail is None:
                break
            cut = tail.start()
        if cut == 0 and not cur_line:  # escapes from the start: cut before the last that begins after it
            starts = [m.start() for m in _ESCAPE.finditer(chunk, 1, room)]
            cut = starts[-1] if starts else room
        if cut:
            cur_line.append(chunk[:cut])
            reversed_chunks[-1] = chunk[cut:]


def wrap(text: str, width: int, **options) -> list:
    """textwrap.wrap (never at a hyphen) with the escape rule of _Wrapper."""
    return _Wrapper(width, break_on_hyphens=False, **options).wrap(text)


def _cell_lines(col: Col, cell, text: str, w: int) -> list:
    if visible_len(text) <= w:
        return [text]
    if col.fit == "command" and isinstance(cell, Command):
        return [cell.fit(w)]
    if col.fit == "wrap":
        return wrap(text, w) or [""]
    if col.fit:
        return [text[: max(1, w - len(ELLIPSIS))] + ELLIPSIS]
    return [text]


def table(headers: list | tuple, rows: list, indent: str = "", columns: int | None = None,
          details: list | None = None) -> str:
    """Rows under a header line and a rule, fitted to `columns` (default: width()).

    A header is a name or a Col; a Command cell is shown by what it runs. Only columns
    that may give way (Col.fit) ever shrink; what does not fit is wrapped or shortened,
    never silently cut off at the screen's edge. On a screen too narrow even for that (a
    split pane of 60 columns), a last column that may give way (a command) and would get
    fewer than UNDER_BELOW columns is printed on a line of its own under each row, indented,
    and its header under the header line. details[i], when given, is printed whole
    (wrapped, never cut) under row i from where its last column starts: a reason in words
    gets the width of the screen instead of a narrow column."""
    cols = [_as_col(h) for h in headers]
    rows = [list(r) for r in rows]
    keep = [i for i, c in enumerate(cols)
            if not (c.optional and all(_text(r[i]) in ("", "-") for r in rows))]
    cols, rows = [cols[i] for i in keep], [[r[i] for i in keep] for r in rows]
    texts = [[c.header for c in cols]] + [[_text(c) for c in r] for r in rows]
    room = (width() if columns is None else columns) - len(indent)
    widths = _widths(cols, texts, room)
    # the last columns, when they go on a line of their own under each row: the last one when
    # it would be too narrow to read, then, while the row is still too wide, the one before it
    under: list = []  # [(col, cells, texts)], in table order
    last = max(visible_len(t[-1]) for t in texts)
    if len(cols) > 1 and cols[-1].fit and widths[-1] < min(last, cols[-1].minimum, UNDER_BELOW):
        under.insert(0, (cols.pop(), [r.pop() for r in rows], [t.pop() for t in texts]))
        widths = _widths(cols, texts, room)
    while len(cols) > 1 and cols[-1].fit and sum(widths) + 2 * (len(widths) - 1) > room:
        under.insert(0, (cols.pop(), [r.pop() for r in rows], [t.pop() for t in texts]))
        widths = _widths(cols, texts, room)
    lines = [indent + h for h in _header_lines(cols, widths)]
    if under:
        lines.append(indent + UNDER + "  ".join(u[0].header for u in under))
    lines.append(indent + "  ".join("-" * w for w in widths))
    at = len(UNDER) if under else sum(widths[:-1]) + 2 * (len(widths) - 1)  # where the last column starts
    if room - at < 30:  # a reason in words needs more than the last column of a narrow screen
        at = len(UNDER)
    for n, (row, text) in enumerate(zip(rows, texts[1:], strict=True)):
        parts = [_cell_lines(c, cell, t, w) for c, cell, t, w in zip(cols, row, text, widths, strict=True)]
        for k in range(max(len(p) for p in parts)):
            cells = [p[k] if k < len(p) else "" for p in parts]
            lines.append(indent + "  ".join(c + " " * (w - visible_len(c))
                                            for c, w in zip(cells, widths, strict=True)).rstrip())
        if under:
            lines.extend(indent + UNDER + x for x in _under_lines(under, n, room - len(UNDER)))
        detail = details[n] if details else None
        if detail:
            lines.extend(indent + " " * at + d
                         for d in wrap(safe(detail), max(20, room - at)))
    return "\n".join(lines)


UNDER = "    "  # the indent of a last column (and reasons) printed under its row on a narrow screen


def _under_lines(under: list, n: int, room: int) -> list:
    """Row n's cells of the columns printed under it, on one line when they fit: the ones
    before the last whole (wrapped if need be), the last (a command) fitted to what is left."""
    lead = "  ".join(u[2][n + 1] for u in under[:-1])
    col, cells, texts = under[-1]
    if lead and visible_len(lead) + 2 + min(visible_len(texts[n + 1]), UNDER_BELOW) > room:
        head = wrap(lead, max(1, room)) or [""]
        return head + _cell_lines(col, cells[n], texts[n + 1], max(1, room))
    prefix = lead + "  " if lead else ""
    tail = _cell_lines(col, cells[n], texts[n + 1], max(1, room - len(prefix)))
    return [prefix + tail[0]] + [" " * len(prefix) + x for x in tail[1:]]


def note(text: str, indent: str = "  ", hang: str = "    ") -> str:
    """One note (a rule, a warning) as lines that fit width(): words are never cut, the lines
    after the first are indented by `hang`."""
    return "\n".join(wrap(safe(text), max(20, width()), initial_indent=indent, subsequent_indent=hang,
                           break_long_words=False)) or indent


def fit(text: str, hang: str = "    ") -> str:
    """Each line of `text` (already safe: this escapes nothing) that is wider than width()
    wrapped between words, its later lines indented by its own indent plus `hang`; a line
    that fits, a table's included, is kept as it is. Why: a line that runs past the screen
    is cut or folded by the terminal mid-number (a pid, a port), and a word is never cut
    here: a path or a number longer than the screen stays whole on a line of its own."""
    room, out = max(20, width()), []
    for line in text.split("\n"):
        if visible_len(line) <= room:
            out.append(line)
            continue
        lead = line[:len(line) - len(line.lstrip())]
        out.extend(wrap(line.lstrip(), room, initial_indent=lead, subsequent_indent=lead + hang,
                        break_long_words=False) or [line])
    return "\n".join(out)


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
