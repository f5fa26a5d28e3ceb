"""The invoke CLI as users meet it: --list, --help, `run` byte for byte, exit codes; what
loading the tasks imports; teardown and pivot passing the same teardown flags to the agent."""
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scripts.agent import hostlock, lastrun
from tests import scenario
from tests.conftest import REPO, invoke
from tests.procs import ProcessSet

TASKS = ["hosts", "ping", "run", "oneliner", "sandbox"]


def test_list_names_every_task():
    out = invoke("--list")
    assert out.returncode == 0
    for name in TASKS:
        assert f"  {name} " in out.stdout.decode()


@pytest.mark.parametrize("name", TASKS)
def test_help_explains(name):
    out = invoke(name, "--help")
    assert out.returncode == 0
    text = out.stdout.decode()
    assert "Docstring:" in text and len(text.split("Docstring:")[1].strip()) > 20


def test_every_flag_of_every_task_is_explained():
    """help={} per flag: an option line of `invoke --help TASK` without words after it is a flag
    a person has to guess at."""
    listed = invoke("--list").stdout.decode().splitlines()[2:]
    names = [line.split()[0] for line in listed if line.startswith("  ") and not line.startswith("    ")]
    assert "teardown" in names and "lint-launch" in names
    for name in names:
        text = invoke(name, "--help").stdout.decode()
        options = text.split("Options:", 1)[1].splitlines() if "Options:" in text else []
        bare = [line for line in options if re.match(r"^  -\S", line) and len(re.split(r"\s{2,}", line.strip())) < 2]
        assert not bare, f"{name}: flags without help: {bare}"


@pytest.fixture
def gpu1(sshd, hosts_env):
    hosts_env(sshd.hosts_env("gpu1") + sshd.hosts_env("gpu2", ctid="129"))


@pytest.mark.parametrize("host", ["local", "gpu1", "gpu2"])
def test_run_passes_bytes_and_exit_code(gpu1, host):
    script = "printf 'out\\0\\377\\n'; printf 'err \\001\\n' >&2; exit 7"
    out = invoke("run", "--host", host, "--", "sh", "-c", script)
    assert out.returncode == 7
    assert out.stdout == b"out\x00\xff\n"
    assert out.stderr == b"err \x01\n"


def test_remote_exit_255_is_not_unreachable(gpu1):
    out = invoke("run", "--host", "gpu1", "--", "sh", "-c", "exit 255")
    assert out.returncode == 255
    assert b"unreachable" not in out.stderr


def test_unreachable_host_exit3(hosts_env):
    hosts_env("GPU9_SSH=nobody@127.0.0.1\nGPU9_SSH_OPTS='-p 1 -o ConnectTimeout=3 -o ControlPath=none'\n")
    out = invoke("run", "--host", "gpu9", "--", "true")
    assert out.returncode == 3
    assert b"gpu9: host unreachable" in out.stderr


def test_several_hosts_worst_exit(gpu1):
    out = invoke("run", "--host", "local,gpu1", "--", "sh", "-c", "echo hi; exit 3")
    assert out.returncode == 3
    assert out.stdout.decode().count("hi") == 2
    assert "===== gpu1 =====" in out.stdout.decode()


def test_oneliner_prints_route(gpu1):
    out = invoke("oneliner", "--host", "gpu2", "--", "echo", "it's")
    line = out.stdout.decode().strip()
    assert line.endswith("""'pct exec 129 -- echo '"'"'it'"'"'"'"'"'"'"'"'s'"'"''""")
    assert out.returncode == 0


def test_run_without_command_is_bad_input():
    out = invoke("run", "--host", "local")
    assert out.returncode == 2
    assert b"needs a command after `--`" in out.stderr


# -- start-up: loading the tasks imports none of what they use --------------------------------------


def test_loading_the_tasks_imports_no_transport_config_or_sandbox():
    """`invoke --list` / `--help` load tasks.py; only the task that runs imports the transport,
    hosts.env parsing (dotenv, ClusterShell), the sandbox or the pivot."""
    code = ("import sys, tasks; print('\\n'.join(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('scripts', 'ClusterShell', 'dotenv'))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    loaded = set(out.stdout.split())
    assert loaded == {"scripts", "scripts.cli", "scripts.defaults"} | {
        f"scripts.cli.{m}" for m in ("audit", "common", "gpu", "hosts", "phases", "sandbox", "teardown_args")}, loaded


# -- teardown and pivot: one set of teardown flags, passed the same way to the agent ----------------

TEARDOWN_FLAGS = ["--grace", "1.5", "--timeout", "7", "--wait-lock", "3", "--max-used-mib", "12", "--settle", "0.25"]


@pytest.fixture
def ps(tmp_path):
    procs = ProcessSet(tmp_path / "procs")
    yield procs
    procs.kill_all()


@pytest.fixture
def spied_local(ps, hosts_env, tmp_path):
    """The local host, scoped to the test's own (empty) process set, whose `python` is a
    wrapper that writes the agent's argv to a file and then execs the real interpreter;
    a phase `x` whose gate fails, so a pivot stops (exit 5) right after its teardown."""
    calls = tmp_path / "calls"
    calls.mkdir()
    spy = tmp_path / "spy-python"
    spy.write_text(f'#!/bin/sh\nprintf "%s\\0" "$@" > {calls}/$$\nexec {sys.executable} "$@"\n')
    spy.chmod(0o755)
    hosts_env(scenario.env_lines(ps) + f"LOCAL_PYTHON={spy}\nLOCAL_PHASE_X_CMD='true'\n"
              "LOCAL_PHASE_X_GATES='[\"false\"]'\n")

    def teardown_argvs() -> list:
        """Each agent `teardown` argv since the last call, from its subcommand on."""
        found = []
        for f in sorted(calls.iterdir()):
            argv = f.read_bytes().split(b"\0")[:-1]
            f.unlink()
            if argv[1:2] == [b"teardown"]:
                found.append([a.decode() for a in argv[1:]])
        return found

    return teardown_argvs


def _flag_values(argv: list) -> dict:
    return {flag: argv[argv.index(flag) + 1] for flag in TEARDOWN_FLAGS[::2]}


def test_pivot_passes_the_teardown_flags_as_teardown_does(spied_local):
    out = invoke("teardown", "--host", "local", "--yes", *TEARDOWN_FLAGS)
    assert out.returncode == 0, out.stdout.decode() + out.stderr.decode()
    [by_teardown] = spied_local()
    out = invoke("pivot", "--host", "local", "--to", "x", "--yes", *TEARDOWN_FLAGS)
    text = out.stdout.decode() + out.stderr.decode()
    assert out.returncode == 5, text  # the teardown ran, then the gate `false` failed
    assert "FAIL false" in text and "nothing started" in text
    [by_pivot] = spied_local()
    expected = {"--grace": "1.5", "--timeout": "7.0", "--wait-lock": "3.0", "--max-used-mib": "12", "--settle": "0.25"}
    assert _flag_values(by_pivot) == expected
    assert _flag_values(by_teardown) == expected
    drop_marker = lambda argv: [a for i, a in enumerate(argv) if "--marker" not in argv[i - 1:i + 1]]  # noqa: E731
    assert drop_marker(by_pivot) == drop_marker(by_teardown)  # one builder: the same argv, flag for flag
    assert json.loads(Path(lastrun.last_path()).read_text())["settle_s"] == 0.25  # the agent used it


def test_pivot_wait_lock_waits_for_the_lock(spied_local):
    fd = hostlock.acquire("alice@ops")
    try:
        out = invoke("pivot", "--host", "local", "--to", "x", "--yes")
        assert out.returncode == 4, out.stdout.decode() + out.stderr.decode()
        assert b"alice@ops" in out.stdout + out.stderr
        proc = subprocess.Popen([sys.executable, "-m", "invoke", "pivot", "--host", "local", "--to", "x", "--yes",
                                 "--wait-lock", "20"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        time.sleep(1.5)
        assert proc.poll() is None, proc.communicate()[0].decode()  # still waiting for alice's lock
    finally:
        hostlock.release(fd)
    text = proc.communicate(timeout=60)[0].decode()
    assert proc.returncode == 5, text  # got the lock, tore down, then the gate failed
    assert "teardown: freed" in text


@pytest.mark.parametrize("task", [["teardown"], ["pivot", "--to", "x"]])
def test_off_a_terminal_without_yes_nothing_is_signalled(spied_local, task):
    out = invoke(*task, "--host", "local", input=b"")
    assert out.returncode == 2
    assert out.stderr.decode().startswith("gpu-pivot: not on a terminal and no --yes: refusing to signal anything")
    assert spied_local() == []  # no teardown reached the host


@pytest.mark.parametrize("flag,value", [("--settle", "soon"), ("--wait-lock", "-1"), ("--max-used-mib", "1.5")])
def test_pivot_bad_teardown_flag_is_one_line_exit2(spied_local, flag, value):
    out = invoke("pivot", "--host", "local", "--to", "x", "--yes", flag, value)
    assert out.returncode == 2
    lines = out.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"gpu-pivot: {flag} {value!r}:"), lines
    assert spied_local() == []
