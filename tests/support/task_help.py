"""Every task's `invoke NAME -h`, as an operator reads it on an 80-column terminal, run once.

Why one place: five tests read the help of every task (flags explained, -h is help, short
flags unambiguous, 80 columns, exit codes), and each run is a CLI start (~0.3 s of CPU). Run
per test they were the suite's longest; cached here and grouped on one xdist worker
(HELP_GROUP), every task's help is made once per suite run.
"""
from __future__ import annotations

import os
import subprocess
from functools import cache

import pytest

from tests.conftest import invoke

HELP_GROUP = pytest.mark.xdist_group("every-task-help")  # the tests that read every task's help


def columns(n: int) -> dict:
    """The environment of a terminal n columns wide (colour left to the terminal rule)."""
    return dict({k: v for k, v in os.environ.items() if k != "NO_COLOR"}, COLUMNS=str(n))


@cache
def task_names() -> tuple:
    """The tasks `invoke --list` names."""
    listed = invoke("--list").stdout.decode().splitlines()[2:]
    return tuple(line.split()[0] for line in listed if line.startswith("  ") and not line.startswith("    "))


@cache
def help_of(name: str) -> subprocess.CompletedProcess:
    """`invoke NAME -h` at 80 columns."""
    return invoke(name, "-h", env=columns(80))
