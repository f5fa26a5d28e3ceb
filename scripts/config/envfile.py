"""Read hosts.env strictly: every line is blank, a comment, or KEY=VALUE, or the file is refused.

Why not python-dotenv's `dotenv_values` alone: it drops a line it cannot parse with only a
warning: `GPU1_CTID 129` (no `=`) would vanish and commands go to the Proxmox node
instead of the container, and an unclosed quote swallows the lines after it. Here such a line
stops everything with `FILE:LINE: ...` (exit 2) before any host is contacted.

The whole account: docs/design-notes.md (scripts/config/envfile.py)."""
from __future__ import annotations

import os
import re
import stat
import unicodedata
from pathlib import Path

from .errors import ConfigError, show

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


def _trusted(st: os.stat_result, what: str, is_dir: bool) -> None:
    """Owned by this user or root, and nobody else can write it (a directory may be
    other-writable only when sticky, like /tmp: others cannot replace what is ours there)."""
    if st.st_uid not in (0, os.geteuid()):
        raise ConfigError(f"{what}: owned by uid {st.st_uid}, not by you or root: refusing to read hosts from it "
                          "(its LOCAL_PYTHON, SSH_OPTS… would run as you)")
    if st.st_mode & 0o022 and not (is_dir and st.st_mode & stat.S_ISVTX):
        raise ConfigError(f"{what}: writable by group or others (mode {stat.S_IMODE(st.st_mode):o}): "
                          "refusing to read hosts from it; chmod go-w it")


MAX_LINKS = 40


def trusted_real_path(path: Path) -> str:
    """The file `path` names, walked one component at a time: every directory on the way and
    every symbolic link followed must belong to this user or root, and no directory may be
    writable by others unless sticky (_trusted). Why each: a link in, or a directory above,
    another user's directory lets that user re-point which file is read, e.g. switch root
    from the test cluster's hosts.env to another."""
    pending = [c for c in str(Path(path).absolute()).split("/") if c]
    cur, links = "/", 0
    _trusted(os.stat("/"), f"{path}: directory /", is_dir=True)
    while pending:
        name = pending.pop(0)
        if name == ".":
            continue
        if name == "..":
            cur = os.path.dirname(cur) or "/"
            continue
        nxt = os.path.join(cur, name)
        try:
            st = os.lstat(nxt)
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read ({exc.strerror or exc}: {nxt})") from None
        if stat.S_ISLNK(st.st_mode):
            links += 1
            if links > MAX_LINKS:
                raise ConfigError(f"{path}: cannot read (too many symbolic links)")
            if st.st_uid not in (0, os.geteuid()):  # a link's own mode is always 0777: its owner counts
                raise ConfigError(f"{path}: link {nxt} is owned by uid {st.st_uid}, not by you or root: refusing "
                                  "to read hosts through it")
            target = os.readlink(nxt)
            pending = [c for c in target.split("/") if c] + pending
            if target.startswith("/"):
                cur = "/"
            continue
        if pending:  # a directory on the way
            if not stat.S_ISDIR(st.st_mode):
                raise ConfigError(f"{path}: cannot read ({nxt} is not a directory)")
            _trusted(st, f"{path}: directory {nxt}", is_dir=True)
        cur = nxt
    return cur


def read_trusted_bytes(path: Path) -> bytes:
    """The bytes of a file only this user or root controls, else ConfigError naming why.

    Why: hosts.env says which programs run (LOCAL_PYTHON, ssh options): a file, a link or a
    directory another user can write would make root run that user's code."""
    real = trusted_real_path(path)
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror or exc})") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise ConfigError(f"{path}: cannot read (not a regular file)")
    with os.fdopen(fd, "rb") as f:
        _trusted(st, str(path), is_dir=False)
        return f.read()


def read_env_file(path: Path) -> tuple:
    """Read and parse a hosts.env file: ({KEY: value}, {KEY: line number})."""
    data = read_trusted_bytes(path)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})") from None
    return parse_text(text, str(path))
