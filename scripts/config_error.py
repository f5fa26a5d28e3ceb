"""The one exception type for bad user input (hosts.env values, command-line flags).

Why its own module: the strict hosts.env reader, the ssh option policy and the pattern
checks all raise it, and hostconfig imports them; keeping the class here avoids an
import cycle. `scripts.hostconfig.ConfigError` is this same class.
"""


class ConfigError(ValueError):
    """A bad value in hosts.env or on the command line; its text is one line for the user.

    scripts/cli/common.guarded turns it into `gpu-pivot: <text>` and exit 2, before anything has run."""


def show(value: str, limit: int = 60) -> str:
    """A value for an error message: repr (so control characters stay visible and the
    message stays one line), cut to `limit` characters with the full length noted."""
    if len(value) <= limit:
        return repr(value)
    return f"{value[:limit]!r}... ({len(value)} characters)"
