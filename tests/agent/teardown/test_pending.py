"""A restart a manager scheduled with no process yet (agent/teardown/pending.py): what the
unit or container will run is read through shells and launchers as the target patterns would
see the process, and the plan a person approves names the pending stop so the teardown runs it.
The real systemd and docker flows: tests/system/test_real_systemd.py, test_real_wrappers.py."""
from __future__ import annotations

from scripts.agent.teardown import pending
from scripts.agent.teardown.run import parse_approved
from scripts.agent.wire import records


def test_what_a_command_runs_is_seen_through_shells_and_launchers():
    assert ["python", "-m", "xsrv.launch_server"] in pending.commands(
        ["/bin/sh", "-c", "exec env A=1 python -m xsrv.launch_server"])
    assert ["vllm", "serve", "m"] in pending.commands(["nice", "-n", "5", "vllm", "serve", "m"])
    # systemd shows ExecStart's words joined: the -c code is every word after it
    joined = "/bin/sh -c cd /srv && exec python3 -m sglang.launch_server --port 3".split()
    assert ["python3", "-m", "sglang.launch_server", "--port", "3"] in pending.commands(joined, joined=True)
    # a launcher's option values and numbers are no program; an argument far down is not one either
    runs = pending.commands(["nice", "-n", "5", "job", "--in", "x", "vllm"])[1:]
    assert all(run[0] not in ("5", "vllm") for run in runs), runs


def test_the_approved_plan_names_its_pending_stops_and_the_teardown_reads_them():
    plan = records.Plan(targets=[{"pid": 7, "start_time": 99}], protected=[],
                        units=[{"unit": "vllm.service", "pids": [], "pending": "auto-restart"},
                               {"unit": "other.service", "pids": [7]}],
                        containers=[{"id": "ab" * 32, "pids": [], "pending": "restarting"}])
    text = plan.approved()
    assert text.split(",") == ["7:99", "unit=vllm.service", "container=" + "ab" * 32]
    assert parse_approved(text) == {(7, 99), ("unit", "vllm.service"), ("container", "ab" * 32)}
