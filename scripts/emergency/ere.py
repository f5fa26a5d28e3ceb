"""A host's TARGETS / PROTECT regex (Python `re`, as the agent reads it) as a POSIX ERE for the
emergency one-liner's `grep -E`, or a refusal naming the value.

Why a translation and not the text as typed: the one-liner runs where Python may be missing, so
it matches with `grep -E`, and the two dialects read some text differently: `\\d` is a digit in
Python and undefined in ERE, `[\\.]` is a dot in Python and a backslash or a dot in ERE,
`(?:...)` is a group in Python and an error in ERE, `{,3}` is 0-3 in Python. A pattern passed as
typed would quietly match something else on the host, and a PROTECT that matches less kills
what the host protects. So each construct is rewritten to the ERE that matches the same text, and
what ERE cannot say (lookarounds, backreferences, word boundaries, `\\A`/`\\Z`, inline flags,
possessive quantifiers, text outside printable ASCII) is refused with one line, before any line
is printed. Laziness (`*?`) is dropped: it changes which match is found, never whether one is.
`grep -E` runs under LC_ALL=C in the script, so ranges and classes are byte ranges.
"""
from __future__ import annotations

import re

from ..config.errors import ConfigError, show

ERE_SPECIAL = set(".[]()*+?{|^$\\")
RE_DUP_MAX = 255  # the largest count POSIX promises a `{m,n}` may use
_OUTSIDE = {"d": "[0-9]", "D": "[^0-9]", "s": "[[:space:]]", "S": "[^[:space:]]", "w": "[[:alnum:]_]",
            "W": "[^[:alnum:]_]"}
_INSIDE = {"d": "0-9", "s": "[:space:]", "w": "[:alnum:]_"}
_COUNT = re.compile(r"\{([0-9]*)(,?)([0-9]*)\}")


class NotERE(ValueError):
    """The construct a POSIX ERE cannot say (the caller names the key and value)."""


def alternatives(key: str, pattern: str) -> list:
    """[(python_alternative, ere_alternative)] for each top-level alternative of `pattern`,
    translated; raises ConfigError naming `key` and the value when any part cannot be."""
    try:
        return _Translator(pattern).run()
    except NotERE as exc:
        raise ConfigError(f"{key}={show(pattern)}: the emergency one-liner matches with POSIX grep -E, which "
                          f"cannot express {exc}; write the pattern without it") from None


def to_ere(key: str, pattern: str) -> str:
    """The whole pattern as one ERE (PROTECT: searched in a command line)."""
    return "|".join(ere for _, ere in alternatives(key, pattern))


class _Translator:
    def __init__(self, pattern: str):
        self.p, self.i = pattern, 0
        self.out: list = []
        self.alts: list = []
        self.start = 0  # where the current top-level alternative began in the pattern
        self.depth = 0
        self.anchored: list = []  # for each open group: does it hold an anchor

    def run(self) -> list:
        p = self.p
        for ch in p:
            if not (" " <= ch <= "~"):
                raise NotERE(f"the character {ch!r} (only printable ASCII reads the same in every locale)")
        while self.i < len(p):
            self.step(p[self.i])
        self.end_alternative(len(p))
        return self.alts

    def end_alternative(self, at: int) -> None:
        if not self.out:
            raise NotERE("an empty alternative")
        self.alts.append((self.p[self.start:at], "".join(self.out)))
        self.out, self.start = [], at + 1

    def step(self, ch: str) -> None:  # noqa: PLR0912 - one branch per construct of the syntax
        p = self.p
        if ch == "\\":
            self.out.append(self.escape(p[self.i + 1:self.i + 2]))
            self.i += 2
        elif ch == "[":
            self.out.append(self.bracket())
        elif ch == "(":
            if p.startswith("(?:", self.i):
                self.i += 3
            elif p.startswith("(?", self.i):
                raise NotERE(f"the group {p[self.i:self.i + 3]!r}... (a lookaround, a named group or a flag)")
            else:
                self.i += 1
            if p[self.i:self.i + 1] in (")", "|"):
                raise NotERE("an empty group or alternative")
            self.out.append("(")
            self.depth += 1
            self.anchored.append(False)
        elif ch == ")":
            self.out.append(")")
            self.depth -= 1
            self.i += 1
            if self.anchored.pop() and self.p[self.i:self.i + 1] in ("*", "+", "?", "{"):
                raise NotERE("a quantifier on a group that holds an anchor")
        elif ch == "|":
            if self.depth == 0:
                self.end_alternative(self.i)
            elif self.out[-1] == "(" or p[self.i + 1:self.i + 2] in (")", "|"):
                raise NotERE("an empty group or alternative")
            else:
                self.out.append("|")
            self.i += 1
        elif ch in "*+?":
            self.out.append(ch)
            self.i += 1
            self.lazy_or_possessive()
        elif ch == "{":
            self.count()
        elif ch in "^$":
            self.anchor(ch)
        else:  # `.` reads the same; `]` and `}` outside a class are plain text in both
            self.out.append(ch)
            self.i += 1

    def anchor(self, ch: str) -> None:
        """`^` only where nothing can come before it in a top-level alternative (after its opening
        groups), `$` only where nothing can come after it (before the groups it closes), and no
        quantifier on either or on a group holding one: elsewhere an anchor can never match a line,
        or the regex libraries disagree (GNU grep 3.8 matches `^$` then an escaped dot against a
        lone dot; glibc's regexec and Python differ on anchors inside repeated alternations)."""
        p, i = self.p, self.i
        if p[i + 1:i + 2] in ("*", "+", "?", "{"):
            raise NotERE(f"a quantifier after the anchor {ch!r}")
        if ch == "^" and any(t not in ("(", "^") for t in self.out):
            raise NotERE("'^' with pattern text before it in its alternative")
        if ch == "$":
            j, depth = i + 1, self.depth
            while j < len(p) and p[j] in ")$":
                depth -= p[j] == ")"
                j += 1
            if j < len(p) and not (p[j] == "|" and depth == 0):
                raise NotERE("'$' with pattern text after it in its alternative")
        self.anchored = [True] * len(self.anchored)
        self.out.append(ch)
        self.i += 1

    def lazy_or_possessive(self) -> None:
        nxt = self.p[self.i:self.i + 1]
        if nxt == "?":
            self.i += 1  # lazy: the same texts match
        elif nxt == "+":
            raise NotERE("a possessive quantifier ('+' after a quantifier)")

    def count(self) -> None:
        """`{m}`, `{m,}`, `{,n}`, `{m,n}` as Python reads them; any other `{` is a plain brace."""
        m = _COUNT.match(self.p, self.i)
        if not m or m.group(0) == "{}":
            self.out.append("\\{")
            self.i += 1
            return
        lo, comma, hi = m.groups()
        for n in (lo, hi):
            if n and int(n) > RE_DUP_MAX:
                raise NotERE(f"the count {m.group(0)} (POSIX promises counts up to {RE_DUP_MAX})")
        self.out.append("{%s%s%s}" % (lo or "0", comma, hi))
        self.i = m.end()
        self.lazy_or_possessive()

    @staticmethod
    def escape(ch: str) -> str:
        if ch in _OUTSIDE:
            return _OUTSIDE[ch]
        if not ch or ch.isalnum() or ch == "_":
            raise NotERE(f"the escape '\\{ch}' (a boundary, backreference, anchor or character code)")
        return "\\" + ch if ch in ERE_SPECIAL else ch

    def bracket(self) -> str:
        """A character class, read as Python reads it, written so ERE reads the same set."""
        p, i = self.p, self.i + 1
        negate = p[i:i + 1] == "^"
        i += negate
        items: list = []  # single characters and (lo, hi) ranges
        classes: list = []
        first = True
        while True:
            if i >= len(p):
                raise NotERE("an unclosed '['")  # Python refuses it first
            ch = p[i]
            if ch == "]" and not first:
                break
            first = False
            if ch == "\\":
                esc = p[i + 1:i + 2]
                if esc in _INSIDE:
                    classes.append(_INSIDE[esc])
                    i += 2
                    continue
                if not esc or esc.isalnum() or esc == "_":
                    raise NotERE(f"the escape '\\{esc}' inside a character class")
                ch, i = esc, i + 2
            else:
                i += 1
            if p[i:i + 1] == "-" and p[i + 1:i + 2] not in ("]", ""):
                hi = p[i + 1]
                if hi == "\\" or ch in "[]^-\\" or hi in "[]^-":
                    raise NotERE(f"the range {ch}-{hi} (a bracket, caret, dash or backslash as its end)")
                items.append((ch, hi))
                i += 2
            else:
                items.append(ch)
        self.i = i + 1
        return _bracket_text(negate, items, classes)


def _bracket_text(negate: bool, items: list, classes: list) -> str:
    """ERE's rules: `]` first, `-` last, `^` anywhere but first, `[` not before `:`, `.` or `=`."""
    chars = {x for x in items if isinstance(x, str)}
    core = "".join(["]" if "]" in chars else "",
                    "".join(f"{lo}-{hi}" for lo, hi in (x for x in items if isinstance(x, tuple))),
                    "".join(classes),
                    "".join(sorted(chars - set("]^[-"))),
                    "[" if "[" in chars else ""])
    dash = "-" if "-" in chars else ""
    if "^" in chars:
        if core or negate:
            core += "^"
        elif dash:
            core, dash = "-^", ""
        else:
            return "\\^"
    return "[" + ("^" if negate else "") + core + dash + "]"
