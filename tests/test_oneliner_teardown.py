"""The emergency one-liner, printed by `invoke oneliner --action teardown`, run through the
real quoting layers (bash -c -> ssh -> pct exec -> sh -c) against real processes."""
import subprocess

import pytest

from scripts import shell_teardown
from tests import scenario
from tests.conftest import invoke
from tests.procs import alive


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
    gpu_targets = {roles[r] for r in ("server", "worker0", "worker1", "stubborn", "stubborn_worker", "orphan",
                                      "renamed")}
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


def test_oneliner_as_another_user_never_says_free(second_user, tmp_path):
    """Not root: other users' open files are unreadable, so an empty holder list proves nothing."""
    import os
    import tempfile

    base = tempfile.mkdtemp(prefix="gp-ol-", dir="/tmp")
    try:
        os.chmod(base, 0o755)
        open(os.path.join(base, "nvidia0"), "w").close()
        ran = second_user.run(["sh", "-c", shell_teardown.script_text(), "gpu-pivot-teardown", f"{base}/nvidia*", "1"],
                              text=True)
        report = shell_teardown.parse_report(ran.stdout)
        assert ran.returncode == 1 and report["verdict"] == "not-free"
        assert "run as root" in report["not-root"]
    finally:
        subprocess.run(["rm", "-rf", base])


def test_shell_protect_list_is_the_agents():
    """One protect list: the script's own copy equals what is generated from the contract,
    and the generated one-liner protects every name the agent protects (run in sh)."""
    from scripts.agent import contract

    text = shell_teardown.SCRIPT.read_text()
    assert f"            {shell_teardown.protected_case()}) return 0 ;;" in text.splitlines()
    script = shell_teardown.script_text()
    assert f"{shell_teardown.protected_case()}) return 0 ;;" in script
    for name in [*contract.PROTECTED_NAMES, "node-exporter", "gpu_exporter", "sshd:"]:
        probe = f'case "$0" in {shell_teardown.protected_case()}) exit 0 ;; esac; exit 1'
        assert subprocess.run(["sh", "-c", probe, name]).returncode == 0, name
    assert subprocess.run(["sh", "-c", f'case python3 in {shell_teardown.protected_case()}) exit 0;; esac; exit 1']
                          ).returncode == 1
