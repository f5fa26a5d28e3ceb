"""The gpu_pivot Ansible module and ansible/free-gpus.yml, run by real ansible-core over the
suite's loopback sshd: two hosts (two sshd ports on 127.0.0.1), the inventory read from a
hosts.env by ansible/inventory/hosts_env.py.

Each host's "GPUs" are fake device files in its own temp dir, and its SCOPE narrows every
target to processes the test started there, so no teardown can reach anything else. Host
gpa has a server tree (a target); host gpb has a holder outside its SCOPE (never the
module's to stop), so its GPUs cannot be freed and the host must fail.

Three invocations (each costs ~2 s of Ansible start-up): check mode, a real run, and a
verify-only run in check mode (ansible-core 2.19 says only "Unknown error" for some tasks
that fail in check mode: the message must be ours).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.support.ansible_play import ANSIBLE_PLAYBOOK, play
from tests.support.loopback_sshd import LoopbackSshd
from tests.support.procs import ProcessSet, alive

HOLD = "import sys, time; f = open(sys.argv[1], 'rb'); open(sys.argv[-1], 'w').close(); time.sleep(600)"

# the playbook under test, then one more play that writes each host's facts where the test reads
# them (a failed host's facts are not kept: null; its message is in the output)
pytestmark = pytest.mark.skipif(not os.path.exists(ANSIBLE_PLAYBOOK) and os.environ.get("CI") != "true",
                                reason="ansible-core is not installed (requirements-dev.txt)")


@pytest.fixture(scope="module")
def two_hosts(sshd, tmp_path_factory):
    second = LoopbackSshd(tmp_path_factory.mktemp("sshd-b"), keys_from=sshd).start()
    yield sshd, second
    second.stop()


@pytest.fixture
def lab(two_hosts, tmp_path):
    a, b = ProcessSet(tmp_path / "a"), ProcessSet(tmp_path / "b")
    env_file = tmp_path / "hosts.env"
    env_file.write_text(
        two_hosts[0].hosts_env("gpa", extra={"DEVICES": a.glob, "FAKE_DEVICES": "yes", "SCOPE": str(a.base)})
        + two_hosts[1].hosts_env("gpb", extra={"DEVICES": b.glob, "FAKE_DEVICES": "yes", "SCOPE": "gpb-only-this"}))
    home = tmp_path / "ansible-home"
    # ANSIBLE_HOME for the controller, REMOTE_TMP for the "hosts" (this machine, as root):
    # nothing is left in ~/.ansible
    env = dict(os.environ, GPU_PIVOT_HOSTS_FILE=str(env_file), ANSIBLE_HOME=str(home),
               ANSIBLE_REMOTE_TMP=str(tmp_path / "remote-tmp"),
               ANSIBLE_SSH_ARGS="-o ControlMaster=no",  # no persistent connection outlives the test
               ANSIBLE_PIPELINING="true", ANSIBLE_HOST_KEY_CHECKING="true", ANSIBLE_NOCOLOR="1",
               ANSIBLE_LOCALHOST_WARNING="false", ANSIBLE_PYTHON_INTERPRETER="auto_silent")
    yield a, b, env, tmp_path
    a.kill_all()
    b.kill_all()


def test_check_mode_plans_then_a_real_run_frees_one_host_and_fails_the_other(lab):
    a, b, env, tmp_path = lab
    server, workers = a.server(tp=2)
    stray = b.start([sys.executable, "-c", HOLD, f"{b.devdir}/nvidia0"])

    checked, facts = play(env, tmp_path, "--check", "--diff")
    text = checked.stdout + checked.stderr
    assert checked.returncode == 0, text
    assert all(alive(p) for p in (server, *workers, stray)), "check mode signalled something"
    planned = {t["pid"] for t in facts["gpa"]["targets"]}
    assert planned == {server, *workers}, facts["gpa"]
    assert facts["gpa"]["verdict"].startswith("planned") and facts["gpb"]["targets"] == []
    assert [r["pid"] for r in facts["gpb"]["left_alone"]] == [stray]
    assert "changed: [gpa]" in text and "ok: [gpb]" in text, text

    ran, facts = play(env, tmp_path)
    text = ran.stdout + ran.stderr
    assert ran.returncode == 2, text  # ansible-playbook: a host failed
    assert not any(alive(p) for p in (server, *workers)) and alive(stray)
    assert facts["gpa"]["verdict"] == "free" and facts["gpa"]["signalled"] >= 3, facts["gpa"]
    assert {t["pid"] for t in facts["gpa"]["targets"]} == {server, *workers}
    assert "freed_mib" in facts["gpa"] and "protected" in facts["gpa"]
    assert "fatal: [gpb]" in text and f"pid {stray}" in text, text
    assert "gpa                        : ok=2    changed=1" in text, text

    verified, facts = play(env, tmp_path, "--check", "-e", "gpu_pivot_state=verified")
    text = verified.stdout + verified.stderr
    assert verified.returncode == 2, text
    assert facts["gpa"]["verdict"] == "free"
    assert "fatal: [gpb]" in text and f"pid {stray}" in text and "Unknown error" not in text, text
    assert alive(stray)


def test_bad_option_fails_the_task_with_one_line_and_runs_nothing(lab):
    a, _, env, tmp_path = lab
    server, _ = a.server(tp=1)
    done, _ = play(env, tmp_path, "-e", "gpu_pivot_grace=soon", "--limit", "gpa")
    text = done.stdout + done.stderr
    assert done.returncode == 2 and "--grace 'soon': not a number of seconds" in text, text
    assert alive(server)


def test_inventory_mirrors_hosts_env(lab):
    _, _, env, _ = lab
    out = subprocess.run([sys.executable, str(REPO / "ansible" / "inventory" / "hosts_env.py"), "--list"],
                         env=env, capture_output=True, text=True, check=True)
    inv = json.loads(out.stdout)
    gpa = inv["_meta"]["hostvars"]["gpa"]
    assert inv["gpu_hosts"]["hosts"] == ["gpa", "gpb"]
    assert gpa["ansible_host"] == "127.0.0.1" and isinstance(gpa["ansible_port"], int)
    assert gpa["gpu_pivot_fake_devices"] is True and gpa["gpu_pivot_devices"].endswith("/dev/nvidia*")
    assert "StrictHostKeyChecking=yes" in gpa["ansible_ssh_common_args"]


def test_a_verify_that_exits_9_fails_the_task_though_no_process_holds_a_gpu(tmp_path):
    """`verify` reads free with exit 9 (a GPU needs a reset or the node
    a reboot: NVML's health verdict, which cannot exist without a GPU). The agent really runs
    here on free fake devices; only its exit code is NVML's."""
    from scripts.engines import ansible_task

    procs = ProcessSet(tmp_path)
    call = ansible_task.agent_call({"state": "verified", "devices": procs.glob, "fake_devices": True,
                                    "python": sys.executable}, check_mode=False)
    done = subprocess.run(call["argv"], input=ansible_task.agent_source(), capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    clean = ansible_task.outcome(call, 0, done.stdout, done.stderr, check_mode=False)
    assert clean["failed"] is False and clean["ansible_facts"]["gpu_pivot"]["verdict"] == "free", clean
    reboot = ansible_task.outcome(call, 9, done.stdout, done.stderr, check_mode=False)
    assert reboot["failed"] is True, reboot
    assert reboot["ansible_facts"]["gpu_pivot"]["verdict"] != "free" and reboot["msg"], reboot
