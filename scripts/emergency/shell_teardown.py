"""The emergency teardown as one shell command, and a reader for the report it prints.

Why: when python3 is missing on the host, or this repo is not at hand, an operator still
needs the safe sequence rather than a kill-by-name and kill-by-device one-liner. The
script (scripts/emergency/teardown.sh) travels as ONE argument of `sh -c`, its inputs as
positional parameters, so the Route quotes it once per layer like any other argv.

Why the host's config travels with it: a line that ignored the host's PROTECT killed what
`invoke teardown` keeps. Its TARGETS, PROTECT, DEVICES and scope go in as arguments (the
regexes as POSIX EREs, ere.py), so the pasted line and the agent pick the same processes.
"""
from __future__ import annotations

import math
from pathlib import Path

from ..agent.policy import builtin, program
from ..agent.wire import defaults
from . import ere

SCRIPT = Path(__file__).resolve().parent / "teardown.sh"
NAME = "gpu-pivot-teardown"  # the script's $0

DEFAULT_TARGETS = builtin.DEFAULT_TARGETS  # the agent's, when a host names none


def protected_case() -> str:
    """The shell `case` pattern of protected names, from the agent's one protect list."""
    names = sorted(builtin.PROTECTED_NAMES)
    return "|".join(names + ["*" + s for s in builtin.PROTECTED_SUFFIXES] + ["sshd*"])


def interpreters_line() -> str:
    """The script's interpreter regex (an ERE for awk), from the agent's (policy/program.py)."""
    return f"interp='{program.INTERPRETERS.pattern}'"


# A marker comment in teardown.sh, and the text generated for the line after it (the file's own
# copy is checked equal by a test).
GENERATED = {
    "# protected names:": lambda: f"{protected_case()}) return 0 ;;",
    "# interpreters:": interpreters_line,
}


def script_text() -> str:
    """The script without its comment lines and indentation (shorter to paste, same behaviour: no
    string in it spans lines where leading blanks count), its generated lines made from the agent's rules."""
    lines, replace_next = [], None
    for line in SCRIPT.read_text().splitlines():
        stripped = line.lstrip()
        marker = next((m for m in GENERATED if stripped.startswith(m)), None)
        if marker:
            replace_next = GENERATED[marker]
            continue
        if stripped.startswith("#"):
            continue
        if replace_next:
            stripped = replace_next()
            replace_next = None
        lines.append(stripped)
    return "\n".join(lines) + "\n"


def target_eres(patterns, key: str = "TARGETS") -> tuple:
    """(single-name ERE, `program subcommand` ERE) of the target patterns: each top-level
    alternative with a space names `program subcommand` only, as the agent's program.match."""
    single: list = []
    spaced: list = []
    for pattern in patterns:
        for python_alt, ere_alt in ere.alternatives(key, pattern):
            (spaced if " " in python_alt else single).append(ere_alt)
    return "|".join(single), "|".join(spaced)


def positional(devices: str, grace_s: float, settle_s: float, targets=(), protect=(), scope: str | None = None,
               scope_uid: int | None = None, prefix: str = "") -> list:
    """The script's positional parameters ($1...): DEVICE_GLOB SCOPE SCOPE_UID TARGETS TARGETS_SPACED
    PROTECT GRACE SETTLE. `targets` empty: the agent's defaults. `prefix`: the hosts.env key
    prefix named when a pattern cannot be written as an ERE (ConfigError: one line, exit 2)."""
    single, spaced = target_eres(targets or DEFAULT_TARGETS, f"{prefix}TARGETS" if targets else "DEFAULT_TARGETS")
    prot = "|".join(ere.to_ere(f"{prefix}PROTECT", p) for p in protect)
    return [devices, scope or "", "" if scope_uid is None else str(scope_uid), single, spaced, prot,
            str(int(math.ceil(grace_s))), str(int(math.ceil(settle_s)))]


def argv(host, grace_s: float = defaults.GRACE_S, settle_s: float = defaults.SETTLE_S) -> list:
    """The one-liner's argv: the script and the host's config, the waits in whole seconds (rounded
    up: never shorter than asked)."""
    return ["sh", "-c", script_text(), NAME,
            *positional(host.devices, grace_s, settle_s, host.targets, host.protect, host.scope,
                        getattr(host, "scope_uid", None), prefix=f"{host.alias.upper()}_")]


# The script read whole from stdin, then run with the same positional parameters ($0 NAME):
# `cat` has read to the end before anything runs, so no command the script runs can eat the
# script's own text from stdin (what `sh -s` would allow).
FROM_STDIN = 'eval "$(cat)"'


def stdin_argv(host, grace_s: float = defaults.GRACE_S, settle_s: float = defaults.SETTLE_S) -> list:
    """argv() with the script on stdin instead of in the argv (script_text() is what to send).

    Why: on the emergency page the script is a here-document below a one-line command, so every
    action's line fits the first screen; in the argv it made the teardown line 400 lines long."""
    return ["sh", "-c", FROM_STDIN, *argv(host, grace_s, settle_s)[3:]]
