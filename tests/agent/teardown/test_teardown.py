"""Teardown on real process trees holding fake GPU device files (CI has no GPU).

Every teardown here is scoped to the test's own processes: the device glob is the test's
temp dir and the target pattern names the test's server script and dir, so nothing else on
the machine can be planned, let alone signalled.
"""
import json
import os
import signal
import subprocess
import time

import pytest

from scripts.agent.procs import procfs
from scripts.agent.state import lastrun
from scripts.agent.teardown import hostlock
from scripts.agent.wire import requests
from scripts.reach.bundle import agent_stream
from scripts.reach.route import wrap
from scripts.reach.transport import agent_argv
from tests.conftest import invoke
from tests.support import scenario
from tests.support.agent_inproc import run_agent
from tests.support.procs import alive, wait_for
from tests.support.teardowns import assert_outcome, env_file, scenario_host as host


def pattern(ps):
    return scenario.target_pattern(ps)


def test_full_scenario_frees_everything_and_harms_nothing(ps):
    roles = scenario.start(ps)
    started = time.monotonic()
    result = run_agent(host(ps), requests.Teardown(grace=1, timeout=10))
    wall = time.monotonic() - started
    assert result.code == 0, result.doc.get("problems")
    assert_outcome(roles)
    doc = result.doc
    reasons = {t["pid"]: t["reason"] for t in doc["plan"]["targets"]}
    assert set(reasons) == {roles[r] for r in scenario.TARGET_ROLES}
    assert "started by target" in reasons[roles["tokenizer"]]
    assert "in the session of target" in reasons[roles["group_helper"]]
    assert "orphan of PID 1" in reasons[roles["orphan"]] or "holds a GPU" in reasons[roles["orphan"]]
    assert reasons[roles["renamed"]].startswith("holds a GPU")
    assert {p["pid"] for p in doc["plan"]["protected"]} == {roles["persistenced"], roles["monitor"]}
    assert roles["unrelated"] not in reasons
    # audit: one SIGTERM per target, SIGKILL only for the two that ignore SIGTERM, after the grace
    actions = doc["actions"]
    term = {a["pid"] for a in actions if a["signal"] == "SIGTERM" and a["result"] == "sent"}
    kill = {a["pid"] for a in actions if a["signal"] == "SIGKILL" and a["result"] == "sent"}
    assert term == set(reasons)
    assert kill == {roles["stubborn"], roles["stubborn_worker"]}
    assert wall >= 1.0  # the SIGKILLs came after the 1 s grace, never before (a busy machine only adds)
    assert [g["used_mib"] for g in doc["after"]] == [0, 0]
    assert doc["freed_mib"] == 2 * 20480 + 1024
    with open(os.path.join(lastrun.run_dir(), "audit.jsonl")) as f:
        host_audit = [json.loads(line) for line in f]
    assert {(a["pid"], a["signal"]) for a in actions} <= {(a["pid"], a["signal"]) for a in host_audit}


def test_only_matching_leaves_other_holders_and_reports_not_free(ps):
    roles = scenario.start(ps, stubborn=False)
    result = run_agent(host(ps), requests.Teardown(only_matching=True, grace=1, timeout=0.5))
    assert result.code == 1
    left = {p["pid"] for p in result.doc["plan"]["left_alone"]}
    assert left == {roles["orphan"], roles["renamed"]}
    assert alive(roles["orphan"]) and alive(roles["renamed"]) and not alive(roles["server"])
    assert {r["pid"] for r in result.doc["still_holding"]} >= {roles["orphan"], roles["renamed"]}


def test_plan_and_dry_run_signal_nothing(ps, hosts_env):
    roles = scenario.start(ps, stubborn=False)
    env_file(ps, hosts_env)
    out = invoke("plan", "--host", "local")
    assert out.returncode == 0, out.stderr
    assert b"Targets (" in out.stdout and b"Protected, never signalled" in out.stdout
    out = invoke("teardown", "--host", "local", "--dry-run")
    assert out.returncode == 0, out.stderr
    for role, pid in roles.items():
        assert alive(pid), f"{role} was signalled by a dry run"


def test_no_terminal_no_yes_refuses(ps, hosts_env):
    roles = scenario.start(ps, stubborn=False)
    env_file(ps, hosts_env)
    out = invoke("teardown", "--host", "local")
    assert out.returncode == 2
    assert b"refusing to signal anything" in out.stderr
    assert all(alive(pid) for pid in roles.values())


@pytest.mark.parametrize("flag,value", [("--grace", "abc"), ("--timeout", "-1"), ("--match", "sglang(("),
                                        ("--fanout", "0")])
def test_bad_flags_exit2_before_anything(ps, hosts_env, flag, value):
    roles = scenario.start(ps, stubborn=False)
    env_file(ps, hosts_env)
    out = invoke("teardown", "--host", "local", "--yes", flag, value)
    assert out.returncode == 2
    assert len(out.stderr.decode().strip().splitlines()) == 1 and value in out.stderr.decode()
    assert all(alive(pid) for pid in roles.values())


def test_cli_teardown_yes_with_audit(ps, hosts_env):
    from scripts.ops import audit_log
    roles = scenario.start(ps, stubborn=False)
    env_file(ps, hosts_env)
    before = len(audit_log.read())
    out = invoke("teardown", "--host", "local", "--yes", "--grace", "2")
    assert out.returncode == 0, out.stdout.decode() + out.stderr.decode()
    assert b"FREED and verified" in out.stdout
    assert_outcome(roles)
    new = audit_log.read()[before:]
    assert ({r["pid"] for r in new if r["signal"] == "SIGTERM"}
            == {roles[r] for r in scenario.TARGET_ROLES if r in roles})
    assert all(r["alias"] == "local" and r["operator"] for r in new)


def test_lock_held_exit4_names_holder(ps, hosts_env):
    roles = scenario.start(ps, stubborn=False)
    env_file(ps, hosts_env)
    fd = hostlock.acquire("alice@ops")
    try:
        out = invoke("teardown", "--host", "local", "--yes")
    finally:
        hostlock.release(fd)
    assert out.returncode == 4
    assert b"alice@ops" in out.stdout + out.stderr
    assert all(alive(pid) for pid in roles.values())


def test_two_teardowns_at_once_exactly_one_proceeds(ps, hosts_env):
    roles = scenario.start(ps)
    env_file(ps, hosts_env)
    cmd = ["teardown", "--host", "local", "--yes", "--grace", "1"]
    import sys

    from tests.conftest import REPO
    procs = [subprocess.Popen([sys.executable, "-m", "invoke", *cmd], cwd=REPO, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE) for _ in range(2)]
    codes = sorted(p.wait(60) for p in procs)
    for p in procs:
        p.stdout.close()
        p.stderr.close()
    assert codes == [0, 4]
    assert_outcome(roles)


def test_pid_reuse_is_never_hit(ps):
    pid = ps.role("worker")
    start = procfs.start_time(pid)
    assert procfs.signal_if_same(pid, start + 1, signal.SIGKILL) == "reused"
    assert alive(pid)
    assert procfs.signal_if_same(pid, start, signal.SIGKILL) == "sent"
    wait_for(lambda: not alive(pid), "killed")
    assert procfs.signal_if_same(pid, start, signal.SIGKILL) == "gone"


def test_dropped_connection_teardown_finishes_on_host(ps, sshd, tmp_path):
    """Kill the local ssh client during the grace period: the host still finishes."""
    roles = scenario.start(ps)
    h = host(ps, "gpu2", SSH=sshd.dest(), SSH_OPTS=sshd.ssh_opts + " -o ControlPath=none", CTID="129")
    remote_run = sshd.env["GPU_PIVOT_RUN_DIR"]
    last = os.path.join(remote_run, "last.json")
    if os.path.exists(last):
        os.unlink(last)
    argv = wrap(h.route, agent_argv(h, requests.Teardown(grace=3, timeout=10), "n0nce", progress=True))
    client = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    client.stdin.write(agent_stream())  # the transport's argv form (call.BOOT)
    client.stdin.close()
    for line in client.stdout:
        if b'"phase": "grace"' in line:
            break
    client.kill()  # the operator's laptop lid closes
    client.wait()
    assert alive(roles["stubborn"])  # still in its grace period
    doc = wait_for(lambda: _finished(last), "last.json to say finished", timeout=20)
    assert doc["verdict"] == "free" and doc["exit_code"] == 0
    assert_outcome(roles)
    kills = {a["pid"] for a in doc["actions"] if a["signal"] == "SIGKILL"}
    assert kills == {roles["stubborn"], roles["stubborn_worker"]}


def _finished(path):
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return None
    return doc if doc.get("state") == "finished" else None


def test_same_scenario_through_ssh_and_pct_cli(ps, sshd, hosts_env):
    roles = scenario.start(ps, stubborn=False)
    hosts_env(sshd.hosts_env("gpu2", ctid="129", extra=scenario.host_keys(ps)))
    out = invoke("teardown", "--host", "gpu2", "--yes", "--grace", "2")
    assert out.returncode == 0, out.stdout.decode() + out.stderr.decode()
    assert_outcome(roles)
    out = invoke("status", "--host", "gpu2")
    assert b"Last teardown on this host: finished free exit 0" in out.stdout
