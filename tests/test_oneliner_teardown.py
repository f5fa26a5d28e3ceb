"""The emergency one-liner, printed by `invoke oneliner --action teardown`, run through the
real quoting layers (bash -c -> ssh -> pct exec -> sh -c) against real processes."""
import subprocess

import pytest

from scripts import shell_teardown
from tests import scenario
from tests.conftest import invoke
from tests.procs import ProcessSet, alive


@pytest.fixture
def ps(tmp_path):
    procs = ProcessSet(tmp_path)
    yield procs
    procs.kill_all()


def test_oneliner_through_ssh_and_pct(ps, sshd, hosts_env):
    roles = scenario.start(ps)
    hosts_env(sshd.hosts_env("gpu2", ctid="129", extra={"DEVICES": ps.glob, "FAKE_DEVICES": "yes"}))
    out = invoke("oneliner", "--host", "gpu2", "--action", "teardown", "--grace", "1")
    assert out.returncode == 0, out.stderr
    line = out.stdout.decode().strip()
    assert line.startswith("ssh ") and "pct exec 129 -- sh -c" in line
    assert "pkill" not in line and "fuser -k" not in line and "killall" not in line
    ran = subprocess.run(["bash", "-c", line], capture_output=True, text=True, timeout=60)
    report = shell_teardown.parse_report(ran.stdout)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    gpu_targets = {roles[r] for r in ("server", "worker0", "worker1", "stubborn", "stubborn_worker", "orphan", "renamed")}
    assert set(report["holders"]) == gpu_targets | {roles["persistenced"], roles["monitor"]}
    assert set(report["protected"]) == {roles["persistenced"], roles["monitor"]}
    assert set(report["sigTERM"]) == gpu_targets
    assert set(report["sigKILL"]) == {roles["stubborn"], roles["stubborn_worker"]}
    assert report["remaining"] == [] and report["verdict"] == "free"
    assert all(alive(roles[r]) for r in scenario.BYSTANDER_ROLES)
    assert not any(alive(p) for p in gpu_targets)


def test_report_parser_rejects_missing_report():
    with pytest.raises(ValueError, match="no gpu-pivot one-liner report"):
        shell_teardown.parse_report("Welcome!\n")
