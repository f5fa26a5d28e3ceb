"""GPU health verdicts, MIG, MPS and reset preconditions, on this machine (no GPU).

What cannot exist here (a GPU, NVML, MIG, a GPU asking for a reset) comes from the STAND-IN
NVML in tests/support/standin/nvml (recorded answers: the healthy H200 values are the ones measured on
the GPU machine, the fault, MIG and NVLink values are set by each test and say so). Everything
else is real: a process really stuck in state D (frozen by the cgroup v1 freezer, so SIGKILL
cannot end it until it is thawed), real device-file holders, a real MPS-like control pipe
(a FIFO) and server process, the real agent run as a subprocess. Every teardown is scoped to
fake device files in the test's temp dir and a token only the test's processes carry.

Why not a FUSE file system that never answers a read (the issue's suggestion): there are no
FUSE Python bindings here, and a FUSE read waits interruptibly (state S) or killably, so
SIGKILL ends it; a task frozen by the v1 freezer is in state D and outlives SIGKILL, which is
the case the verdict is about.
"""
from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from scripts.agent.gpu import checkup, health, mig, mps, xid
from scripts.agent.gpu.nvml import Nvml
from scripts.agent.policy import rules
from scripts.agent.procs import procscan
from scripts.agent.wire import codes, records
from scripts.views import health as health_view, reset as reset_view, teardown as teardown_view
from tests.support.gpu_standins import CLIENT, HOLD, STANDIN, agent, mps_program
from tests.support.procs import alive, wait_for

# NVML's answers on a healthy H200 (driver 580.159.04, nvidia-ml-py 13.615.71), as measured
# on the GPU machine.
H200 = {"uuid": "GPU-0f3c0000-0000-0000-0000-000000000000", "name": "NVIDIA H200", "bus": "00000000:19:00.0",
        "used": 0, "reserved": 645922816, "total": 150754820096, "processes": [], "recovery_action": 0,
        "remapped_rows": [0, 0, 0, 0], "retired_pending": "not supported", "mig_mode": [0, 0]}


def gpu(**changes):
    g = dict(H200, **changes)
    g.setdefault("uuid", H200["uuid"])
    if "bus" in changes and "uuid" not in changes:  # one UUID per GPU, as NVML gives
        g["uuid"] = "GPU-%s" % changes["bus"].replace(":", "").replace(".", "")
    return g


def nvml(recording):
    """The stand-in module loaded in-process with a recording, and a source shaped like gpuinfo's."""
    spec = importlib.util.spec_from_file_location("standin_pynvml_%d" % id(recording), STANDIN / "pynvml.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.load(recording)
    source = type("Src", (), {})()
    source.name, source.nvml = "nvml", Nvml(mod)  # the agent's NVML wrapper over the stand-in
    source.handles = source.nvml.handles()
    source.settings_nv, source.settings_handles = source.nvml, source.handles  # as NvmlSource reads settings
    return mod, source


def rows(n):
    return [{"index": i, "processes": []} for i in range(n)]


# -- the verdict table ---------------------------------------------------------------------------

def test_verdict_table():
    assert health.verdict([], True)["verdict"] == "ok"
    assert health.verdict([], False)["verdict"] == "unknown"
    assert health.verdict([("reset needed", "a"), ("drain", "b")], True) == {"verdict": "reset needed",
                                                                            "reasons": ["a", "b"]}
    assert health.verdict([("reboot needed", "x"), ("reset needed", "y")], True)["verdict"] == "reboot needed"
    assert health.verdict([("unknown", "xid 9999")], True)["verdict"] == "unknown"
    assert health.verdict([("ok", "xid 13: restart the app")], True)["verdict"] == "ok"
    assert set(health_view.NEXT) <= set(health.ORDER)  # every verdict the report names a step for


@pytest.mark.parametrize("code,verdicts,want", [
    (0, ["ok", "ok"], 0), (0, ["ok", "unknown"], 0), (0, ["ok", "reset needed"], 9), (0, ["drain"], 9),
    (0, ["reboot needed"], 9), (1, ["reboot needed"], 1), (6, ["reset needed"], 6),
])
def test_the_verdict_changes_only_a_free_exit_code(code, verdicts, want):
    gpus = [{"index": i, "health": {"verdict": v, "reasons": []}} for i, v in enumerate(verdicts)]
    assert health.exit_code(code, gpus) == want
    assert codes.exit_name(9) == "unhealthy"


# -- NVML health queries (stand-in) --------------------------------------------------------------

@pytest.mark.parametrize("change,verdict,words", [
    ({}, "ok", "every health source answered"),
    ({"recovery_action": 1}, "reset needed", "GPU reset required"),
    ({"recovery_action": 2}, "reboot needed", "node reboot required"),
    ({"recovery_action": 3}, "drain", "drain peer-to-peer"),
    ({"recovery_action": 4}, "drain", "and reset the GPU"),
    ({"remapped_rows": [3, 1, 1, 0]}, "reset needed", "remapped rows pending"),
    ({"remapped_rows": [0, 9, 0, 1]}, "reset needed", "row remapping FAILED"),
    ({"remapped_rows": "not supported", "retired_pending": 1}, "reset needed", "retired pages pending"),
    ({"recovery_action": "not supported", "remapped_rows": "not supported"}, "unknown", "no health source"),
])
def test_nvml_health_queries(change, verdict, words):
    _, source = nvml({"gpus": [gpu(), gpu(bus="00000000:3b:00.0", **change)]})
    gpus = health.assess(rows(2), source)
    assert gpus[0]["health"]["verdict"] == "ok" and "recovery action 0" in gpus[0]["health"]["read"]
    h = gpus[1]["health"]
    assert h["verdict"] == verdict, h
    assert any(words in r for r in h["reasons"]), h


def test_a_call_that_does_not_return_is_itself_the_verdict():
    mod, source = nvml({"gpus": [gpu()], "hang": "nvmlDeviceGetRemappedRows"})
    try:
        h = health.assess(rows(1), source, timeout_s=0.3)[0]["health"]
        assert not mod.RELEASE.is_set()  # the call still hangs: a verdict at all is one not waited for
        assert h["verdict"] == "reboot needed" and "did not return within 0.3 s" in h["reasons"][0]
        assert source.hung  # gpuinfo.NvmlSource.close() skips nvmlShutdown then
    finally:
        mod.RELEASE.set()


def test_nvml_xid_events_since_the_teardown_started():
    _, source = nvml({"gpus": [gpu(), gpu(bus="00000000:3b:00.0", xid_events=[79])]})
    watch = xid.NvmlWatch.start(source.nvml, source.handles)
    assert watch.error is None
    gpus = health.assess(rows(2), source, since_us=xid.now_us(), watch=watch)
    assert gpus[0]["health"]["verdict"] == "ok"
    assert gpus[1]["health"]["verdict"] == "reboot needed"
    assert "Xid 79" in gpus[1]["health"]["reasons"][0]


def fake_tool(tmp_path, monkeypatch, name, script):
    """A stand-in command on PATH (nvidia-smi, dmesg): a real program the agent runs."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    (bindir / name).write_text("#!/bin/sh\n" + script)
    (bindir / name).chmod(0o755)
    monkeypatch.setenv("PATH", "%s:%s" % (bindir, os.environ["PATH"]))


def test_nvidia_smi_answers_and_its_hang_where_nvml_is_missing(tmp_path, monkeypatch):
    source = type("S", (), {"name": "nvidia-smi"})()
    fake_tool(tmp_path, monkeypatch, "nvidia-smi", "echo '0, 00000000:19:00.0, No, No'\n"
                                                   "echo '1, 00000000:3B:00.0, Yes, No'\n")
    gpus = health.assess(rows(2), source)
    assert [g["health"]["verdict"] for g in gpus] == ["ok", "reset needed"]
    finished, sleeper = tmp_path / "finished", tmp_path / "sleeper"
    fake_tool(tmp_path, monkeypatch, "nvidia-smi", f"sleep 30 & echo $! >>{sleeper}; wait; touch {finished}\n")
    try:
        gpus = health.assess(rows(2), source, timeout_s=0.3)
    finally:
        for pid in sleeper.read_text().split() if sleeper.exists() else ():  # the sleeps each call left
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
    assert not finished.exists()  # the verdict came while nvidia-smi still hung, not after it
    assert all(g["health"]["verdict"] == "reboot needed" and "did not return within 0.3 s" in g["health"]["reasons"][0]
               for g in gpus)


def test_kernel_log_xids_through_dmesg_when_kmsg_cannot_be_read(tmp_path, monkeypatch):
    """The `dmesg` fallback, windowed by the teardown's start (kernel-log clock)."""
    fake_tool(tmp_path, monkeypatch, "dmesg",
              "echo '[  100.000000] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.'\n"
              "echo '[  200.500000] NVRM: Xid (PCI:0000:3b:00): 63, pid=1896, Row Remapper: New row marked'\n"
              "echo '[  201.000000] NVRM: Xid (PCI:0000:19:00): 13, pid=7, Graphics Exception'\n")
    _, source = nvml({"gpus": [gpu(bus="00000000:19:00.0"), gpu(bus="00000000:3b:00.0")]})
    gpus = health.assess(rows(2), source, since_us=150 * 10 ** 6, kmsg=str(tmp_path / "no-kmsg"))
    assert gpus[0]["health"]["verdict"] == "ok" and "Xid 13" in gpus[0]["health"]["reasons"][0]
    assert gpus[1]["health"]["verdict"] == "reset needed", gpus[1]["health"]  # the Xid 79 was before the window
    assert "kernel log (dmesg) since the teardown started" in gpus[1]["health"]["read"]


def test_without_nvml_nothing_is_claimed():
    source = type("S", (), {"name": "sandbox (fake GPUs)"})()
    h = health.assess(rows(1), source)[0]["health"]
    assert h["verdict"] == "unknown" and any("no NVML" in r for r in h["reasons"])


# -- MIG (stand-in: MIG cannot be switched on on the GPU machine) -------------------------------

MIG_ON = gpu(mig_mode=[1, 1], mig_devices=[
    {"gi": 1, "ci": 0, "uuid": "MIG-aaaa", "used": 20 * 2 ** 20, "total": 35 * 2 ** 30},
    {"gi": 2, "ci": 0, "uuid": "MIG-bbbb", "used": 4 * 2 ** 30, "total": 35 * 2 ** 30}])


def test_mig_mode_and_per_instance_memory():
    _, source = nvml({"gpus": [gpu(), MIG_ON]})
    assert mig.read(source.nvml, source.handles[0]) == {"current": "disabled", "pending": "disabled", "instances": []}
    on = mig.read(source.nvml, source.handles[1])
    assert on["current"] == "enabled"
    assert [(i["gpu_instance"], i["uuid"], i["used_mib"], i["total_mib"]) for i in on["instances"]] == [
        (1, "MIG-aaaa", 20, 35840), (2, "MIG-bbbb", 4096, 35840)]
    _, source2 = nvml({"gpus": [gpu(mig_mode="not supported")]})
    assert mig.read(source2.nvml, source2.handles[0])["current"] == "not supported"


# -- the agent, run as a subprocess, against the stand-in NVML -----------------------------------

def fake_glob(ps):
    return ["--devices=" + ps.glob, "--fake-devices"]


def test_status_and_verify_carry_health_mig_and_the_exit_code(tmp_path, ps):
    rec = {"gpus": [gpu(), gpu(bus="00000000:3b:00.0", recovery_action=1), MIG_ON]}
    code, doc = agent("scan", *fake_glob(ps), recording=rec, tmp=tmp_path)
    assert doc["gpu_source"] == "nvml" and code == 0
    verdicts = [health_view.gpu_health(g)["verdict"] for g in doc["gpus"]]
    assert verdicts == ["ok", "reset needed", "ok"]
    assert doc["gpus"][2]["mig"]["current"] == "enabled" and len(doc["gpus"][2]["mig"]["instances"]) == 2
    code, doc = agent("verify", *fake_glob(ps), recording=rec, tmp=tmp_path)
    assert doc["free"] is True and code == codes.EXIT_UNHEALTHY == 9
    assert any(p.startswith("GPU 1: RESET NEEDED") for p in doc["problems"])
    record = records.read_document(doc)
    assert health_view.gpu_health(record.scan.gpus[1])["verdict"] == "reset needed"
    shown = health_view.health(record, "gpu1")
    assert "RESET NEEDED" in shown and "invoke reset --host gpu1 --gpu 1" in shown
    assert "GPU 2: MIG enabled" in health_view.mig(record) and "GI 2/CI 0 4096/35840 MiB" in health_view.mig(record)
    code, doc = agent("verify", *fake_glob(ps), recording={"gpus": [gpu()]}, tmp=tmp_path)
    assert code == 0 and doc["gpus"][0]["health"]["verdict"] == "ok", doc["problems"]


def test_reset_checks_every_precondition_and_is_a_dry_run_by_default(tmp_path, ps):
    code, doc = agent("reset", "--gpu", "1", *fake_glob(ps), tmp=tmp_path,
                      recording={"gpus": [gpu(), gpu(bus="0000:3b:00.0", display_mode=1)]})  # as the H200 reads
    assert code == 0 and doc["ready"] and not doc["ran"], doc
    assert doc["command"] == ["nvidia-smi", "--gpu-reset", "-i", "1"]
    assert "dry run" in doc["note"]
    assert {c["check"] for c in doc["checks"]} == {
        "every process inspected", "no process holds the GPU", "no compute process on the GPU",
        "persistence daemon handled",
        "not a display GPU", "no MIG instances", "nothing on NVLink peers"}
    record = records.read("reset", code, doc)
    assert record.ready and "would run: nvidia-smi --gpu-reset -i 1" in reset_view.report("gpu1", record)


def test_reset_refuses_while_mig_instances_exist(tmp_path, ps):
    code, doc = agent("reset", "--gpu", "0", "--yes", *fake_glob(ps), recording={"gpus": [MIG_ON]}, tmp=tmp_path)
    assert code == 1 and not doc["ran"] and "refused" in doc["note"]
    failed = {c["check"]: c["detail"] for c in doc["checks"] if not c["ok"]}
    assert list(failed) == ["no MIG instances"] and "2 MIG instance(s)" in failed["no MIG instances"]


def test_reset_refuses_a_held_gpu_a_display_gpu_and_a_busy_nvlink_peer(tmp_path, ps):
    holder = ps.start([sys.executable, "-c", HOLD, str(ps.devdir / "nvidia0")])
    rec = {"gpus": [gpu(bus="0000:19:00.0", display_active=1, display_mode=1, nvlink=["00000000:3B:00.0"]),
                    gpu(bus="0000:3b:00.0", used=2 ** 30, processes=[[4194000, 2 ** 30]])]}
    code, doc = agent("reset", "--gpu", "0", *fake_glob(ps), recording=rec, tmp=tmp_path)
    failed = {c["check"]: c["detail"] for c in doc["checks"] if not c["ok"]}
    assert code == 1 and not doc["ready"]
    assert str(holder) in failed["no process holds the GPU"]
    assert "display is active" in failed["not a display GPU"]
    assert "peer GPU(s) 1" in failed["nothing on NVLink peers"]
    code, doc = agent("reset", "--gpu", "7", *fake_glob(ps), recording=rec, tmp=tmp_path)
    assert code == 2 and "--gpu 7" in doc[codes.USAGE_ERROR]


# -- holders of /dev/nvidia-caps/* and the new protected names ----------------------------------

def test_holders_of_nvidia_caps_are_holders(ps):
    caps = ps.devdir / "nvidia-caps"
    caps.mkdir()
    (caps / "nvidia-cap1").write_bytes(b"")
    pid = ps.start([sys.executable, "-c", HOLD, str(caps / "nvidia-cap1")])
    code, doc = agent("scan", *fake_glob(ps))
    held = {h["pid"]: h["devices"] for h in doc["holders"]}
    assert held.get(pid) == [str(caps / "nvidia-cap1")]


@pytest.mark.parametrize("comm,argv0,why", [
    ("lxc-start", "[lxc monitor] /var/lib/lxc 129", "LXC container monitor"),
    ("nv-fabricmanager", "nv-fabricmanager", "Fabric Manager"),
    ("Xorg", "/usr/lib/xorg/Xorg", "X server"),
    ("Xwayland", "Xwayland", "X server"),
    ("nvidia-cuda-mps", "nvidia-cuda-mps-control", "CUDA MPS control daemon"),
    ("nvidia-cuda-mps", "nvidia-cuda-mps-server", "CUDA MPS server"),
])
def test_new_protected_processes(tmp_path, ps, comm, argv0, why):
    """Real processes with these names (comm from the file executed, argv[0] as they set it)."""
    link = tmp_path / comm
    link.symlink_to(sys.executable)
    pid = ps.start([argv0, "-c", HOLD], executable=str(link))
    info = procscan.basic(pid)
    assert info["comm"] == comm[:15]  # the kernel keeps 15 characters
    assert why in (rules.protect_reason(info, set()) or "")


# -- a holder stuck in state D that SIGKILL does not end -----------------------------------------

FREEZER = Path("/sys/fs/cgroup/freezer")


@pytest.fixture
def frozen(tmp_path):
    if os.geteuid() != 0 or not (FREEZER / "cgroup.procs").exists():
        pytest.skip("needs root and the cgroup v1 freezer to put a process in state D")
    cg = FREEZER / ("gp-health-%d-%d" % (os.getpid(), time.monotonic_ns()))
    cg.mkdir()

    def freeze(pid):
        (cg / "cgroup.procs").write_text(str(pid))
        (cg / "freezer.state").write_text("FROZEN")
        wait_for(lambda: (cg / "freezer.state").read_text().strip() == "FROZEN", "the freezer")
        wait_for(lambda: procscan.basic(pid)["state"] == "D", "state D")

    yield freeze
    (cg / "freezer.state").write_text("THAWED")
    for pid in (cg / "cgroup.procs").read_text().split():
        os.kill(int(pid), signal.SIGKILL)
    wait_for(lambda: not (cg / "cgroup.procs").read_text().strip(), "the frozen processes to end")
    cg.rmdir()


def test_a_holder_stuck_in_state_d_makes_the_verdict_reboot_needed(tmp_path, ps, frozen):
    token = "gp-stuck-%d" % os.getpid()
    pid = ps.start([sys.executable, "-c", HOLD, str(ps.devdir / "nvidia1"), token])
    frozen(pid)
    code, doc = agent("teardown", *fake_glob(ps), "--fake-gpus=" + str(ps.memdir), "--scope=" + token,
                      "--grace", "0.2", "--timeout", "0.5", "--settle", "0.1",
                      env_extra={"GPU_PIVOT_RUN_DIR": str(tmp_path / "run")})
    assert [t["pid"] for t in doc["plan"]["targets"]] == [pid]
    assert code == 1 and alive(pid), "SIGKILL cannot end a frozen task"
    assert [a["signal"] for a in doc["actions"]] == ["SIGTERM", "SIGKILL"]
    stuck = {s["pid"]: s for s in doc["stuck"]}
    assert stuck[pid]["state"] == "D" and stuck[pid]["wchan"] not in ("", "?")
    verdicts = {g["index"]: g["health"] for g in doc["after"]}
    assert verdicts[1]["verdict"] == "reboot needed"
    assert "state D, wchan %s" % stuck[pid]["wchan"] in verdicts[1]["reasons"][0]
    assert verdicts[0]["verdict"] == "unknown"  # fake GPUs: nothing read, nothing stuck on GPU 0
    t = records.read_document(doc)
    assert health_view.gpu_health(t.after[1])["verdict"] == "reboot needed"
    shown = teardown_view.report("local", t)
    assert "REBOOT NEEDED" in shown and "state D" in shown and "GPU 1: reboot the node" in shown


# -- CUDA MPS: a real control pipe (FIFO), a real server process, the agent's quit ---------------

CONTROL = ("import os, sys, time\npipe = os.environ['CUDA_MPS_PIPE_DIRECTORY']\n"
           "os.mkfifo(os.path.join(pipe, 'control'))\nserver = int(sys.argv[1])\n"
           "open(sys.argv[-1], 'w').close()\n"
           "with open(os.path.join(pipe, 'control')) as f:\n    line = f.readline()\n"
           "if line.strip() == 'quit':\n    os.kill(server, 9)\n")


def mps_setup(tmp_path, ps):
    pipe = tmp_path / ("gp-mps-%d" % os.getpid())  # the scope of the teardowns below: its pipe dir
    pipe.mkdir(mode=0o700)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    client = bindir / mps.CONTROL
    client.write_text(CLIENT)
    client.chmod(0o755)
    server = ps.start([mps.SERVER, "-c", HOLD, str(ps.devdir / "nvidia0")],
                      executable=mps_program(tmp_path, mps.SERVER))
    control = ps.start([mps.CONTROL, "-c", CONTROL, str(server)], executable=mps_program(tmp_path, mps.CONTROL),
                       env=dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=str(pipe)))
    return pipe, bindir, server, control


def test_mps_is_described_and_an_idle_server_is_named_as_such(tmp_path, ps):
    pipe, _, server, control = mps_setup(tmp_path, ps)
    procs = {p: procscan.basic(p) for p in (server, control)}
    gpus = [{"index": 0, "processes": [{"pid": server, "used_mib": 66}]}]
    info = mps.describe(procs, gpus)
    assert info["controls"][0]["pid"] == control and info["controls"][0]["pipe_dir"] == str(pipe)
    assert info["servers"][0]["pid"] == server and info["servers"][0]["clients"] == []
    problems = checkup.mps_problems({"mps": info, "gpus": gpus}, ["GPU 0: compute process pid %d (66 MiB)" % server])
    assert problems == [mps.problem_line(0, {"pid": server, "used_mib": 66}, info["servers"][0])]
    assert "no client" in problems[0]
    gpus[0]["processes"].append({"pid": control, "used_mib": 500})  # with a client on its GPU
    assert [c["pid"] for c in mps.describe(procs, gpus)["servers"][0]["clients"]] == [control]


def test_the_mps_control_daemons_mappings_do_not_block_free_its_servers_memory_does(tmp_path, ps):
    """Real processes: the MPS daemon (its executable a root-owned file of that name) maps the
    device and holds no memory - free; a program that only CALLS itself nvidia-cuda-mps-control
    (argv[0] and comm, this Python's file) while mapping the device is not exempted."""
    from scripts.agent.teardown import verify

    def holder(pid, gpu_mib):
        info = procscan.basic(pid)
        return dict(info, state="S", devices=["/dev/nvidia0"], mapped_devices=["/dev/nvidia0", "/dev/nvidiactl"],
                    gpu_mib=gpu_mib, protected=rules.PROTECTED_NAMES[os.path.basename(info["argv"][0])])

    control = ps.start([mps.CONTROL, "-c", HOLD], executable=mps_program(tmp_path, mps.CONTROL))
    doc = {"gpus": [{"index": 0, "used_mib": 0, "processes": []}], "devices": ["/dev/nvidia0"], "denied": [],
           "holders": [holder(control, {})]}
    assert verify.evaluate(doc, 0) == (True, [])
    link = tmp_path / mps.CONTROL  # comm from the link's name, argv[0] set: the real file is python
    link.symlink_to(os.path.realpath(sys.executable))
    look_alike = ps.start([mps.CONTROL, "-c", HOLD], executable=str(link))
    assert procscan.basic(look_alike)["comm"] == mps.CONTROL[:15]
    assert not mps.is_control(procscan.basic(look_alike)) and mps.is_control(procscan.basic(control))
    doc["holders"] = [holder(look_alike, {})]
    free, problems = verify.evaluate(doc, 0)
    assert not free and [p for p in problems if "pid %d " % look_alike in p], problems
    server = ps.start([mps.SERVER, "-c", HOLD], executable=mps_program(tmp_path, mps.SERVER))
    doc["holders"] = [holder(control, {}), holder(server, {"0": 66})]
    free, problems = verify.evaluate(doc, 0)
    assert not free and [p for p in problems if "pid %d " % server in p]


def test_mps_quit_refuses_a_pipe_that_is_not_the_daemons(tmp_path, second_user):
    pipe = tmp_path / "other"
    pipe.mkdir()
    os.mkfifo(pipe / "control")
    os.chown(pipe, second_user.uid, second_user.gid)
    rec = mps.quit_daemon({"pid": 1, "pipe_dir": str(pipe), "uid": 0, "start_time": 0}, [], exe="/bin/false")
    assert not rec["sent"] and "belongs to uid %d" % second_user.uid in rec["error"]
    link = tmp_path / "link"
    link.symlink_to(pipe)
    rec = mps.quit_daemon({"pid": 1, "pipe_dir": str(link), "uid": 0, "start_time": 0}, [], exe="/bin/false")
    assert "symbolic link" in rec["error"]


def test_teardown_protects_mps_by_default_and_quits_it_with_mps_quit(tmp_path, ps):
    pipe, bindir, server, control = mps_setup(tmp_path, ps)
    env = {"PATH": "%s:%s" % (bindir, os.environ["PATH"]), "GPU_PIVOT_RUN_DIR": str(tmp_path / "run")}
    common = [*fake_glob(ps), "--grace", "0.2", "--timeout", "0.3", "--settle", "0.1"]
    code, doc = agent("teardown", *common, "--scope=" + pipe.name, env_extra=env)
    protected = {p["pid"]: p["reason"] for p in doc["plan"]["protected"]}
    assert "CUDA MPS server" in protected[server] and alive(server) and alive(control)
    assert doc["mps_quit"] == [] and doc["mps"]["servers"][0]["pid"] == server
    code, doc = agent("teardown", *common, "--scope=gp-another-scope", "--mps", "quit", env_extra=env)
    assert doc["mps_quit"] == [] and alive(server), "a scoped teardown quits only the daemons in its scope"
    code, doc = agent("teardown", *common, "--scope=" + pipe.name, "--mps", "quit", env_extra=env)
    q = doc["mps_quit"]
    assert len(q) == 1 and q[0]["control"] == control and q[0]["sent"] and q[0]["servers_gone"], q
    assert q[0]["pipe_dir"] == str(pipe)
    assert not alive(server)
    assert any(a["signal"] == "mps quit" and a["pid"] == control for a in doc["actions"])
    assert "--mps quit: control pid %d" % control in health_view.mps(records.read_document(doc))
    assert code == 0, doc["problems"]
