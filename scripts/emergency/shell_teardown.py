"""The emergency teardown as one shell command, and a reader for the report it prints.

Why: when python3 is missing on the host, or this repo is not at hand, an operator still
needs the safe sequence rather than a kill-by-name and kill-by-device one-liner. The
script (scripts/emergency/teardown.sh) travels as ONE argument of `sh -c`, its inputs as
positional parameters, so the Route quotes it once per layer like any other argv.
"""
from __future__ import annotations

import math
from pathlib import Path

from ..agent import contract
from . import fuser_parse

SCRIPT = Path(__file__).resolve().parent / "teardown.sh"
BEGIN, END = "==gpu-pivot-oneliner begin==", "==gpu-pivot-oneliner end=="


PROTECTED_MARK = "# protected names:"


def protected_case() -> str:
    """The shell `case` pattern of protected names, from the agent's one protect list."""
    names = sorted(contract.PROTECTED_NAMES)
    return "|".join(names + ["*" + s for s in contract.PROTECTED_SUFFIXES] + ["sshd*"])


def script_text() -> str:
    """The script without its comment lines (shorter to paste, same behaviour), its protected
    names generated from the contract's list (the file's own copy is checked equal by a test)."""
    lines, replace_next = [], False
    for line in SCRIPT.read_text().splitlines():
        if line.lstrip().startswith(PROTECTED_MARK):
            replace_next = True
            continue
        if line.lstrip().startswith("#"):
            continue
        if replace_next:
            indent = line[: len(line) - len(line.lstrip())]
            line = f"{indent}{protected_case()}) return 0 ;;"
            replace_next = False
        lines.append(line)
    return "\n".join(lines) + "\n"


def argv(host, grace_s: float = contract.GRACE_S, settle_s: float = contract.SETTLE_S) -> list:
    """The one-liner's argv: the script and its inputs, the waits in whole seconds (rounded up:
    never shorter than asked)."""
    return ["sh", "-c", script_text(), "gpu-pivot-teardown", host.devices, str(int(math.ceil(grace_s))),
            str(int(math.ceil(settle_s)))]


def parse_report(text: str) -> dict:
    """{'holders': [pids], 'protected': [...], 'sigTERM': [...], 'sigKILL': [...], 'remaining': [...],
    'verdict': 'free'|'not-free'} from the script's output (noise around it ignored)."""
    if BEGIN not in text or END not in text:
        raise ValueError("no gpu-pivot one-liner report in the output")
    body = text.split(BEGIN, 1)[1].split(END, 1)[0]
    out: dict = {}
    for line in body.strip().splitlines():
        key, _, rest = line.partition(":")
        if key == "verdict":
            out[key] = rest.strip().rstrip("@")
        elif key == "not-root":
            out[key] = rest.strip().rstrip("@")
        elif key == "gpus-with-memory-used":
            out[key] = int(rest.strip().rstrip("@"))
        else:
            out[key] = fuser_parse.pids(rest, end="@@")
    return out
