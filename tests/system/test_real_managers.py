"""A GPU holder under a REAL manager (supervisord, runit's runsv, podman) is attributed to that
manager with the exact command that stops it, and that command, run as printed, stops it for
good while the manager's daemon lives on.

Why real: the names and commands come from what the managers themselves write (supervisord's
SUPERVISOR_* environment, runsv's working directory, conmon's argv and podman's cgroup); only
the managers can say whether the command stops the program (their own status, 5 s later:
autorestart, runsv and --restart=always would have brought a killed holder back by then).
"""
from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from scripts.agent.holders import scan
from scripts.agent.policy import managers
from tests.conftest import need_tools
from tests.support.managers_fixtures import RayShaped, ServiceScan, Supervisord, holder_argv, run_stop
from tests.support.procs import alive, wait_for
from tests.support.scans import holders_by_pid, scan_args

AFTER_STOP_S = 5  # how long after the stop the manager is asked again: long past any restart


def _scan_holder(ps, pid):
    """The scan's record of holder `pid` and the process table, as plan.py has them."""
    doc = scan.collect(scan_args(ps).selection)
    holders = holders_by_pid(doc)
    assert pid in holders, f"PID {pid} is not seen holding {ps.glob}"
    return holders[pid], doc.procs


def _run(command: str) -> subprocess.CompletedProcess:
    return subprocess.run(command, shell=True, capture_output=True, text=True, timeout=60)


@pytest.fixture
def supervisord_holder(ps, tmp_path):
    need_tools("supervisord", "supervisorctl", why="a server under a real supervisord")
    sd = Supervisord(tmp_path, {"vllm": holder_argv(ps.devdir, tmp_path / "ready")}, group="infer")
    try:
        yield sd
    finally:
        sd.down()


def test_supervisord_program_is_named_and_supervisorctl_stops_it_for_good(ps, tmp_path, supervisord_holder):
    sd = supervisord_holder
    first = sd.program_pid("vllm")
    wait_for(lambda: (tmp_path / "ready").exists(), "the holder holds its devices")
    os.kill(first, signal.SIGKILL)  # what a teardown that only signals does: autorestart brings it back
    pid = wait_for(lambda: (p := sd.program_pid("vllm")) != first and p, "supervisord restarts the holder")
    wait_for(lambda: _holds_now(ps, pid), "the restarted holder holds its devices")

    holder, procs = _scan_holder(ps, pid)
    m = managers.manager_of(holder, procs)
    assert m is not None
    assert (m["kind"], m["name"], m["pid"], m["main_pid"]) == ("supervisord", "infer:vllm", sd.pid, pid)
    assert m["stop_command"] == f"supervisorctl -c {sd.conf} stop infer:vllm"
    assert m["stops_by_default"] and m["trusted"]
    assert "autostart=false" in m["comes_back"]
    assert managers.is_manager_daemon(procs[sd.pid]) and not managers.is_manager_daemon(holder)

    out = _run(m["stop_command"])
    assert out.returncode == 0, out.stdout + out.stderr
    time.sleep(AFTER_STOP_S)
    assert sd.state("vllm") == "STOPPED"
    assert not alive(pid) and alive(sd.pid)


def test_supervisord_program_outside_a_group_is_named_alone(ps, tmp_path):
    need_tools("supervisord", "supervisorctl", why="a server under a real supervisord")
    sd = Supervisord(tmp_path, {"sglang": holder_argv(ps.devdir, tmp_path / "ready")})
    try:
        pid = sd.program_pid("sglang")
        wait_for(lambda: (tmp_path / "ready").exists(), "the holder holds its devices")
        holder, procs = _scan_holder(ps, pid)
        m = managers.manager_of(holder, procs)
        assert (m["name"], m["stop_command"]) == ("sglang", f"supervisorctl -c {sd.conf} stop sglang")
        assert _run(m["stop_command"]).returncode == 0
        time.sleep(AFTER_STOP_S)
        assert sd.state("sglang") == "STOPPED" and not alive(pid) and alive(sd.pid)
    finally:
        sd.down()


def test_root_supervisord_with_a_config_another_user_can_change_is_named_not_run(ps, tmp_path, second_user):
    """supervisorctl -c CONF reads CONF as root: one in another user's directory is theirs."""
    need_tools("supervisord", "supervisorctl", why="a server under a real supervisord")
    sd = Supervisord(tmp_path, {"vllm": holder_argv(ps.devdir, tmp_path / "ready")})
    try:
        pid = sd.program_pid("vllm")
        wait_for(lambda: (tmp_path / "ready").exists(), "the holder holds its devices")
        os.chown(sd.dir, second_user.uid, second_user.gid)
        holder, procs = _scan_holder(ps, pid)
        m = managers.manager_of(holder, procs)
        assert (m["kind"], m["stop_command"], m["trusted"]) == ("supervisord", f"supervisorctl -c {sd.conf} stop vllm",
                                                                True)
        assert m["stops_by_default"] is False and "not a file only root can change" in m["note"]
        with pytest.raises(ValueError):
            run_stop(m)
    finally:
        os.chown(sd.dir, 0, 0)
        sd.down()


def test_supervisord_program_behind_a_shell_wrapper_is_the_programs(ps, tmp_path):
    """`command=bash -c "cd DIR && exec-less SERVER"`: the holder is the shell's child; the
    manager is still supervisord's, and main_pid is the shell (what supervisord runs)."""
    need_tools("supervisord", "supervisorctl", why="a server under a real supervisord")
    inner = " ".join(holder_argv(ps.devdir, tmp_path / "ready"))
    sd = Supervisord(tmp_path, {"vllm": ["bash", "-c", f"cd {tmp_path} && {inner}; echo exited"]})
    try:
        shell = sd.program_pid("vllm")
        wait_for(lambda: (tmp_path / "ready").exists(), "the holder holds its devices")
        doc = scan.collect(scan_args(ps).selection)
        holder = next(h for h in doc["holders"] if h["ppid"] == shell)
        m = managers.manager_of(holder, doc.procs)
        assert (m["kind"], m["name"], m["main_pid"], m["pid"]) == ("supervisord", "vllm", shell, sd.pid)
        assert managers.managed_pids(m, doc.procs) == {shell, holder["pid"]}
    finally:
        sd.down()


def _holds_now(ps, pid):
    return pid in holders_by_pid(scan.collect(scan_args(ps).selection))


SERVICE_TOOLS = {"runit": ("runsvdir", "runsv", "sv"), "s6": ("s6-svscan", "s6-supervise", "s6-svc", "s6-svstat"),
                 "daemontools": ("svscan", "supervise", "svc", "svstat")}
STOPS = {"runit": "sv down", "s6": "s6-svc -d", "daemontools": "svc -d"}


@pytest.mark.parametrize("kind", sorted(SERVICE_TOOLS))
def test_supervised_service_is_named_and_its_down_command_stops_it_for_good(ps, tmp_path, kind):
    need_tools(*SERVICE_TOOLS[kind], why=f"a server under a real {kind} supervisor")
    scanner = ServiceScan(tmp_path, {"vllm": holder_argv(ps.devdir, tmp_path / "ready")}, kind)
    try:
        first = scanner.service_pid("vllm")
        wait_for(lambda: (tmp_path / "ready").exists(), "the holder holds its devices")
        os.kill(first, signal.SIGKILL)  # the supervisor starts it again
        pid = wait_for(lambda: (p := scanner.service_pid("vllm")) != first and p, f"{kind} restarts the holder")
        wait_for(lambda: _holds_now(ps, pid), "the restarted holder holds its devices")
        supervisor = scanner.supervisor_pid("vllm")

        holder, procs = _scan_holder(ps, pid)
        m = managers.manager_of(holder, procs)
        assert m is not None
        assert (m["kind"], m["pid"], m["main_pid"]) == (kind, supervisor, pid)
        assert m["name"] == str(scanner.service_dir("vllm"))  # the scan dir's name for it, as the operator knows it
        assert m["stop_command"] == f"{STOPS[kind]} {scanner.service_dir('vllm')}"
        assert m["stops_by_default"]
        assert managers.is_manager_daemon(procs[supervisor]) and managers.is_manager_daemon(procs[scanner.pid])
        assert managers.managed_pids(m, procs) == {pid}

        ok, said = run_stop(m)  # its argv, as the teardown runs it
        assert ok, said
        time.sleep(AFTER_STOP_S)
        assert scanner.status("vllm") == "down"
        assert not alive(pid) and alive(supervisor) and alive(scanner.pid)

        # what comes_back says keeps it down when the supervisor starts again (as at boot)
        assert m["comes_back"].endswith(f"`touch {scanner.service_dir('vllm')}/down` keeps it down")
        (scanner.service_dir("vllm") / "down").touch()
        os.kill(supervisor, signal.SIGKILL)
        wait_for(lambda: scanner.supervisor_pid("vllm") != supervisor, f"the scanner starts a new {kind} supervisor",
                 timeout=30)
        time.sleep(AFTER_STOP_S)
        assert scanner.status("vllm") == "down" and not holders_by_pid(scan.collect(scan_args(ps).selection))
    finally:
        scanner.down()


def test_podman_container_is_named_and_podman_stop_stops_it_for_good(ps, tmp_path, podman):
    cid = podman.run("gpu-pivot-vllm", holder_argv(ps.devdir, tmp_path / "ready", python="/usr/bin/python3"),
                     shared=tmp_path)
    assert podman.restart_policy("gpu-pivot-vllm") == "always"
    pid = podman.main_pid("gpu-pivot-vllm")
    wait_for(lambda: (tmp_path / "ready").exists(), "the holder holds its devices", timeout=30)

    holder, procs = _scan_holder(ps, pid)
    assert holder["container"]["kind"] == "podman" and holder["container"]["id"] == cid
    m = managers.manager_of(holder, procs)
    assert m is not None
    conmon = holder["ppid"]
    assert (m["kind"], m["name"], m["pid"], m["container_id"]) == ("podman", "gpu-pivot-vllm", conmon, cid)
    # the container's own storage and run roots, as conmon's exit command has them: podman finds it only there
    assert m["stop_command"] == (f"podman --root {podman.dir / 'root'} --runroot {podman.runroot} "
                                 f"--cgroup-manager cgroupfs --tmpdir {podman.dir / 'tmp'} "
                                 f"--network-config-dir {podman.dir / 'net'} --events-backend none "
                                 "stop gpu-pivot-vllm")
    assert m["stops_by_default"]
    assert managers.is_manager_daemon(procs[conmon])

    out = _run(m["stop_command"])
    assert out.returncode == 0, out.stdout + out.stderr
    time.sleep(AFTER_STOP_S)
    assert podman.state("gpu-pivot-vllm") in ("exited", "stopped")
    assert not alive(pid)


def test_ray_workers_are_named_with_ray_stop_and_nothing_of_rays_is_run(ps):
    ray = RayShaped(ps, workers=2)
    workers = ray.worker_pids()
    doc = scan.collect(scan_args(ps).selection)
    holders = holders_by_pid(doc)
    assert set(workers) <= set(holders)
    for pid in workers:
        m = managers.manager_of(holders[pid], doc.procs)
        assert (m["kind"], m["name"], m["pid"], m["main_pid"]) == ("ray", "ray::RayWorkerWrapper", ray.pid, pid)
        assert m["stop_command"] == "ray stop" and m["stops_by_default"] is False
        assert m["workers"] == 2 and "every Ray job" in m["note"]
    assert managers.is_manager_daemon(doc.procs[ray.pid])
