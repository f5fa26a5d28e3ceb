"""Every host a task can name: `local`, the built-in sandbox, and those of hosts.env.

Why its own module: hostconfig reads and checks hosts.env and builds `local`; the sandbox
host is built by scripts/ops/sandbox.py, which itself builds on hostconfig. This module sits
above both and puts them together, so neither imports the other's layer upward.
"""
from __future__ import annotations

from pathlib import Path

from ..ops.sandbox import existing_dir, sandbox_host
from .hostconfig import load_hosts, select_hosts


def load(path: Path | None = None) -> dict:
    """{alias: Host} for every host (validated); ConfigError names a bad value."""
    return load_hosts(path, built_in=(sandbox_host,))


def select(spec: str, path: Path | None = None) -> list:
    """The hosts a --host value names ('gpu1,gpu2', 'gpu[1-8]'); ConfigError if unknown or bad.

    A sandbox directory another user owns (or a loose or linked one) is refused here, for
    every task, not only by `sandbox up` (StateDirError, exit 3): status, verify and
    teardown would run against it and write into it."""
    chosen = select_hosts(spec, load(path))
    if any(h.sandbox for h in chosen):
        existing_dir()
    return chosen
