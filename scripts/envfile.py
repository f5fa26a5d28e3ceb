"""Read hosts.env strictly: every line is blank, a comment, or KEY=VALUE, or the file is refused.

Why not python-dotenv's `dotenv_values` alone: it drops a line it cannot parse with only a
warning. `GPU1_CTID 129` (no `=`) vanished that way and commands went to the Proxmox node
instead of the container. An unclosed quote swallowed the lines after it. Here such a line
stops everything with `FILE:LINE: ...` (exit 2) before any host is contacted.

The accepted syntax is a strict subset of dotenv's, and an accepted file yields the same
values dotenv would give (tests compare the two):
  KEY=value            unquoted: ends at the line end or at whitespace + `#` (a comment)
  KEY='value'          single quotes: only \\ and \' are escapes
  KEY="value"          double quotes: \\ \' \" \a \b \f \n \r \t \v are escapes
  export KEY=value     `export ` is allowed (so the file can also be sourced by a shell)
  # comment, blank lines; spaces around `=`; a comment after a closing quote.
Refused: a line without `=`; a key outside [A-Z0-9_]; an unclosed quote or text after the
closing quote; a value spanning lines; a value (after unquoting: "\n" counts) with a control
or line-separator character; a value over 4 KiB; a control character anywhere in the file
(a carriage return could hide a line on a terminal); the same key twice; non-UTF-8 text.
"""
from __future__ import annotations

import re
import unicodedata
from pathlib import Path

from .config_error import ConfigError, show

MAX_VALUE_BYTES = 4096

_KEY = re.compile(r"^[A-Z0-9_]+$")
# [indent] [export ] KEY [spaces] = [spaces] REST. KEY is anything up to `=` without spaces;
# it is checked against _KEY afterwards, so `gpu1_ssh=` gets "bad key", not "not KEY=VALUE".
_BINDING = re.compile(r"^[ \t]*(?:export[ \t]+)?(?P<key>[^=\s]+)[ \t]*=(?P<eq>[ \t]*)(?P<rest>.*)$", re.DOTALL)
_SINGLE = re.compile(r"'((?:\\.|[^'\\])*)'", re.DOTALL)
_DOUBLE = re.compile(r'"((?:\\.|[^"\\])*)"', re.DOTALL)
_AFTER_QUOTE = re.compile(r"[ \t]*(?:#.*)?$", re.DOTALL)
_SINGLE_ESC = {"\\\\": "\\", "\\'": "'"}
_DOUBLE_ESC = {"\\\\": "\\", "\\'": "'", '\\"': '"', "\\a": "\a", "\\b": "\b", "\\f": "\f",
               "\\n": "\n", "\\r": "\r", "\\t": "\t", "\\v": "\v"}
_BIDI = set("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def bad_char(text: str) -> str | None:
    """The first character that may not appear in a value, as 'U+000A', else None.

    Control characters (C0, DEL, C1; tab and newline included), line/paragraph separators
    and bidirectional overrides: each can make a value print differently from what it is."""
    for ch in text:
        if unicodedata.category(ch) in ("Cc", "Zl", "Zp") or ch in _BIDI:
            return f"U+{ord(ch):04X}"
    return None


def check_value(label: str, value: str) -> None:
    """Refuse a value that is too long or holds a control character (one-line message)."""
    size = len(value.encode("utf-8", "surrogatepass"))
    if size > MAX_VALUE_BYTES:
        raise ConfigError(f"{label}: value is {size} bytes, over the {MAX_VALUE_BYTES}-byte limit: {show(value)}")
    ch = bad_char(value)
    if ch:
        what = "a newline" if ch in ("U+000A", "U+000D") else f"control character {ch}"
        raise ConfigError(f"{label}: value has {what} (values are one line of printable text): {show(value)}")


def _unescape(body: str, table: dict) -> str:
    return re.sub(r"\\.", lambda m: table.get(m.group(0), m.group(0)), body, flags=re.DOTALL)


def _quoted(where: str, key: str, rest: str, later: str, lineno: int) -> str:
    """The value of a quoted REST (the line from the opening quote); `later` is the rest of the file."""
    rx, table = (_SINGLE, _SINGLE_ESC) if rest[0] == "'" else (_DOUBLE, _DOUBLE_ESC)
    m = rx.match(rest)
    if m is None:
        spans = rx.match(rest + "\n" + later)
        if spans:
            last = lineno + spans.group(0).count("\n")
            raise ConfigError(f"{where}: {key}: quoted value spans lines {lineno}-{last} "
                              f"(values are one line): {show(rest)}")
        raise ConfigError(f"{where}: {key}: unclosed {rest[0]} quote: {show(rest)}")
    if not _AFTER_QUOTE.match(rest, m.end()):
        raise ConfigError(f"{where}: {key}: text after the closing quote: {show(rest)}")
    return _unescape(m.group(1), table)


def parse_text(text: str, source: str) -> tuple:
    """hosts.env text -> ({KEY: value}, {KEY: line number}); ConfigError on the first bad line."""
    text = text[1:] if text.startswith("\ufeff") else text
    lines = text.split("\n")
    values: dict = {}
    where_set: dict = {}
    for index, raw in enumerate(lines):
        lineno = index + 1
        where = f"{source}:{lineno}"
        line = raw[:-1] if raw.endswith("\r") else raw
        stripped = line.strip(" \t")
        if not stripped or stripped.startswith("#"):
            ch = bad_char(line.replace("\t", ""))
            if ch:
                raise ConfigError(f"{where}: control character {ch} in a comment or blank line: {show(line)}")
            continue
        m = _BINDING.match(line)
        if m is None:
            raise ConfigError(f"{where}: not KEY=VALUE: {show(line)}")
        key, rest = m.group("key"), m.group("rest")
        if not _KEY.match(key):
            raise ConfigError(f"{where}: key {show(key)}: keys are upper-case letters, digits and _ "
                              "(ALIAS_SUFFIX, e.g. GPU1_SSH)")
        if m.group("eq") and rest.startswith("#"):
            value = ""                               # `KEY= # comment`: empty value, as dotenv reads it
        elif rest[:1] in ("'", '"'):
            value = _quoted(where, key, rest, "\n".join(lines[index + 1:]), lineno)
        else:
            value = re.sub(r"\s+#.*", "", rest).rstrip()
        check_value(f"{where}: {key}", value)
        ch = bad_char(line.replace("\t", ""))
        if ch:
            raise ConfigError(f"{where}: {key}: control character {ch} in the line: {show(line)}")
        if key in values:
            raise ConfigError(f"{where}: {key} is set twice (first on line {where_set[key]})")
        values[key], where_set[key] = value, lineno
    return values, where_set


def read_env_file(path: Path) -> tuple:
    """Read and parse a hosts.env file: ({KEY: value}, {KEY: line number})."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror or exc})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})") from None
    return parse_text(text, str(path))
