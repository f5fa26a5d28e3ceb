"""Set a host's GPU settings through the agent (`gpu-settings`), and the audit records of what
changed: each GPU's each setting with its value before and after.

Why the local audit log too: the host keeps its own copy, but the operator's log gathers a
fleet's pivots in one place, beside the teardown's signals of the same pivot.
"""
from __future__ import annotations

import json
import time

from ..agent.wire import defaults, records, requests
from ..reach.transport import AgentResult, call_agent
from . import audit_log


def apply(host, want: dict, operator: str) -> AgentResult[records.SettingsResult]:
    """Every GPU of `host` set to `want` ({field: value}, config/gpu_settings.py's shape)."""
    return call_agent(host, requests.GpuSettings(settings=json.dumps(want, sort_keys=True), operator=operator))


def audit_records(r: records.SettingsResult, why: str) -> list:
    """One record per setting written or failed (one already right was not written: none)."""
    now = time.strftime(defaults.TIME_FORMAT)
    return [dict(row, event="gpu-setting", why=why, time=now) for row in r.rows if row.get("result") != "already"]


def last_pivot_phase(host):
    """The phase the host's last pivot started, where it ended done and the phase has GPU
    settings of its own, from the local audit log; else None. Why the audit log: it is the
    one record of which phase runs that needs no call to the host. A phase stopped since by
    hand (`invoke stop`) is not seen there: status says whose settings it compares."""
    from ..agent.state import statedir

    try:
        pivots = [r for r in audit_log.read() if r.get("event") == "pivot" and r.get("alias") == host.alias]
    except statedir.StateDirError:
        return None
    last = pivots[-1] if pivots else {}
    phase = host.phases.get(last.get("to")) if last.get("exit_code") == 0 else None
    return phase if phase is not None and phase.gpu_settings else None
