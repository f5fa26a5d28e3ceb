"""A teardown of a GPU server that a REAL manager runs: stopped through the manager when the
teardown may run its stop, else named with the exact command and not signalled at all.

Why: signalling a program that supervisord (autorestart), runit's runsv or podman's
--restart=always runs only has it started again; a Kubernetes pod's kubelet, a CRI
container's owner and a raylet restart what is killed under them too, and they are not the
teardown's to stop. So:
- supervisord and podman (and a supervisord program behind a `bash -c`): FREED, exit 0, the
  manager's own status says the program is stopped 5 s later, no holder, the manager alive;
- a Kubernetes pod (its real cgroup layout, made under this test's cgroup), a CRI container
  outside any pod, Ray workers: NOT FREE, exit 1, the exact command in the problems, and the
  audit shows not one signal to them or their managers;
- no hint says "a terminal's shell, a multiplexer, a daemon" for a known manager.
Every teardown is scoped to the test's temp dir (tests.support.teardowns.host).
"""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from scripts.agent.holders import scan
from scripts.agent.options.record import Options
from scripts.agent.teardown import plan as plan_module, settle
from scripts.agent.wire import requests
from scripts.views.teardown import plan_tables
from tests.conftest import need_tools
from tests.support import teardowns
from tests.support.agent_inproc import run_agent
from tests.support.managers_fixtures import CID, ESCAPED, UID, RayShaped, ServiceScan, Supervisord, holder_argv
from tests.support.procs import alive, children, wait_for
from tests.support.scans import scan_args
from tests.support.teardowns import host

AFTER_STOP_S = 5  # long past any restart: autorestart and --restart=always bring a program back in well under 1 s
GENERIC = "a terminal's shell, a multiplexer, a daemon"
TARGETS = r"sandbox_roles\.py"


def teardown(ps):
    return teardowns.teardown(ps, TARGETS=TARGETS)


def plan(ps):
    return run_agent(host(ps, TARGETS=TARGETS), requests.Plan()).doc["plan"]


def plan_view(ps) -> str:
    """`invoke plan`'s tables of this test's plan, as one line of words."""
    return " ".join(plan_tables(run_agent(host(ps, TARGETS=TARGETS), requests.Plan()).doc).split())


def signalled(doc) -> set:
    """The pids the teardown sent a signal to (audit records of SIG*)."""
    return {a["pid"] for a in doc["actions"] if str(a.get("signal", "")).startswith("SIG")}


def no_generic_hint(doc) -> None:
    text = repr(doc)
    assert GENERIC not in text, text


def holders_now(ps) -> list:
    doc = run_agent(host(ps, TARGETS=TARGETS), requests.Scan()).doc
    return [h["pid"] for h in doc["holders"] if not h["protected"]]


# -- stopped through the manager -------------------------------------------------------------------


@pytest.fixture
def supervisord_tool():
    need_tools("supervisord", "supervisorctl", why="a server under a real supervisord")


MODULE_SUPERVISORD = ("/usr/bin/python3", "-m", "supervisor.supervisord")


@pytest.mark.parametrize("launch", [("supervisord",), MODULE_SUPERVISORD], ids=["supervisord", "python3 -m"])
def test_supervisord_program_is_stopped_with_supervisorctl_for_good(ps, tmp_path, supervisord_tool, launch):
    """A supervisord program is stopped through supervisorctl, also under a supervisord run as
    `python3 -m supervisor.supervisord` (a venv's install: its program would otherwise be
    signalled, and supervisord would start it again)."""
    if launch == MODULE_SUPERVISORD and subprocess.run([launch[0], "-c", "import supervisor"],
                                                       capture_output=True).returncode:
        pytest.skip("/usr/bin/python3 has no supervisor package (Debian's supervisor brings it)")
    sd = Supervisord(tmp_path, {"vllm": holder_argv(ps.devdir, tmp_path / "ready")}, group="infer", launch=launch)
    try:
        pid = sd.program_pid("vllm")
        wait_for(lambda: (tmp_path / "ready").exists(), "the holder holds its devices")
        command = f"supervisorctl -c {sd.conf} stop infer:vllm"

        the_plan = plan(ps)
        row = next(t for t in the_plan["targets"] if t["pid"] == pid)
        assert row["manager"] == {"kind": "supervisord", "name": "infer:vllm", "stop_command": command}
        assert row["via"] == command
        assert [(m["kind"], m["name"], m["run"], m["pids"]) for m in the_plan["managers"]] == [
            ("supervisord", "infer:vllm", True, [pid])]
        assert sd.pid not in {t["pid"] for t in the_plan["targets"] + the_plan["starters"]}
        assert f"supervisord infer:vllm (pid {pid}) will be stopped with {command}" in plan_view(ps)

        result = teardown(ps)
        doc = result.doc
        assert result.code == 0 and doc["verdict"] == "free", doc["problems"]
        assert any(a.get("signal") == command for a in doc["actions"]), doc["actions"]
        assert sd.pid not in signalled(doc)
        no_generic_hint(doc)
        time.sleep(AFTER_STOP_S)
        assert sd.state("vllm") == "STOPPED"
        assert not alive(pid) and alive(sd.pid) and holders_now(ps) == []
    finally:
        sd.down()


def test_supervisord_program_behind_bash_c_is_stopped_and_the_server_left_under_it_signalled(ps, tmp_path,
                                                                                             supervisord_tool):
    """`command=bash -c "SERVER; echo exited"`: supervisorctl stop signals bash only (no
    stopasgroup), and the server, reparented, lives on: the teardown signals it after the stop."""
    inner = " ".join(holder_argv(ps.devdir, tmp_path / "ready"))
    sd = Supervisord(tmp_path, {"vllm": ["bash", "-c", f"{inner}; echo exited"]})
    try:
        shell = sd.program_pid("vllm")
        wait_for(lambda: (tmp_path / "ready").exists(), "the holder holds its devices")
        server = wait_for(lambda: next(iter(children(shell)), None), "the server under bash")
        ps.adopt(server)

        result = teardown(ps)
        doc = result.doc
        assert result.code == 0 and doc["verdict"] == "free", doc["problems"]
        stops = [m for m in doc["plan"]["managers"] if m["run"]]
        assert [(m["name"], sorted(m["pids"])) for m in stops] == [("vllm", sorted([shell, server]))]
        assert sd.pid not in signalled(doc)
        time.sleep(AFTER_STOP_S)
        assert sd.state("vllm") == "STOPPED"
        assert not alive(server) and not alive(shell) and alive(sd.pid) and holders_now(ps) == []
    finally:
        sd.down()


def test_podman_container_is_stopped_with_podman_stop_for_good(ps, tmp_path, podman):
    podman.run("gpu-pivot-vllm", holder_argv(ps.devdir, tmp_path / "ready", python="/usr/bin/python3"),
               shared=tmp_path)
    pid = podman.main_pid("gpu-pivot-vllm")
    wait_for(lambda: (tmp_path / "ready").exists(), "the holder holds its devices", timeout=30)
    conmon = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])

    result = teardown(ps)
    doc = result.doc
    assert result.code == 0 and doc["verdict"] == "free", doc["problems"]
    row = next(t for t in doc["plan"]["targets"] if t["pid"] == pid)
    assert (row["manager"]["kind"], row["manager"]["name"]) == ("podman", "gpu-pivot-vllm")
    assert row["via"].startswith("podman --root ") and row["via"].endswith(" stop gpu-pivot-vllm")
    assert conmon not in signalled(doc)
    no_generic_hint(doc)
    time.sleep(AFTER_STOP_S)
    assert podman.state("gpu-pivot-vllm") in ("exited", "stopped")
    assert not alive(pid) and holders_now(ps) == []


# -- named, never signalled ---------------------------------------------------------------------------


HOLD = "import sys, time; fs = [open(sys.argv[1], 'rb')]; open(sys.argv[2], 'w'); time.sleep(600)"


def _holder_in(ps, layout, cgroup_path, env):
    """A holder of the test's fake GPU, started as `sandbox_roles.py`-free Python (a holder, not
    a pattern match), then moved into a runtime's cgroup layout."""
    ready = ps.base / f"held{len(ps.pids)}"
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(ps.devdir / "nvidia0"), str(ready)], env=env,
                            start_new_session=True)
    ps.adopt(proc.pid)
    wait_for(ready.exists, "the holder holds its device")
    layout.place(proc.pid, cgroup_path)
    return proc.pid


def _not_free_naming(ps, command, untouched):
    result = teardown(ps)
    doc = result.doc
    assert result.code == 1 and doc["verdict"] == "not free", doc["problems"]
    assert any(command in p for p in doc["problems"]), doc["problems"]
    assert not signalled(doc) & set(untouched), doc["actions"]
    assert all(alive(p) for p in untouched)
    no_generic_hint(doc)
    return doc


def test_kubernetes_pod_is_named_with_cordon_and_delete_and_never_signalled(ps, layout):
    env = {"PATH": "/usr/bin:/bin", "POD_NAME": "vllm-0", "POD_NAMESPACE": "inference", "HOME": str(ps.base)}
    pid = _holder_in(ps, layout, f"kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{ESCAPED}.slice/"
                                 f"cri-containerd-{CID}.scope", env)
    the_plan = plan(ps)
    assert pid not in {t["pid"] for t in the_plan["targets"]}
    row = next(r for r in the_plan["left_alone"] if r["pid"] == pid)
    assert row["manager"] == {"kind": "kubernetes", "name": "inference/vllm-0",
                              "stop_command": "kubectl -n inference delete pod vllm-0"}
    view = plan_view(ps)
    assert (f"MANAGED pid {pid}: kubernetes inference/vllm-0 runs it and would start it again: NOT signalled; to "
            "stop it run `kubectl cordon ") in view and "first, then `kubectl -n inference delete pod vllm-0`" in view
    doc = _not_free_naming(ps, "kubectl -n inference delete pod vllm-0", [pid])
    line = next(p for p in doc["problems"] if "kubectl -n inference delete pod vllm-0" in p)
    assert "`kubectl cordon " in line and line.index("kubectl cordon") < line.index("delete pod"), line
    assert UID in repr(doc["plan"]["managers"])


def test_cri_container_outside_a_pod_is_named_with_crictl_stop_and_never_signalled(ps, layout):
    pid = _holder_in(ps, layout, f"system.slice/cri-containerd-{CID}.scope", {"PATH": "/usr/bin:/bin"})
    _not_free_naming(ps, f"crictl stop {CID}", [pid])


def test_ray_workers_are_named_with_ray_stop_and_nothing_of_rays_is_signalled(ps):
    ray = RayShaped(ps, workers=2)
    workers = ray.worker_pids()
    the_plan = plan(ps)
    assert not {t["pid"] for t in the_plan["targets"]} & {ray.pid, *workers}
    assert [(m["kind"], m["command"], m["run"], sorted(m["pids"])) for m in the_plan["managers"]] == [
        ("ray", "ray stop", False, sorted(workers))]
    _not_free_naming(ps, "`ray stop`", [ray.pid, *workers])
    assert children(ray.pid) == workers  # none restarted: none was signalled


def test_supervisord_whose_config_another_user_can_change_is_named_and_nothing_signalled(ps, tmp_path,
                                                                                       supervisord_tool, second_user):
    """supervisorctl -c CONF reads CONF as root, so the teardown does not run it where another
    user can change CONF; signalling the program would only have supervisord start it again:
    NOT FREE, with the exact supervisorctl command, and neither supervisord nor the program signalled."""
    sd = Supervisord(tmp_path, {"vllm": holder_argv(ps.devdir, tmp_path / "ready")})
    try:
        pid = sd.program_pid("vllm")
        wait_for(lambda: (tmp_path / "ready").exists(), "the holder holds its devices")
        os.chown(sd.dir, second_user.uid, second_user.gid)
        doc = _not_free_naming(ps, f"`supervisorctl -c {sd.conf} stop vllm`", [pid, sd.pid])
        assert [(m["kind"], m["run"]) for m in doc["plan"]["managers"]] == [("supervisord", False)]
        assert sd.state("vllm") == "RUNNING" and sd.program_pid("vllm") == pid  # never restarted: never signalled
    finally:
        os.chown(sd.dir, 0, 0)
        sd.down()


def test_a_starter_that_is_a_managers_daemon_is_named_with_its_stop_never_as_a_daemon(ps, tmp_path,
                                                                                     supervisord_tool):
    """settle's hint for what started a target: supervisord is asked (its supervisorctl stop),
    never described as "a daemon" to stop by hand."""
    sd = Supervisord(tmp_path, {"vllm": holder_argv(ps.devdir, tmp_path / "ready")})
    try:
        sd.program_pid("vllm")
        wait_for(lambda: (tmp_path / "ready").exists(), "the holder holds its devices")
        stops = plan(ps)["managers"]
        doc = scan.collect(scan_args(ps).selection)
        daemon = doc.procs[sd.pid]
        with_stop = settle.Lineage(doc, [], stops=stops).hint(daemon)
        assert with_stop.startswith(f"supervisorctl -c {sd.conf} stop vllm (supervisord vllm; PID {sd.pid} is its "
                                    "daemon, never signalled)"), with_stop
        alone = settle.Lineage(doc, []).hint(daemon)
        assert "through its manager, supervisord" in alone and GENERIC not in alone, alone
    finally:
        sd.down()


SERVICE_TOOLS = {"runit": ("runsvdir", "runsv", "sv"), "s6": ("s6-svscan", "s6-supervise", "s6-svc", "s6-svstat"),
                 "daemontools": ("svscan", "supervise", "svc", "svstat")}


@pytest.mark.parametrize("kind,started_in", [(k, "scan dir") for k in sorted(SERVICE_TOOLS)] + [("runit", "/")])
def test_supervised_service_is_stopped_with_its_down_command_for_good(ps, tmp_path, kind, started_in):
    """runsv / s6-supervise / supervise start a service's process again the moment it exits:
    the teardown takes the service down through its supervisor, which lives on. A scanner
    started from / (`runsvdir -P /etc/service` in a boot script) still names the scan dir's
    service (its operand, not its working directory)."""
    need_tools(*SERVICE_TOOLS[kind], why=f"a server under a real {kind} supervisor")
    scanner = ServiceScan(tmp_path, {"vllm": holder_argv(ps.devdir, tmp_path / "ready")}, kind,
                          cwd="/" if started_in == "/" else None)
    try:
        pid = scanner.service_pid("vllm")
        supervisor = scanner.supervisor_pid("vllm")
        wait_for(lambda: (tmp_path / "ready").exists(), "the holder holds its devices")
        result = teardown(ps)
        doc = result.doc
        assert result.code == 0 and doc["verdict"] == "free", doc["problems"]
        [stop] = doc["plan"]["managers"]
        assert (stop["kind"], stop["run"], stop["pids"]) == (kind, True, [pid])
        assert stop["command"].endswith(str(scanner.service_dir("vllm"))), stop["command"]
        assert {supervisor, scanner.pid}.isdisjoint(signalled(doc))
        no_generic_hint(doc)
        time.sleep(AFTER_STOP_S)
        assert scanner.status("vllm") == "down"
        assert not alive(pid) and alive(supervisor) and alive(scanner.pid) and holders_now(ps) == []
    finally:
        scanner.down()


def test_a_stop_whose_tool_is_not_on_path_is_named_not_run(ps, tmp_path, supervisord_tool, monkeypatch):
    """supervisorctl missing where the agent runs: the program is named with the command, and
    neither signalled (supervisord would start it again) nor left to a stop that cannot start."""
    sd = Supervisord(tmp_path, {"vllm": holder_argv(ps.devdir, tmp_path / "ready")})
    try:
        pid = sd.program_pid("vllm")
        wait_for(lambda: (tmp_path / "ready").exists(), "the holder holds its devices")
        doc = scan.collect(scan_args(ps).selection)
        args = Options(target=None, match=[], protect=[], scope=str(ps.base), scope_uid=None,
                       only_matching=False, stop_starters=False, disable=False, all_users=False)
        monkeypatch.setattr(plan_module, "on_path", lambda tool: tool != "supervisorctl")
        built = plan_module.build(doc, args)
        assert pid not in {t["pid"] for t in built["targets"]}
        [stop] = built["managers"]
        assert (stop["kind"], stop["run"], stop["pids"]) == ("supervisord", False, [pid])
        assert stop["why"] == "`supervisorctl` is not on this agent's PATH, so the teardown cannot run the stop"
        row = next(r for r in built["left_alone"] if r["pid"] == pid)
        assert row["manager"]["stop_command"] == f"supervisorctl -c {sd.conf} stop vllm"
    finally:
        sd.down()
