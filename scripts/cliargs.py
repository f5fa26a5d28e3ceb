"""Helpers for the Invoke tasks (scripts/cli/): the argv after `--`, and validated numbers.

Numeric flags are declared with string defaults and checked here: Invoke would otherwise
cast them itself and answer a typo with a traceback instead of one line and exit 2.

Why read sys.argv: Invoke keeps what follows `--` only as one space-joined string, which
loses the argument boundaries that `invoke run --host H -- CMD ARGS...` must keep exact.
"""
from __future__ import annotations

import sys

from .agent import contract
from .config_error import ConfigError
from .patterncheck import check_pattern


def remainder(argv: list | None = None) -> list:
    """Arguments after the first `--` on the command line, exactly as the shell gave them."""
    argv = sys.argv if argv is None else argv
    if "--" not in argv:
        return []
    return argv[argv.index("--") + 1:]


MAX_SECONDS = float(contract.MAX_WAIT_S)  # the agent refuses longer waits too (one number for both sides)


def seconds(name: str, value, minimum: float = 0.0, maximum: float = MAX_SECONDS) -> float:
    """A number of seconds from a flag, minimum..maximum; ConfigError names the flag and value."""
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"--{name} {value!r}: not a number of seconds") from None
    if out != out or out < minimum or out > maximum:
        raise ConfigError(f"--{name} {value!r}: must be a number of seconds from {minimum:g} to {maximum:g}")
    return out


def whole(name: str, value, minimum: int = 0) -> int:
    """A whole number >= minimum from a flag (MiB, lines, hosts at once)."""
    try:
        out = int(str(value))
    except ValueError:
        raise ConfigError(f"--{name} {value!r}: not a whole number") from None
    if out < minimum:
        raise ConfigError(f"--{name} {value!r}: must be >= {minimum}")
    return out


def pattern(name: str, value) -> str:
    """A target pattern from a flag (--match): a valid regex naming some programs, not all.

    Same rule as TARGETS/PROTECT in hosts.env (scripts/patterncheck.py): '' or '.*' would
    make every process a target, so it is refused with one line naming the flag and value."""
    return check_pattern(f"--{name}", str(value))
