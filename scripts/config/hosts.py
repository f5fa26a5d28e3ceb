"""Every host a task can name: `local`, the built-in sandbox, and those of hosts.env.

Why its own module: hostconfig reads and checks hosts.env and builds `local`; the sandbox host
(sandbox.py) is built on hostconfig's Host with its own directory and phases. This module puts
them together. The sandbox is built only when a task names it or lists every host: a status of
another host reads no sandbox directory and builds no sandbox phase.
"""
from __future__ import annotations

from pathlib import Path

from .hostconfig import load_hosts, select_hosts


def _sandbox():
    from .sandbox import sandbox_host

    return sandbox_host()


BUILT_IN = {"sandbox": _sandbox}  # alias -> what builds it, beside `local`


def load(path: Path | None = None) -> dict:
    """{alias: Host} for every host (validated); ConfigError names a bad value."""
    return load_hosts(path, built_in=tuple(BUILT_IN.values()))


def select(spec: str, path: Path | None = None) -> list:
    """The hosts a --host value names ('gpu1,gpu2', 'gpu[1-8]'); ConfigError if unknown or bad.

    A sandbox directory another user owns (or a loose or linked one) is refused here, for
    every task, not only by `sandbox up` (StateDirError, exit 3): status, verify and
    teardown would run against it and write into it."""
    chosen = select_hosts(spec, load_hosts(path), BUILT_IN)
    if any(h.sandbox for h in chosen):
        from .sandbox import existing_dir

        existing_dir()
    return chosen
