"""The tests' CLI runner (tests/support/cli_zygote.py) gives what a real `python -m invoke`
start gives: the same stdout, stderr and exit code for the same argv, environment and stdin;
and it starts a real interpreter where the environment changes how Python starts."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.support import cli_zygote


def real(args, env, input=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=REPO, capture_output=True, input=input,
                          env=env, timeout=120)


@pytest.mark.parametrize("args,input", [
    (["--list"], None),
    (["teardown", "-h"], None),
    (["status", "--host", "no-such-alias"], None),  # a usage error: one line, exit 2
    (["hosts", "--json"], None),
    (["run", "--host", "local", "--", "sh", "-c", "cat; printf 'e\\001' >&2; exit 7"], b"in\x00\xff\n"),
], ids=["list", "help", "usage-error", "hosts-json", "run-bytes-and-code"])
def test_a_forked_cli_answers_as_a_started_one(hosts_env, args, input):
    hosts_env("GPU1_SSH=root@192.0.2.10\n")
    env = os.environ.copy()
    forked = cli_zygote.run_cli(args, REPO, env, input, 120)
    started = real(args, env, input)
    assert (forked.returncode, forked.stdout, forked.stderr) == (started.returncode, started.stdout, started.stderr)


def test_the_environment_reaches_the_forked_cli(hosts_env):
    hosts_env("GPU1_SSH=root@192.0.2.10\n")
    env = dict(os.environ, COLUMNS="40", GPU_PIVOT_EXTRA_MARK="x")
    forked = cli_zygote.run_cli(["run", "--host", "local", "--", "sh", "-c", "echo $GPU_PIVOT_EXTRA_MARK; pwd"],
                                REPO, env, None, 120)
    assert forked.stdout.decode().split() == ["x", str(REPO)]


def test_a_start_that_differs_is_a_real_interpreter():
    """PYTHON* and locale keys change how Python starts: such a call is this process's own child."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONIOENCODING"}
    assert cli_zygote.exec_reasons(env) == []
    assert cli_zygote.exec_reasons(dict(env, PYTHONIOENCODING="latin-1")) == ["PYTHONIOENCODING"]
    parent_of_cli = ["run", "--host", "local", "--", "sh", "-c", "ps -o ppid= -p $PPID"]
    forked = cli_zygote.run_cli(parent_of_cli, REPO, env, None, 120)
    started = cli_zygote.run_cli(parent_of_cli, REPO, dict(env, PYTHONIOENCODING="utf-8"), None, 120)
    assert int(started.stdout) == os.getpid() != int(forked.stdout), (started, forked)


def test_a_call_past_its_timeout_is_killed_and_raised():
    with pytest.raises(subprocess.TimeoutExpired):
        cli_zygote.run_cli(["run", "--host", "local", "--", "sleep", "3"], REPO, os.environ.copy(), None, 1)
