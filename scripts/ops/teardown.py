"""A teardown as an operation: each host's plan, what a person approved of it, the agent's
teardown and the local audit record of what it signalled.

Why one place: `invoke teardown`, a pivot's teardown step, the Slurm epilog and the Ansible
module must send the same teardown and read it the same way; a second path to the agent
drops the approval (a process that appeared since the plan is hit) or the audit record.
The task parses the flags into a requests.Teardown and renders the outcomes; this module
runs the calls and renders nothing.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from ..agent.wire import records, requests
from ..config.defaults import FANOUT
from ..reach.transport import AgentResult, call_agent
from . import audit_log, fleet


class Progress(Protocol):
    """A host's running teardown as the task shows it (views' TeardownProgress)."""

    def update(self, p: dict) -> None: ...

    def done(self) -> None: ...


def plan(host, selection: requests.Plan | None = None, deadline_s: float | None = None):
    """The host's teardown plan for `selection` (what chooses targets): what it would signal
    and keep, and why. Signals nothing."""
    return call_agent(host, requests.Plan() if selection is None else selection, deadline_s=deadline_s)


def plans(hosts: list, selection: requests.Plan, fanout: int = FANOUT) -> list:
    """Every host's plan (fleet outcomes, in host order): a failed host keeps its error."""
    return fleet.each_host(hosts, lambda h: plan(h, selection), fanout)


def approvals(outcomes: list) -> dict:
    """{alias: 'pid:start,...'} of what each planned host would signal, as `--approved` takes it:
    shown to a person and approved, only these are signalled. Raises the first host's error,
    since what was not planned cannot be approved."""
    failed = next((o.error for o in outcomes if o.error is not None), None)
    if failed is not None:
        raise failed
    return {o.host.alias: o.value.result.plan.approved() for o in outcomes}


def only_these(rows) -> str:
    """The targets (plan rows) to signal, as `--approved` takes them; none: nothing is signalled."""
    return ",".join(f"{t['pid']}:{t['start_time']}" for t in rows)


def for_host(request: requests.Teardown, approved: dict, alias: str) -> requests.Teardown:
    """`request` signalling only what was approved on host `alias` (with --yes, {}: all of the
    plan the agent makes itself)."""
    return request.replace(approved=approved[alias]) if alias in approved else request


def on_host(host, request: requests.Teardown, on_progress: Callable[[dict], None] | None = None,
            deadline_s: float | None = None, audit: bool = True) -> AgentResult[records.TeardownResult]:
    """One teardown on `host`, then what it signalled or stopped appended to the local audit log
    (`audit`: False where the agent's own record on this machine is the only log: the epilog).
    `deadline_s`: the caller's budget, else the request's own (its waits)."""
    result = call_agent(host, request, on_progress=on_progress, deadline_s=deadline_s)
    actions = result.result.actions
    if audit and actions:
        audit_log.append(host.alias, actions)
    return result


def on_hosts(hosts: list, request: requests.Teardown, approved: dict, fanout: int = FANOUT,
             progress_for: Callable[..., Progress | None] = lambda host: None, on_done=None) -> list:
    """The teardown on every host, at most `fanout` at once (fleet outcomes, in host order),
    each signalling only what was approved there. `progress_for(host)` shows a host's progress
    (None: nothing shown); `on_done(outcome)` as each host ends."""

    def one(h):
        shown = progress_for(h)
        try:
            return on_host(h, for_host(request, approved, h.alias), None if shown is None else shown.update)
        finally:
            if shown is not None:
                shown.done()

    return fleet.each_host(hosts, one, fanout, on_done=on_done)


def carried(request: requests.Teardown, check_mode: bool) -> requests.Plan:
    """The request another carrier sends the agent (Ansible's module, over its own connection):
    the teardown, or in check mode its plan, which signals nothing and waits for nothing."""
    return request.plan() if check_mode else request
