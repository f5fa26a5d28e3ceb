"""`invoke status` / `invoke verify` on the sandbox host, as an operator runs them."""
import json

import pytest

from tests.conftest import invoke, sandbox_session


@pytest.fixture
def sandbox():
    yield from sandbox_session()


def test_status_shows_holders_and_protected(sandbox):
    out = invoke("status", "--host", "sandbox")
    assert out.returncode == 0, out.stderr
    text = out.stdout.decode()
    assert "[SANDBOX: fake GPUs on this machine]" in text
    procs = sandbox["processes"]
    for role in ("server", "worker0", "worker1", "persistenced", "monitor"):
        assert str(procs[role]["pid"]) in text
    assert str(procs["bystander"]["pid"]) not in text  # holds no GPU: not a holder
    lines = {line.split()[0]: line for line in text.splitlines() if line.strip() and line.split()[0].isdigit()}
    assert "PROTECTED" in lines[str(procs["persistenced"]["pid"])]
    assert "PROTECTED" in lines[str(procs["monitor"]["pid"])]
    assert "PROTECTED" not in lines[str(procs["worker0"]["pid"])]


def test_status_json_and_verify_not_free(sandbox):
    doc = json.loads(invoke("status", "--host", "sandbox", "--json").stdout)["sandbox"]
    assert doc["gpu_source"] == "sandbox (fake GPUs)"
    assert [g["used_mib"] for g in doc["gpus"]] == [20480, 20480]
    out = invoke("verify", "--host", "sandbox", "--wait", "0.2")
    assert out.returncode == 1
    assert b"NOT FREE" in out.stdout and b"Still holding" in out.stdout


def test_verify_bad_wait_is_bad_input():
    out = invoke("verify", "--host", "sandbox", "--wait", "soon")
    assert out.returncode == 2
    assert out.stderr.decode().strip() == "gpu-pivot: --wait 'soon': not a number of seconds"
