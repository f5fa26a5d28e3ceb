"""The two marker lines around the agent's one JSON document.

Why markers: login shells print MOTDs and rc-file noise on stdout. The local side keeps
only what lies between `begin` and `end` lines carrying a nonce it chose, so noise (or a
process printing a fake marker) cannot be mistaken for the result.
"""
PREFIX = "=====gpu-pivot-result"


def begin(nonce):
    return "%s %s begin=====" % (PREFIX, nonce)


def end(nonce):
    return "%s %s end=====" % (PREFIX, nonce)


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
