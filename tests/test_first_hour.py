"""Issue 27: the first hour and the 3 a.m. hour, README to runbook without a snag.

Each test names the numbered item of the issue's "What was seen" it covers. The runbooks
that run as printed are in tests/test_runbooks.py; `make bench`'s mechanics in
tests/test_bench_mechanics.py.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

from scripts.agent import contract
from tests import scenario
from tests.conftest import REPO, invoke
from tests.procs import wait_for


def text_of(res) -> str:
    return (res.stdout + res.stderr).decode(errors="replace")


# -- 11. GPU_PIVOT_SANDBOX_DIR must be absolute ------------------------------------------------------

def test_relative_sandbox_dir_is_refused_with_one_line(tmp_path):
    """Item 11: a relative GPU_PIVOT_SANDBOX_DIR made the sandbox inside the checkout."""
    env = dict(os.environ, GPU_PIVOT_SANDBOX_DIR="sb-relative")
    for args in (["sandbox", "up"], ["status", "--host", "sandbox"], ["hosts"]):
        res = subprocess.run([sys.executable, "-m", "invoke", "--search-root", str(REPO), *args], cwd=tmp_path,
                             env=env, capture_output=True, timeout=60)
        assert res.returncode == contract.EXIT_USAGE, (args, text_of(res))
        lines = res.stderr.decode().splitlines()
        assert len(lines) == 1 and "GPU_PIVOT_SANDBOX_DIR='sb-relative': must be an absolute path" in lines[0], lines
        assert res.stdout == b""
    assert list(tmp_path.iterdir()) == []  # nothing made where the task ran
    assert not (REPO / "sb-relative").exists()


# -- 6. status during a running teardown: "running", never "exit None" --------------------------------

def test_last_teardown_line_running_has_no_exit_code():
    from scripts import status_view

    running = status_view.last_teardown(SimpleNamespace(last_teardown={
        "state": "running", "started": "2026-01-01T10:00:00+0000", "operator": "ana@laptop", "exit_code": None}))
    assert "running" in running and "exit" not in running and "None" not in running
    interrupted = status_view.last_teardown(SimpleNamespace(last_teardown={
        "state": "interrupted", "verdict": "the agent stopped", "exit_code": None, "started": "t0"}))
    assert "None" not in interrupted and "interrupted" in interrupted
    done = status_view.last_teardown(SimpleNamespace(last_teardown={
        "state": "done", "verdict": "freed", "exit_code": 0, "finished": "t1", "operator": "ana@laptop"}))
    assert "exit 0" in done and "by ana@laptop at t1" in done


def test_status_during_a_running_teardown_says_running(ps, hosts_env):
    """Item 6, end to end: a teardown waiting out the grace of a server that ignores SIGTERM."""
    server, workers = ps.server("--ignore-term")
    hosts_env(scenario.env_lines(ps, "local").replace(scenario.target_pattern(ps), r"sandbox_roles\.py"))
    teardown = subprocess.Popen([sys.executable, "-m", "invoke", "teardown", "--host", "local", "--yes", "--grace",
                                 "60"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        def running():
            doc = json.loads(invoke("status", "--host", "local", "--json").stdout)["local"]
            return (doc.get("last_teardown") or {}).get("state") == "running"

        wait_for(running, "the teardown's running record", timeout=60)
        res = invoke("status", "--host", "local")
        line = next(x for x in res.stdout.decode().splitlines() if x.startswith("Last teardown"))
        assert "running" in line and "None" not in line and "exit" not in line, line
    finally:
        ps.kill_all()  # the server goes; the teardown then ends on its own
        teardown.communicate(timeout=120)
