"""The teardown's first SIGTERM batch (scripts/agent/early.py): what a target pattern names goes
out as soon as every process's record is read, before the fd tables and maps are; the rest of
the plan (holders no pattern names) follows once the scan is complete, and the plan states both.
Every process is started here and scoped by the test's temp dir (fake devices + --scope)."""
from __future__ import annotations

import dataclasses
import os

from scripts.agent import cgroup, cli, early, plan, procscan, scan
from scripts.hostconfig import build_host
from scripts.transport import call_agent
from tests import scenario
from tests.procs import alive

TARGETS = r"sandbox_roles\.py|sglang\.launch_server"


def _teardown(ps, *extra):
    keys = dict(scenario.host_keys(ps), TARGETS=r"sglang\.launch_server")  # the orphan's sandbox_roles.py: not named
    host = dataclasses.replace(build_host("local", keys, "test"), fake_gpus=str(ps.memdir))
    return call_agent(host, "teardown", ["--grace", "2", "--timeout", "10", "--settle", "0.5", *extra])


def test_pattern_targets_go_first_and_the_orphan_holder_with_the_plan(ps):
    ready = ps.base / f"ready{ps.n + 1}"
    server = scenario._server(ps, "--tp", "2", "--memdir", str(ps.memdir))
    workers = [int(p) for p in ready.read_text().split()]  # its tree: named by nothing but their parent
    orphan = scenario._orphan(ps)  # holds GPU 0, named by no pattern: found by the fd scan only
    res = _teardown(ps)
    doc = res.doc
    assert res.code == 0, doc["problems"]
    assert doc["timings"]["early_batch"] == 3, doc["timings"]  # the server and its two workers
    assert doc["timings"]["sigterm_s"] <= doc["timings"]["plan_sigterm_s"]
    sigterms = [a["pid"] for a in doc["actions"] if a["signal"] == "SIGTERM"]
    assert sorted(sigterms[:3]) == sorted([server, *workers]) and orphan in sigterms[3:], doc["actions"]
    reasons = {t["pid"]: t["reason"] for t in doc["plan"]["targets"]}
    assert "target pattern" in reasons[server] and reasons[orphan].startswith("holds a GPU")
    assert not alive(server) and not alive(orphan)


def test_the_early_batch_signals_only_what_the_operator_approved(ps):
    server = scenario._server(ps, "--tp", "1", "--memdir", str(ps.memdir))
    orphan = scenario._orphan(ps)
    start = procscan.basic(orphan)["start_time"]
    res = _teardown(ps, "--approved", f"{orphan}:{start}")
    assert "early_batch" not in res.doc["timings"], res.doc["timings"]
    assert [a["pid"] for a in res.doc["actions"] if a["signal"].startswith("SIG")] == [orphan]
    assert alive(server)  # in the plan, not approved: never signalled
    assert any(u["pid"] == server for u in res.doc["unapproved"])


def _args(ps, *extra):
    return cli.build_parser().parse_args(["teardown", "--devices", ps.glob, "--fake-devices", "--target", TARGETS,
                                          "--scope", str(ps.base), *extra])


def _marked(args, pids):
    mark = scan._target_mark(args)
    out = []
    for pid in pids:
        info = procscan.basic(pid)
        info["mark"] = mark(info)
        out.append(info)
    return out


def test_a_process_in_a_service_unit_or_a_container_is_left_to_the_full_plan(ps, monkeypatch):
    """Its manager may have to stop it (a direct SIGTERM races the stop: Restart=always)."""
    plain, in_unit, in_container = (ps.role("worker", "--gpu", str(i % 2)) for i in range(3))
    args = _args(ps)
    real = cgroup.read

    def read(pid, proc="/proc"):
        cg = dict(real(pid, proc))
        if pid == in_unit:
            cg["unit"] = "vllm.service"
        if pid == in_container:
            cg["container"] = {"kind": "docker", "id": "a" * 64}
        return cg

    monkeypatch.setattr(cgroup, "read", read)
    rows = early.pick(_marked(args, [plain, in_unit, in_container]), args, None)
    assert [r["pid"] for r in rows] == [plain]
    assert rows[0]["via"] == "signal"


def test_the_early_batch_takes_what_the_plan_takes_by_pattern_and_nothing_else(ps):
    """Out of scope, protected, this agent's own chain or not named: never in it."""
    named = ps.role("worker", "--gpu", "0")
    protected = ps.role("hold", title="nvidia-persistenced")
    args = _args(ps)
    records = _marked(args, [named, protected, os.getpid()])
    records[2]["mark"] = "pretend a pattern named the agent's own chain"
    rows = early.pick(records, args, None)
    assert [r["pid"] for r in rows] == [named]
    out_of_scope = _args(ps, "--scope", "no-such-scope-text")
    assert early.pick(_marked(out_of_scope, [named]), out_of_scope, None) == []


def test_the_plan_states_every_early_target_even_one_gone_before_the_full_scan(ps):
    args = _args(ps)
    worker = ps.role("worker", "--gpu", "0")
    rows = early.pick(_marked(args, [worker]), args, None)
    merged = early.merge({"targets": []}, rows)
    assert [t["pid"] for t in merged["targets"]] == [worker]
    again = early.merge({"targets": list(rows)}, rows)
    assert len(again["targets"]) == 1
    assert early.as_plan(rows, args)["rules"] == list(plan.RULES)
