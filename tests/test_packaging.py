"""`pip install .` from a clean venv installs what runs: every package under scripts/ (the CLI's
tasks, the agent) and tasks.py, and `invoke --list` works with it in the checkout."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tests.support.paths import REPO

# pip reaches the package index: on the xdist worker left in the machine's network namespace
# (the others have only a loopback of their own, tests/support/pidns.py)
pytestmark = pytest.mark.host_pid_ns


def test_pip_install_dot_gives_a_working_cli(tmp_path):
    src = tmp_path / "src"  # a copy: a build writes build/ and *.egg-info beside the sources
    tracked = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z"], capture_output=True, check=True).stdout
    for name in filter(None, tracked.decode().split("\0")):
        if (REPO / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, src / name)
    venv = tmp_path / "venv"  # without a pip of its own: this pip installs into it (--python),
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)  # 5 s of CPU less
    pip = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
                          "--disable-pip-version-check", str(src)], capture_output=True, text=True, timeout=600)
    if pip.returncode and "No matching distribution" in pip.stderr and os.environ.get("CI") != "true":
        pytest.skip(f"no package index here to build with: {pip.stderr.strip().splitlines()[-1]}")
    assert pip.returncode == 0, pip.stderr[-2000:]
    python = str(venv / "bin" / "python")
    listed = subprocess.run([python, "-m", "invoke", "--list"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0 and "teardown" in listed.stdout, listed.stderr
    # installed, not read from the checkout: every package of the CLI and the agent is in the wheel
    # the packages of each layer, the agent's subpackages, the bundle built from the installed
    # agent, and the files read beside the code (the emergency teardown's script)
    code = ("import scripts, tasks, scripts.cli.gpu, scripts.cli.phases, scripts.agent.cli, scripts.config.hosts, "
            "scripts.views.teardown, scripts.ops.pivot, scripts.engines.slurm_job, scripts.agent.teardown.run; "
            "from scripts.reach import bundle; from scripts.emergency import shell_teardown; "
            "assert 'agent.procs.procscan' in bundle.agent_sources(stripped=False); "
            "assert shell_teardown.SCRIPT.is_file(), shell_teardown.SCRIPT; "
            "print(scripts.__file__)")
    where = subprocess.run([python, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert where.returncode == 0, where.stderr
    assert str(venv) in where.stdout
    # the console script: the tasks from a folder with no tasks.py, with their help and exit codes
    hosts = subprocess.run([str(venv / "bin" / "gpu-pivot"), "hosts"], cwd=tmp_path, capture_output=True, text=True,
                           timeout=120)
    assert hosts.returncode == 0 and "sandbox" in hosts.stdout, hosts.stderr
    typo = subprocess.run([str(venv / "bin" / "gpu-pivot"), "teardwon"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert typo.returncode == 2 and "teardown" in typo.stderr, typo.stderr


def test_the_operators_make_targets_install_the_runtime_only(tmp_path):
    """`make pivot-train`, `make status`, `make teardown`: the runtime requirements, never the
    test toolchain (pytest, mypy, ruff, ansible-core: 11 s of a 13 s pivot, minutes on a slow
    network). Read from make's own plan (-n) for a venv that does not exist yet."""
    for target in ("pivot-train", "pivot-datagen", "pivot-deploy", "status", "teardown", "demo"):
        plan = subprocess.run(["make", "-n", target, f"VENV={tmp_path / 'venv'}"], cwd=REPO, capture_output=True,
                              text=True, timeout=60)
        assert plan.returncode == 0, plan.stderr
        assert "-r requirements.txt" in plan.stdout, (target, plan.stdout)
        assert "requirements-dev.txt" not in plan.stdout, (target, plan.stdout)
