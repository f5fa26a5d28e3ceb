"""Helpers for the Invoke tasks (scripts/cli/): the argv after `--`, validated numbers, and
errors that name what the user typed.

Numeric flags are declared with string defaults and checked here: Invoke would otherwise
cast them itself and answer a typo with a traceback instead of one line and exit 2.

Why read sys.argv: Invoke keeps what follows `--` only as one space-joined string, which
loses the argument boundaries that `invoke run --host H -- CMD ARGS...` must keep exact.
"""
from __future__ import annotations

import contextlib
import os
import re
import sys

from ..agent.wire import defaults
from .errors import ConfigError, show
from .patterncheck import check_pattern


def remainder(argv: list | None = None) -> list:
    """Arguments after the first `--` on the command line, exactly as the shell gave them."""
    argv = sys.argv if argv is None else argv
    if "--" not in argv:
        return []
    return argv[argv.index("--") + 1:]


MAX_SECONDS = float(defaults.MAX_WAIT_S)  # the agent refuses longer waits too (one number for both sides)


def seconds(name: str, value, minimum: float = 0.0, maximum: float = MAX_SECONDS) -> float:
    """A number of seconds from a flag, minimum..maximum; ConfigError names the flag and value."""
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"--{name} {show(value)}: not a number of seconds") from None
    if out != out or out < minimum or out > maximum:
        raise ConfigError(f"--{name} {show(value)}: must be a number of seconds from {minimum:g} to {maximum:g}")
    return out


def whole(name: str, value, minimum: int = 0) -> int:
    """A whole number >= minimum from a flag (MiB, lines, hosts at once)."""
    try:
        out = int(str(value))
    except ValueError:
        raise ConfigError(f"--{name} {show(value)}: not a whole number") from None
    if out < minimum:
        raise ConfigError(f"--{name} {show(value)}: must be >= {minimum}")
    return out


_GPU = re.compile(r"[0-9]+|(GPU|MIG)-[0-9A-Fa-f][0-9A-Fa-f/-]*")


def gpu_list(name: str, value) -> str:
    """CUDA_VISIBLE_DEVICES as a flag gives it: GPU indices or UUIDs, comma-separated, none
    twice. CUDA stops at the first it cannot read (`-1`, `x`), so `x,y` would count as two GPUs
    to the launch check and give the server none: refused here, naming the value."""
    text = str(value)
    items = text.split(",")
    bad = next((i for i in items if not _GPU.fullmatch(i)), None)
    if bad is not None:
        raise ConfigError(f"--{name} {show(text)}: {show(bad)} is not a GPU index or UUID (e.g. 0,1 or GPU-5f2c...)")
    if len(set(items)) != len(items):
        raise ConfigError(f"--{name} {show(text)}: names a GPU twice")
    return text


def pattern(name: str, value) -> str:
    """A target pattern from a flag (--match): a valid regex naming some programs, not all.

    Same rule as TARGETS/PROTECT in hosts.env (scripts/config/patterncheck.py): '' or '.*' would
    make every process a target, so it is refused with one line naming the flag and value."""
    return check_pattern(f"--{name}", str(value))


def typed(flag: str, short: str = "", argv: list | None = None) -> bool:
    """Whether the command line gave `flag` (or its short form) before any `--`."""
    argv = sys.argv if argv is None else argv
    argv = argv[: argv.index("--")] if "--" in argv else argv
    return any(a == flag or a.startswith(flag + "=") or (short and a.startswith(short)) for a in argv[1:])


def source_of(flag: str, short: str, env: str) -> str:
    """Where a flag's value came from, as the user knows it: `flag` when typed, else the
    environment variable `env` when it is set (it is the flag's default), else `flag`."""
    return env if not typed(flag, short) and env in os.environ else flag


@contextlib.contextmanager
def named(flag: str, as_typed: str):
    """Errors inside that begin with `flag` name `as_typed` instead: what the user typed.

    The checks deeper down know one name for a value (`--phase`, `--host`); the user may
    have given it as `--to` (pivot) or through GPU_PIVOT_HOST, and an error must name that."""
    try:
        yield
    except ConfigError as exc:
        text = str(exc)
        if as_typed == flag or not text.startswith(flag):
            raise
        rest = text[len(flag):]
        joint = "=" if as_typed[:1] != "-" and rest.startswith(" ") and rest[1:2] in "'\"" else ""
        raise ConfigError(as_typed + (joint + rest[1:] if joint else rest)) from None
