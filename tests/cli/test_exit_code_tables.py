"""Each task's `-h` lists the exit codes that task can give, with what each means for it.

Why: `status -h` listed "1 done but not free" while status exits 0 on GPUs held (it shows,
verify judges) and 1 only when no GPU is visible; `pivot -h` left out 11, which a pivot whose
teardown left a starter alive returns; `audit -h` and `sandbox -h` spoke of teardown and
verify. Here every task's table is read from its real `-h`, and every code a real run gives
(on the SANDBOX host, a host with no GPU visible, a host whose ssh port is closed, bad input)
must be in its task's table, with the task's own meaning where the code means less there.
"""
from __future__ import annotations

import os
import re

import pytest

import tasks
from scripts.agent.wire import codes
from tests.conftest import invoke, sandbox_session

NUMBER = {name: code for code, name, _ in codes.EXIT_CODES}
HOSTS = ("DEAD_SSH=root@127.0.0.1\nDEAD_SSH_OPTS=-p 9 -o ConnectTimeout=5\n"
         "NOGPU_DEVICES=/nonexistent/nvidia*\n")
DEAD = ["--host", "dead"]


@pytest.fixture(scope="module")
def sandbox():
    yield from sandbox_session()


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    path = tmp_path_factory.mktemp("exit-tables") / "hosts.env"
    path.write_text(HOSTS)
    return dict(os.environ, GPU_PIVOT_HOSTS_FILE=str(path), COLUMNS="100")


def help_table(task: str, env: dict) -> dict:
    """{code: meaning} from `invoke TASK -h`'s "Exit codes:" section ("any" for a task that
    passes on a command's own code)."""
    res = invoke(task, "-h", env=env)
    assert res.returncode == 0, res.stderr
    text = res.stdout.decode()
    section = text.split("Exit codes:\n", 1)[1].split("\n\n", 1)[0]
    lines = section.splitlines()
    indent = len(lines[0]) - len(lines[0].lstrip())  # an entry's code; its wrapped meaning goes deeper
    table: dict = {}
    last = None
    for line in lines:
        m = re.match(r" {%d}(\d+|any)\s+(.*)" % indent, line)
        if m:
            last = m.group(1) if m.group(1) == "any" else int(m.group(1))
            table[last] = m.group(2)
        else:
            table[last] += " " + line.strip()
    return table


def test_every_tasks_help_lists_exactly_the_codes_it_declares(env):
    for name, task in tasks.ns.tasks.items():
        listed = help_table(name, env)
        declared = {NUMBER[n] for n in task.exit_codes if n != "own"} | ({"any"} if "own" in task.exit_codes else set())
        assert set(listed) == declared, (name, sorted(map(str, listed)), sorted(map(str, declared)))
        if name not in ("teardown", "verify", "pivot"):
            assert "teardown" not in listed[0] and "verify" not in listed[0], (name, listed[0])


# (task, argv after the task name): what a real run on these hosts exits with
RUNS = [
    ("status", ["--host", "sandbox"]), ("status", ["--host", "nogpu"]), ("status", DEAD),
    ("verify", ["--host", "sandbox"]), ("verify", ["--host", "nogpu"]), ("verify", DEAD),
    ("plan", ["--host", "sandbox"]), ("plan", DEAD),
    ("ping", ["--host", "sandbox"]), ("ping", DEAD),
    ("run", ["--host", "sandbox", "--", "sh", "-c", "exit 42"]), ("run", DEAD + ["--", "true"]),
    ("hosts", []), ("audit", ["--lines", "3"]), ("version", []), ("oneliner", ["--host", "sandbox"]),
    ("sandbox", ["status"]), ("logs", ["--host", "sandbox", "--phase", "train"]),
    ("teardown", DEAD + ["--yes"]), ("reset", DEAD + ["--gpu", "0"]),
    ("lint-launch", DEAD + ["--", "python3", "-m", "sglang.launch_server", "--tp", "2"]),
    ("stop", ["--host", "sandbox", "--phase", "train"]),
]


def test_every_code_a_real_run_gives_is_in_its_tasks_table(sandbox, env):
    seen = []
    for name, argv in RUNS + [(name, ["--no-such-flag"]) for name in tasks.ns.tasks]:
        res = invoke(name, *argv, env=env, timeout=120)
        seen.append((name, argv, res.returncode))
    tables = {name: help_table(name, env) for name in tasks.ns.tasks}
    missing = [(name, argv, code) for name, argv, code in seen
               if code not in tables[name] and "any" not in tables[name]]
    assert not missing, missing
    # the runs reached what they were meant to: each code these hosts give came out
    assert {(n, c) for n, a, c in seen} >= {("status", 0), ("status", 1), ("status", 3), ("verify", 1),
                                            ("run", 42), ("teardown", 3), ("hosts", 2)}


def test_status_says_it_exits_1_only_when_no_gpu_is_visible(sandbox, env):
    """GPUs held are shown, not judged: exit 0 on the SANDBOX's held GPUs, 1 where none is
    visible, and its table says so (not "done but not free")."""
    table = help_table("status", env)
    assert "no GPU visible" in table[1] and "not free" not in table[1], table[1]
    assert invoke("status", "--host", "sandbox", env=env).returncode == 0
    assert invoke("verify", "--host", "sandbox", env=env).returncode == codes.EXIT_NOT_FREE


def test_pivot_lists_the_middle_verdict_its_teardown_can_return(env):
    table = help_table("pivot", env)
    assert codes.EXIT_STARTER_ALIVE in table and "nothing started" in table[codes.EXIT_STARTER_ALIVE], table
