"""How the agent's output is framed: the nonce, the marker lines around the result, the
progress lines before it, and the phase spec as one argv word.
"""
import binascii
import json
import os


def new_nonce():
    """16 hex digits, fresh per call: what the result's marker lines carry."""
    return binascii.hexlify(os.urandom(8)).decode()


# -- the result's marker lines: only what lies between `begin` and `end` lines carrying the
# local side's nonce is the result, so a MOTD, rc-file noise or a fake marker is never taken for it.

MARKER_PREFIX = "=====gpu-pivot-result"


def begin(nonce):
    return "%s %s begin=====" % (MARKER_PREFIX, nonce)


def end(nonce):
    return "%s %s end=====" % (MARKER_PREFIX, nonce)


def frame(nonce, text):
    """The result as the agent prints it: begin line, the JSON text, end line."""
    return "\n".join([begin(nonce), text, end(nonce)]) + "\n"


class MarkerError(ValueError):
    """The output had no well-formed result block."""


def extract(text, nonce):
    """The text between this nonce's marker lines; MarkerError when absent or unclosed."""
    lines = text.splitlines()
    b, e = begin(nonce), end(nonce)
    try:
        start = lines.index(b)
    except ValueError:
        raise MarkerError("no result marker in the agent's output") from None
    try:
        stop = lines.index(e, start + 1)
    except ValueError:
        raise MarkerError("the agent's result was cut off (begin marker without end marker)") from None
    return "\n".join(lines[start + 1:stop])


# -- progress lines ------------------------------------------------------------------------------
# With --progress the agent prints these on stdout before its result, one JSON object per
# line, so the local side can show a teardown or a wait while it runs.

PROGRESS_PREFIX = "gpu-pivot-progress "


def progress_line(fields):
    return PROGRESS_PREFIX + json.dumps(fields, sort_keys=True) + "\n"


def parse_progress(line):
    """The fields of a progress line, or None when the line is not one (it is output then)."""
    if not line.startswith(PROGRESS_PREFIX):
        return None
    try:
        fields = json.loads(line[len(PROGRESS_PREFIX):])
    except ValueError:
        return None
    return fields if isinstance(fields, dict) else None


# -- the phase spec ------------------------------------------------------------------------------
# A phase travels as base64 of its JSON: one argv word, nothing for any shell layer to
# re-parse, whatever its commands hold.


def encode_spec(spec):
    return binascii.b2a_base64(json.dumps(spec, sort_keys=True).encode(), newline=False).decode()


def decode_spec(text):
    return json.loads(binascii.a2b_base64(text.encode()).decode())
