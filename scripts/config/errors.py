"""The one exception type for bad user input (hosts.env values, command-line flags).

Why its own module: the strict hosts.env reader, the ssh option policy and the pattern
checks all raise it, and hostconfig imports them; keeping the class here avoids an
import cycle. `scripts.config.hostconfig.ConfigError` is this same class.
"""


class ConfigError(ValueError):
    """A bad value in hosts.env or on the command line; its text is one line for the user.

    scripts/cli/common.guarded turns it into `gpu-pivot: <text>` and exit 2, before anything has run."""


def quoted(value) -> str:
    """A value as the user typed it, in shell quotes: `'sglang\\.x('` reads as typed and pastes
    back into a shell. Why not repr: it doubles every backslash, so a regex or an ssh option
    in the message is not what was typed. A value holding a single quote is shown in double
    quotes when that needs no escape; one with control characters (or both kinds of quote
    and a shell escape) through repr, so the message stays one visible line."""
    text = str(value)
    if not text.isprintable():
        return repr(text)
    if "'" not in text:
        return f"'{text}'"
    if not any(c in text for c in '"\\$`'):
        return f'"{text}"'
    return repr(text)


def show(value, limit: int = 60) -> str:
    """A value for an error message (quoted), cut to `limit` characters with the full length noted."""
    text = str(value)
    if len(text) <= limit:
        return quoted(text)
    return f"{quoted(text[:limit])}... ({len(text)} characters)"
