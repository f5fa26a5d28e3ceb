"""Text from a host, made safe twice over: for a terminal (printable) and for JSON (clean).

Why one module for both sides: every string a host hands us (argv, comm, file, unit and
container names, user and operator names, a lock file's text, an error's words) is
untrusted. A process titled `x\\nINJECTED: FREED` forged whole lines of the status, plan
and dry-run tables, and an operator named `\\x1b]0;pwned\\x07` retitled the terminal of
whoever read the LOCKED line. The agent and the local side escape with this one
function, so there is one rule to read and test. Standard library only, Python 3.8: it
ships in the agent bundle, and the local side imports it from here too.

The whole account: docs/design-notes.md (scripts/agent/procs/textsafe.py)."""
import json
import re

BYTE_BASE = 0xEF00  # byte 0xNN (0x80..0xFF: the only bytes that can fail to decode) <-> U+EF00+NN

_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff"
                     "\ud800-\udfff\uef80-\uefff]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def _shown(match):
    code = ord(match.group())
    if 0xDC80 <= code <= 0xDCFF or 0xEF80 <= code <= 0xEFFF:  # a byte that was not UTF-8
        return "\\x%02x" % (code & 0xFF)
    return "\\x%02x" % code if code < 0x100 else "\\u%04x" % code


def printable(text):
    """`text` (anything: str() is taken) as one line safe for a terminal; see the module
    docstring. Idempotent: what it writes has no character it would escape again."""
    if not isinstance(text, str):
        text = str(text)
    return _UNSAFE.sub(_shown, text)


def _clean_one(match):
    code = ord(match.group())
    return chr(code - 0xDC00 + BYTE_BASE) if 0xDC80 <= code <= 0xDCFF else "\ufffd"


def clean(text):
    """`text` without lone surrogates: a byte that was not UTF-8 (U+DC80+) as U+EF00+NN."""
    return _SURROGATE.sub(_clean_one, text) if _SURROGATE.search(text) else text


def decode(raw):
    """Bytes from the host (argv, a file name) as valid Unicode, losing nothing. Strict UTF-8
    first: the usual case, and as fast as the decode it replaces in every /proc read."""
    try:
        return raw.decode("utf-8")  # never yields a surrogate: UTF-8 that encodes one is refused
    except UnicodeDecodeError:
        return clean(raw.decode("utf-8", "surrogateescape"))


def encode(text):
    """The bytes decode() read (U+EF80..U+EFFF back to the bytes they stand for)."""
    return "".join(chr(ord(c) - BYTE_BASE + 0xDC00) if "\uef80" <= c <= "\uefff" else c
                   for c in text).encode("utf-8", "surrogateescape")


def clean_doc(value):
    """A JSON-able value with clean() applied to every string in it, keys included."""
    if isinstance(value, str):
        return clean(value)
    if isinstance(value, dict):
        return {clean_doc(k) if isinstance(k, str) else k: clean_doc(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean_doc(v) for v in value]
    return value


def dumps(doc, **kwargs):
    """json.dumps that never writes a lone surrogate (see clean). The usual document has none,
    and its text is returned as json.dumps made it; a surrogate pair of a valid character
    outside the BMP (an emoji) also takes the second pass, which leaves it as it is."""
    kwargs.setdefault("default", str)
    text = json.dumps(doc, **kwargs)
    if "\\ud" in text or "\\uD" in text or _SURROGATE.search(text):
        text = json.dumps(clean_doc(doc), **dict(kwargs, default=lambda o: clean(str(o))))
    return text
