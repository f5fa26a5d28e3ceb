"""Shared fixtures: a real loopback sshd (plain and noisy), hosts.env files, invoke runner."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.loopback_sshd import LoopbackSshd
from tests.procs import ProcessSet
from tests.second_user import second_user  # noqa: F401  (fixture: a real second user, for every test module)

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures" / "h200-driver580"  # real H200 captures; see tests/fixtures/README.md
VENV_BIN = Path(sys.executable).parent
MOTD = "echo 'Welcome to gpu-node (MOTD noise)'; echo '=====gpu-pivot-result fake begin====='\n"



@pytest.fixture(scope="session", autouse=True)
def _isolated_state(tmp_path_factory):
    """Keep ssh sockets, audit logs and the sandbox of the test run in its own temp dirs."""
    base = tmp_path_factory.mktemp("state")
    saved = dict(os.environ)
    os.environ["GPU_PIVOT_CONTROL_DIR"] = str(base / "cm")
    os.environ["XDG_STATE_HOME"] = str(base / "xdg")
    os.environ["GPU_PIVOT_SANDBOX_DIR"] = str(base / "sandbox")
    os.environ["GPU_PIVOT_RUN_DIR"] = str(base / "run")
    os.environ["PATH"] = f"{VENV_BIN}:{os.environ['PATH']}"
    yield base
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture(scope="session")
def sshd(tmp_path_factory, _isolated_state):
    # The far side's agent keeps last.json, its audit log and its lock in the test's dir.
    server = LoopbackSshd(tmp_path_factory.mktemp("sshd"),
                          env={"GPU_PIVOT_RUN_DIR": str(_isolated_state / "remote-run")}).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def noisy_sshd(tmp_path_factory, sshd):
    server = LoopbackSshd(tmp_path_factory.mktemp("noisy"), noise=MOTD, keys_from=sshd).start()
    yield server
    server.stop()


@pytest.fixture
def hosts_env(tmp_path, monkeypatch):
    """Write a hosts.env and point GPU_PIVOT_HOSTS_FILE at it; returns the writer."""
    path = tmp_path / "hosts.env"

    def write(text: str) -> Path:
        path.write_text(text)
        monkeypatch.setenv("GPU_PIVOT_HOSTS_FILE", str(path))
        return path

    return write


def invoke(*args, env=None, input=None, timeout=120) -> subprocess.CompletedProcess:
    """Run the real `invoke` CLI of this repo; bytes in, bytes out."""
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=REPO, capture_output=True, input=input,
                          env=env or os.environ.copy(), timeout=timeout)


@pytest.fixture
def ps(tmp_path):
    """A set of processes the test starts in its own temp dir; ended by PID at the end."""
    procs = ProcessSet(tmp_path)
    yield procs
    procs.kill_all()


@pytest.fixture
def shared_ps():
    """A process set in a directory another user can read and open the devices in (a test's
    tmp_path is 0700): for the cases about a second user."""
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="gp-shared-", dir="/tmp"))
    os.chmod(base, 0o755)
    procs = ProcessSet(base)
    os.chmod(procs.devdir, 0o755)
    for f in procs.devdir.iterdir():
        os.chmod(f, 0o666)
    yield procs
    procs.kill_all()
    subprocess.run(["rm", "-rf", str(base)])
