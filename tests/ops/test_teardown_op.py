"""The teardown operation (scripts/ops/teardown.py) on a real local host, scoped to the test's
own processes (tests/support/teardowns.host): the plan, what it approves, the agent's
teardown signalling only that, the local audit record, the progress shown and closed, a
host that cannot be planned, the caller's budget (the Slurm epilog's) and the words the
Ansible module carries."""
from __future__ import annotations

import pytest

from scripts.agent.wire import requests
from scripts.agent.wire.requests import BASE_DEADLINE_S
from scripts.config.hostconfig import build_host
from scripts.ops import audit_log, teardown as teardown_op
from scripts.reach.route import HostTimedOut
from scripts.reach.transport import AgentError
from tests.support.procs import alive, wait_for
from tests.support.teardowns import host

REQ = requests.Teardown(grace=2, timeout=10)


def _signalled(records: list) -> set:
    return {r.get("pid") for r in records if r.get("signal")}


def test_only_what_was_planned_is_signalled_and_it_is_audited(ps):
    """A worker started after the plan was approved is reported, not hit; the approved one is
    gone, the protected holder lives, and the local audit log names what was signalled."""
    h = host(ps)
    planned = ps.role("worker", "--gpu", "0")
    keeper = ps.role("hold", title="nvidia-persistenced")
    approved = teardown_op.approvals(teardown_op.plans([h], requests.Plan()))
    assert f"{planned}:" in approved["local"], approved
    late = ps.role("worker", "--gpu", "1")  # appeared since the person read the plan

    [out] = teardown_op.on_hosts([h], REQ, approved)

    assert out.error is None, out.error
    wait_for(lambda: not alive(planned), "the approved worker's end")
    assert alive(late) and alive(keeper)
    assert late in {t["pid"] for t in out.value.result.unapproved}, out.value.doc
    assert out.value.code != 0  # the late worker still holds GPU 1: not free
    logged = audit_log.read()
    assert planned in _signalled(logged) and late not in _signalled(logged), logged
    assert {r["alias"] for r in logged} == {"local"}


def test_without_an_approval_the_agent_takes_its_own_plan(ps):
    """{} (--yes): the agent plans and signals at once; every target goes, the GPUs are free."""
    h = host(ps)
    workers = [ps.role("worker", "--gpu", str(i)) for i in range(2)]
    [out] = teardown_op.on_hosts([h], REQ, {})
    assert out.error is None and out.value.code == 0, out.value.doc
    assert not any(alive(w) for w in workers)
    assert set(workers) <= _signalled(audit_log.read())


def test_the_epilogs_teardown_keeps_no_local_audit_copy(ps):
    """audit=False (the Slurm epilog: the agent's own record on the node is the log): the
    teardown still signals, and nothing is appended to the local audit log."""
    worker = ps.role("worker", "--gpu", "0")
    r = teardown_op.on_host(host(ps), REQ, audit=False)
    assert r.code == 0 and worker in {a["pid"] for a in r.result.actions}, r.doc
    assert not alive(worker)
    assert audit_log.read() == []


def test_a_host_that_cannot_be_planned_stops_the_approval(ps):
    """What was not planned cannot be approved: the failed host's error is raised and nothing
    is signalled on the host that answered."""
    worker = ps.role("worker", "--gpu", "0")
    broken = build_host("gpu9", {"PYTHON": "/nonexistent/python3", "DEVICES": ps.glob}, "test")
    outcomes = teardown_op.plans([host(ps), broken], requests.Plan())
    assert outcomes[0].error is None and outcomes[1].failure.kind == "agent error"
    with pytest.raises(AgentError, match="gpu9"):
        teardown_op.approvals(outcomes)
    assert alive(worker)


class _Shown:
    def __init__(self):
        self.updates: list = []
        self.closed = 0

    def update(self, p: dict) -> None:
        self.updates.append(p)

    def done(self) -> None:
        self.closed += 1


def test_each_hosts_progress_is_shown_and_closed_even_when_its_call_fails(ps):
    worker = ps.role("worker", "--gpu", "0")
    broken = build_host("gpu9", {"PYTHON": "/nonexistent/python3", "DEVICES": ps.glob}, "test")
    shown = {"local": _Shown(), "gpu9": _Shown()}
    ok, failed = teardown_op.on_hosts([host(ps), broken], REQ, {}, progress_for=lambda h: shown[h.alias])
    assert ok.error is None and isinstance(failed.error, AgentError)
    assert any(p.get("phase") == "sigterm" for p in shown["local"].updates), shown["local"].updates
    assert shown["local"].closed == 1 and shown["gpu9"].closed == 1
    assert not alive(worker)


def test_the_callers_budget_replaces_the_requests_deadline(ps):
    """The epilog's budget, not the request's waits: a target that ignores SIGTERM under a
    30 s grace outlives a 2 s budget, and the call says the host timed out."""
    stubborn = ps.role("worker", "--gpu", "0", "--ignore-term")
    req = requests.Teardown(grace=30, timeout=10)
    assert req.deadline_s() > 30
    with pytest.raises(HostTimedOut):
        teardown_op.on_host(host(ps), req, deadline_s=2.0, audit=False)
    assert alive(stubborn)


def test_ansible_carries_the_teardown_and_in_check_mode_its_plan():
    """Check mode sends the plan: the selection alone, nothing that signals or waits."""
    req = requests.Teardown(grace=3, match=("vllm",), operator="ansible")
    plan = teardown_op.carried(req, check_mode=True)
    args = [str(a) for a in plan.argv()]
    assert (plan.name, plan.deadline_s()) == ("plan", BASE_DEADLINE_S)
    assert "--match=vllm" in args and "--grace" not in args and "--operator" not in args
    teardown = teardown_op.carried(req, check_mode=False)
    args = teardown.argv()
    assert teardown.name == "teardown" and args[args.index("--grace") + 1] == 3
    assert teardown.deadline_s() == req.deadline_s()
