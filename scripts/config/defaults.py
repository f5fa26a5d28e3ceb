"""The local side's defaults in one place: the default host and every task flag's default.

Why one place: the same number was written in a flag's default, in its --help text and in
the README drifts apart. Each task flag default and its help text are built from the
names here. Standard library only and imports nothing, so every task module can import it
without slowing `invoke --list`.

What both sides use (the default device glob DEVICE_GLOB, the time format TIME_FORMAT of
audit records and last.json, the exit codes) is the wire's: scripts/agent/wire/.
"""
from __future__ import annotations

import os

from scripts.agent.wire import defaults as shared  # the defaults both sides read

# -- which host ---------------------------------------------------------------------------------
HOST_ENV = "GPU_PIVOT_HOST"
HOST = os.environ.get(HOST_ENV, "sandbox")  # read once, when the tasks load: it is a flag's default

# -- teardown (also the teardown step of a pivot) -----------------------------------------------
GRACE_S, TIMEOUT_S, SETTLE_S = shared.GRACE_S, shared.TIMEOUT_S, shared.SETTLE_S  # both sides': one place
WAIT_LOCK_S = shared.WAIT_LOCK_S  # 0: another teardown holding the host's lock fails at once (exit 4)
MAX_USED_MIB = shared.MAX_USED_MIB  # a GPU is free at or under this many MiB used
FANOUT = 16            # hosts torn down at once: a teardown signals, so a fleet's is bounded
# status, verify, plan and ping only read: their bound is the local side's ssh clients (one
# client and its ControlMaster a host, ~0.01 s of local CPU each), not the hosts' safety. Two
# waves of a bound double a fleet's wall time (bench/RESULTS.md 7f), so one wave covers 64 hosts.
READ_FANOUT = 64

# -- other tasks --------------------------------------------------------------------------------
VERIFY_WAIT_S = shared.VERIFY_WAIT_S  # verify: poll this long for free GPUs (0: look once)
ONELINER_GRACE_S = shared.GRACE_S
LOG_LINES = 50
AUDIT_LINES = 20


def num(value) -> str:
    """A default as a flag's string default and in help text: 30.0 -> '30', 0.5 -> '0.5'."""
    return f"{value:g}"
