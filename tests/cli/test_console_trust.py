"""The console's trust cases: what runs as the caller, and whose processes a sandbox may stop.

- hosts.env is code (LOCAL_PYTHON, SSH_OPTS run as the caller): one another user owns, or
  can write, is refused, for $GPU_PIVOT_HOSTS_FILE and for the ./hosts.env fallback;
- `sandbox down` as root stopped another user's setuid process started with the sandbox's
  marker variable (the owner of /proc/PID is only its effective uid);
- a --settle window longer than --timeout was cut short at --timeout;
- a remote command that prints ssh's keep-alive message and exits 255 was called a timeout;
- stdout closed by its reader (`| head -1`) made a teardown that freed the GPUs report
  "agent failed", and status/audit print tracebacks;
- the sandbox directory removed by hand: `sandbox status` showed nothing while 6 ran;
- a sandbox directory another user owns was refused only by `sandbox up`.
Other users are real (tests/support/second_user.py); every process is the test's own, ended by PID.
"""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from scripts.agent.wire import codes, requests
from scripts.config.hostconfig import build_host
from scripts.reach.transport import call_agent
from tests.conftest import REPO, checkout_copy, invoke
from tests.support import scenario
from tests.support.procs import alive, wait_for


def text_of(res) -> str:
    return res.stdout.decode() + res.stderr.decode()


# -- hosts.env another user controls -----------------------------------------------------------

def _planted(tmp_path, owner_uid: int, mode: int = 0o644):
    """A dir + hosts.env whose LOCAL_PYTHON, if ever run, leaves a mark; chown'd to owner_uid."""
    d = tmp_path / "shared"
    d.mkdir()
    mark = tmp_path / "pwned"
    py = d / "py"
    py.write_text(f"#!/bin/sh\ntouch {mark}\nexec {sys.executable} \"$@\"\n")
    py.chmod(0o755)
    env_file = d / "hosts.env"
    env_file.write_text(f"LOCAL_PYTHON={py}\n")
    env_file.chmod(mode)
    for p in (d, py, env_file):
        os.chown(p, owner_uid, -1)
    return d, env_file, mark


def test_hosts_env_of_another_user_is_refused_before_anything_runs(tmp_path, second_user):
    tmp_path.chmod(0o755)
    d, env_file, mark = _planted(tmp_path, second_user.uid)
    env = {k: v for k, v in os.environ.items() if k != "GPU_PIVOT_HOSTS_FILE"}
    # the ./hosts.env fallback, from that dir, with a checkout that has no hosts.env beside tasks.py
    # (a fresh clone's: this one may have the user's own)
    clone = checkout_copy(tmp_path / "clone")
    cwd_run = subprocess.run([sys.executable, "-m", "invoke", "-r", str(clone), "ping", "--host", "local"], cwd=d,
                             capture_output=True, env=env, timeout=60)
    by_env = invoke("ping", "--host", "local", env=dict(env, GPU_PIVOT_HOSTS_FILE=str(env_file)))
    for res in (cwd_run, by_env):
        assert res.returncode == codes.EXIT_USAGE, text_of(res)
        assert f"owned by uid {second_user.uid}" in res.stderr.decode()
        assert len(res.stderr.decode().strip().splitlines()) == 1
    assert not mark.exists()


@pytest.mark.parametrize("mode", [0o666, 0o620])
def test_hosts_env_others_can_write_is_refused(tmp_path, mode):
    _d, env_file, mark = _planted(tmp_path, os.geteuid(), mode)
    res = invoke("ping", "--host", "local", env=dict(os.environ, GPU_PIVOT_HOSTS_FILE=str(env_file)))
    assert res.returncode == codes.EXIT_USAGE and "writable by group or others" in res.stderr.decode()
    assert not mark.exists()


# -- the sandbox's marker: every uid must be ours ----------------------------------------------

def test_sandbox_members_need_every_uid_ours(tmp_path, second_user):
    """A process with real uid of another user and effective uid 0 (what a user's setuid `su`
    is) carrying the marker is not ours; one with every uid ours is."""
    from scripts.ops.sandbox_procs import MEMBER_ENV, members

    base = tmp_path / "sb"
    env = dict(os.environ, **{MEMBER_ENV: str(base)})
    code = "import os,sys,time; u=int(sys.argv[1]); os.setresuid(u, 0, 0) if u else None; time.sleep(60)"
    theirs = subprocess.Popen([sys.executable, "-c", code, str(second_user.uid)], env=env)
    ours = subprocess.Popen([sys.executable, "-c", code, "0"], env=env)
    try:
        wait_for(lambda: open(f"/proc/{theirs.pid}/status").read().count(f"\t{second_user.uid}\t") >= 1,
                 "the setresuid", timeout=10)
        found = {pid for pid, _start in members(base)}
        assert ours.pid in found and theirs.pid not in found
    finally:
        for p in (theirs, ours):
            p.kill()
            p.wait()


# -- settle window past --timeout --------------------------------------------------------------

def test_settle_window_is_watched_whole_even_past_timeout(ps):
    ps.server(tp=1)
    host = dataclasses.replace(build_host("local", dict(scenario.host_keys(ps), TARGETS=r"sglang\.launch_server"),
                                          "test"), fake_gpus=str(ps.memdir))
    res = call_agent(host, requests.Teardown(grace=2, timeout=0.3, settle=1.5))
    doc = res.doc
    assert res.code == 0, doc.get("problems")
    assert doc["settled_at_s"] - doc["free_at_s"] >= 1.5, doc


# -- ssh's own messages cannot be faked by the remote command ----------------------------------

def test_remote_command_cannot_fake_a_keepalive_timeout(sshd, hosts_env):
    hosts_env(f"GPU1_SSH={sshd.dest()}\nGPU1_SSH_OPTS='{sshd.ssh_opts} -o ControlPath=none'\n")
    res = invoke("run", "--host", "gpu1", "--", "sh", "-c",
                 "echo 'Timeout, server gpu1 not responding.' >&2; exit 255")
    assert res.returncode == 255, text_of(res)


# -- stdout closed by its reader ---------------------------------------------------------------

def _sandbox_env(tmp_path):
    return dict(os.environ, GPU_PIVOT_SANDBOX_DIR=str(tmp_path / "sb"), XDG_STATE_HOME=str(tmp_path / "state"))


def test_closed_stdout_does_not_stop_or_misreport_a_teardown(tmp_path):
    env = _sandbox_env(tmp_path)
    assert invoke("sandbox", "up", env=env).returncode == 0
    try:
        state = json.loads(invoke("sandbox", "status", "--json", env=env).stdout)
        server = state["processes"]["server"]["pid"]
        for args in (["teardown", "-H", "sandbox", "-y"], ["status", "-H", "sandbox"], ["audit"]):
            res = subprocess.run(f"{sys.executable} -m invoke {' '.join(args)} | head -c 1 >/dev/null; "
                                 "echo ${PIPESTATUS[0]}", shell=True, executable="/bin/bash", cwd=REPO, env=env,
                                 capture_output=True, timeout=120)
            assert res.stdout.decode().strip() == "0", (args, res.stdout, res.stderr)
            assert b"Traceback" not in res.stderr and b"BrokenPipe" not in res.stderr, res.stderr
        wait_for(lambda: not alive(server), "the sandbox server to be gone", timeout=10)
    finally:
        invoke("sandbox", "down", env=env)


# -- the sandbox directory: removed by hand, or another user's ----------------------------------

def test_sandbox_status_shows_processes_its_state_lost(tmp_path):
    import shutil

    env = _sandbox_env(tmp_path)
    assert invoke("sandbox", "up", env=env).returncode == 0
    try:
        pids = [p["pid"] for p in json.loads(invoke("sandbox", "status", "--json", env=env).stdout)
                ["processes"].values()]
        shutil.rmtree(tmp_path / "sb")
        state = json.loads(invoke("sandbox", "status", "--json", env=env).stdout)
        assert sorted(state["unrecorded"]) == sorted(pids)
        down = invoke("sandbox", "down", env=env)
        assert "also stopped" in down.stdout.decode() and "nothing was running" not in down.stdout.decode()
    finally:
        invoke("sandbox", "down", env=env)


def test_another_users_sandbox_dir_is_refused_by_every_task(tmp_path, second_user):
    tmp_path.chmod(0o755)
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, second_user.uid, -1)
    env = dict(os.environ, GPU_PIVOT_SANDBOX_DIR=str(theirs), XDG_STATE_HOME=str(tmp_path / "state"))
    for args in (["status", "-H", "sandbox"], ["verify", "-H", "sandbox"], ["plan", "-H", "sandbox"]):
        res = invoke(*args, env=env)
        assert res.returncode == codes.EXIT_UNREACHABLE, (args, text_of(res))
        assert str(theirs) in res.stderr.decode()
    assert os.listdir(theirs) == []  # nothing written into it


# -- keep-alive loss through the shared master connection (the default) -------------------------

def test_keepalive_loss_through_the_control_master_is_a_time_out(own_sshd, ps, monkeypatch, tmp_path):  # noqa: F811
    """The master (ControlPersist) was started by an earlier call and writes its "Timeout,
    server ... not responding" to that call's -E file: a file per call, deleted after it,
    lost the line and the time-out read as "agent failed"."""
    import threading

    from scripts.reach import ssh
    from scripts.reach.route import HostTimedOut
    from tests.support import fleet_faults

    cdir = tmp_path / "cm"
    monkeypatch.setenv(ssh.CONTROL_DIR_ENV, str(cdir))
    host = fleet_faults.gpu_host(own_sshd, opts="-o ServerAliveInterval=1 -o ServerAliveCountMax=2",
                                 **fleet_faults.held_devices(ps))
    call_agent(host, requests.Ping())  # starts the master
    caught: dict = {}
    progressing = threading.Event()

    def call():
        try:
            call_agent(host, requests.Verify(wait=20), on_progress=lambda f: progressing.set())
        except Exception as exc:  # noqa: BLE001 (the test inspects it)
            caught["exc"] = exc

    worker = threading.Thread(target=call)
    worker.start()
    try:
        assert progressing.wait(20), "the agent's progress never arrived"
        fleet_faults.stop_sshd(own_sshd)
        worker.join(30)
        assert isinstance(caught.get("exc"), HostTimedOut), repr(caught)
        assert "Timeout, server" in str(caught["exc"])
    finally:
        for sock in (cdir.iterdir() if cdir.exists() else ()):
            if sock.suffix != ".log":
                subprocess.run(["ssh", "-o", f"ControlPath={sock}", "-O", "exit", "x"], capture_output=True,
                               timeout=5)


@pytest.mark.parametrize("opts", ["-q", "-o LogLevel=QUIET", "-y", "-o LogLevel=fatal"])
def test_options_that_silence_ssh_are_refused(hosts_env, opts):
    hosts_env(f"GPU1_SSH=root@127.0.0.1\nGPU1_SSH_OPTS='{opts}'\n")
    res = invoke("ping", "--host", "gpu1")
    assert res.returncode == codes.EXIT_USAGE, text_of(res)
    assert "GPU1_SSH_OPTS" in res.stderr.decode()


def test_closed_fd_1_at_start_still_runs_and_exits_with_its_code(tmp_path):
    env = _sandbox_env(tmp_path)
    assert invoke("sandbox", "up", env=env).returncode == 0
    try:
        res = subprocess.run(f"{sys.executable} -m invoke teardown -H sandbox --yes >&-", shell=True, cwd=REPO,
                             env=env, capture_output=True, timeout=120)
        assert res.returncode == 0 and b"Traceback" not in res.stderr, res.stderr
    finally:
        invoke("sandbox", "down", env=env)


def test_hosts_env_through_a_link_another_user_owns_is_refused(tmp_path, second_user):
    """root's hosts.env -> a link in another user's directory -> a root-owned file: that user
    can re-point it (e.g. to another cluster's file). A chain through our own links is fine."""
    tmp_path.chmod(0o755)
    real = tmp_path / "real.env"
    real.write_text("GPU1_SSH=root@192.0.2.1\n")
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "link").symlink_to(real)
    os.chown(theirs, second_user.uid, -1)
    mine = tmp_path / "hosts.env"
    mine.symlink_to(theirs / "link")
    res = invoke("hosts", env=dict(os.environ, GPU_PIVOT_HOSTS_FILE=str(mine)))
    assert res.returncode == codes.EXIT_USAGE and f"directory {theirs}" in res.stderr.decode(), text_of(res)
    ok = tmp_path / "ok.env"
    ok.symlink_to(real)
    res = invoke("hosts", env=dict(os.environ, GPU_PIVOT_HOSTS_FILE=str(ok)))
    assert res.returncode == 0 and "gpu1" in res.stdout.decode(), text_of(res)
