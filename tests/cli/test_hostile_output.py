"""Output errors have their own answers, each on the input that broke it.

- Invoke's own `--list`, `--help`, `--version`, `teardown --help` into `head -c 10`: a
  BrokenPipeError traceback and exit 1. Now: quiet, 141 (128 + SIGPIPE, a shell's closed pipe).
- `> /dev/full` (ENOSPC): a traceback and exit 1 ("not free") after a teardown that freed the
  GPUs. Now: one line on stderr naming the task's own code, exit 10; the host's record intact.
- A task's reader closing the pipe still changes nothing: it runs to its end with its own code
  (tests/cli/test_console_trust.py).
The SANDBOX host used here lives in the test's temp dir; its processes are ended by `sandbox down`.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from scripts.agent.wire import codes
from scripts.cli import output_guard
from tests.conftest import REPO, invoke

OWN = [["--list"], ["--help"], ["--version"], ["teardown", "--help"]]


def test_the_guard_and_the_contract_agree():
    assert output_guard.CLOSED_PIPE == codes.EXIT_CLOSED_PIPE == 141
    assert output_guard.OUTPUT_FAILED == codes.EXIT_OUTPUT == 10


def closed_pipe_run(args, env=None):
    """`invoke ARGS` with stdout a pipe whose reader has already gone: every write is EPIPE."""
    r, w = os.pipe()
    os.close(r)
    try:
        return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=REPO, stdout=w, stderr=subprocess.PIPE,
                              env=env or os.environ.copy(), timeout=60)
    finally:
        os.close(w)


@pytest.mark.parametrize("args", OWN)
@pytest.mark.parametrize("unbuffered", ["1", ""])
def test_invokes_own_output_into_a_closed_pipe_is_quiet_141(args, unbuffered):
    res = closed_pipe_run(args, env=dict(os.environ, PYTHONUNBUFFERED=unbuffered))
    assert res.returncode == 141 and res.stderr == b"", (res.returncode, res.stderr)


@pytest.mark.parametrize("args", OWN)
def test_invokes_own_output_into_head_c_10_never_tracebacks(args):
    res = subprocess.run(f"{sys.executable} -m invoke {' '.join(args)} | head -c 10 >/dev/null; "
                         "echo ${PIPESTATUS[0]}", shell=True, executable="/bin/bash", cwd=REPO, capture_output=True,
                         env=dict(os.environ, PYTHONUNBUFFERED="1"), timeout=60)
    assert res.stdout.decode().strip() in ("0", "141") and res.stderr == b"", res


@pytest.mark.parametrize("args", OWN)
@pytest.mark.parametrize("unbuffered", ["1", ""])
def test_invokes_own_output_to_a_full_disk_is_one_line_and_10(args, unbuffered):
    with open("/dev/full", "w") as full:
        res = subprocess.run([sys.executable, "-m", "invoke", *args], cwd=REPO, stdout=full, stderr=subprocess.PIPE,
                             env=dict(os.environ, PYTHONUNBUFFERED=unbuffered), timeout=60)
    assert res.returncode == codes.EXIT_OUTPUT, res.stderr
    assert res.stderr.decode().splitlines() == [
        "gpu-pivot: the output could not be written (No space left on device); nothing else was done"]


def test_the_venv_answers_version_through_its_pth_file():
    """`invoke --version` is answered before tasks.py loads: only the .pth that `make setup`
    writes reaches it. The venv's own `invoke` script, as people run it."""
    pth = [p for p in sys.path if p.endswith("site-packages")]
    if not any(os.path.exists(os.path.join(p, output_guard.PTH_NAME)) for p in pth):
        pytest.skip("this venv was made before `make setup` wrote the .pth (run `make setup`)")
    r, w = os.pipe()
    os.close(r)
    try:
        res = subprocess.run([os.path.join(os.path.dirname(sys.executable), "invoke"), "--version"], cwd=REPO,
                             stdout=w, stderr=subprocess.PIPE, timeout=60)
    finally:
        os.close(w)
    assert res.returncode == 141 and res.stderr == b""


def test_the_pth_line_runs_the_guard_only_for_invoke(tmp_path):
    site_dir = tmp_path / "site"
    site_dir.mkdir()
    path = output_guard.write_pth(str(site_dir))
    line = open(path).read()
    assert line.startswith("import ") and line.count("\n") == 1
    cases = ((["python", "-m", "invoke", "--version"], True), (["/v/bin/python", "/v/bin/invoke"], True),
             (["python", "-m", "pytest"], False), (["python", "-c", "pass"], False), (["python"], False))
    for argv, installed in cases:
        code = ("import sys; sys.orig_argv = %r\n%s\nprint(getattr(sys, '_gpu_pivot_output_guard', False))"
                % (argv, line))
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
        assert out.stdout.strip() == str(installed), (argv, out.stderr)


# -- a task's stdout on a full disk ---------------------------------------------------------------

def _sandbox_env(tmp_path):
    return dict(os.environ, GPU_PIVOT_SANDBOX_DIR=str(tmp_path / "sb"), XDG_STATE_HOME=str(tmp_path / "state"))


def to_full_disk(args, env):
    with open("/dev/full", "w") as full:
        return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=REPO, stdout=full,
                              stderr=subprocess.PIPE, env=env, timeout=120)


@pytest.mark.parametrize("json_flag", [[], ["--json"]])
def test_a_teardown_whose_stdout_is_full_ends_10_and_its_record_stands(tmp_path, json_flag):
    env = _sandbox_env(tmp_path)
    assert invoke("sandbox", "up", env=env).returncode == 0
    try:
        server = json.loads(invoke("sandbox", "status", "--json", env=env).stdout)["processes"]["server"]["pid"]
        res = to_full_disk(["teardown", "-H", "sandbox", "--yes", *json_flag], env)
        assert res.returncode == codes.EXIT_OUTPUT, res.stderr
        assert b"Traceback" not in res.stderr
        lines = res.stderr.decode().splitlines()
        assert lines[-1].startswith("gpu-pivot: the output could not be written (No space left on device); "
                                    "the task ran to its end with exit 0 (ok)"), lines
        status = json.loads(invoke("status", "-H", "sandbox", "--json", env=env).stdout)["sandbox"]
        last = status["last_teardown"]
        assert (last["state"], last["exit_code"]) == ("finished", 0)
        audit = [json.loads(x) for x in (tmp_path / "state" / "gpu-pivot" / "audit.jsonl").read_text().splitlines()]
        assert any(r["pid"] == server and r["signal"] == "SIGTERM" and r["result"] == "sent" for r in audit)
        assert not os.path.exists(f"/proc/{server}") or open(f"/proc/{server}/stat").read().split()[2] in "ZX"
    finally:
        invoke("sandbox", "down", env=env)


@pytest.mark.parametrize("args", [["status", "-H", "sandbox"], ["hosts"], ["audit"], ["version", "--json"]])
def test_any_task_whose_stdout_is_full_ends_10_with_one_line(tmp_path, args):
    res = to_full_disk(args, _sandbox_env(tmp_path))
    assert res.returncode == codes.EXIT_OUTPUT and b"Traceback" not in res.stderr, res.stderr
    assert len(res.stderr.decode().splitlines()) == 1


def test_the_answers_are_documented():
    """In the docs, and in the one table every task's --help lists its codes from."""
    readme = " ".join((REPO / "docs" / "verdicts-and-exit-codes.md").read_text().split())
    table = {code: words for code, _, words in codes.EXIT_CODES}
    assert "10 stdout could not be written" in readme and table[10].startswith("stdout could not be written")
    assert "141 (128 + SIGPIPE" in readme and table[141].startswith("the reader closed the pipe")
    tasks_md = " ".join((REPO / "docs" / "tasks.md").read_text().split())
    assert "U+EF80..U+EFFF" in tasks_md and "lone surrogate" in tasks_md
