"""Xid findings and resets that no local user can forge or slip past: the kernel log's lines,
the NVML sources and reset's uninspected processes.

1. Any local user put `NVRM: Xid (PCI:0000:ff:00): 79, ...` into the kernel log (an overlay
   mount's error message quotes the user's option string; /dev/kmsg takes user writes), the
   unanchored parser read it as the driver's, and an Xid on an unknown bus went to every GPU:
   every GPU "reboot needed", the node drained. Nothing here writes to this machine's kernel
   log: the parser and filters run on recorded records in /dev/kmsg's format
   (`PRI,SEQ,USEC,FLAGS;TEXT`, PRI = facility * 8 + level) and on `dmesg` output from a
   stand-in `dmesg` that prints the user's line unless asked for --kernel.
6. `--mps quit` spent its full wait on every process that CALLED itself nvidia-cuda-mps-control,
   ran /proc/PID/exe (the user's binary) as root's helper, and quit a daemon still serving
   another user's job.
7. A protected name protected whatever ran under it: a user's leftover `exec -a Xorg` was never
   signalled, and a look-alike `nvidia-cuda-mps-control` mapping the GPU let verify say free.
8. After a driver call hung, the MIG and MPS NVML calls still ran without a bound.
Seen in code: `reset` ran its checks with processes it could not inspect.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
import time
import types
from pathlib import Path

import pytest

from scripts.agent.gpu import checkup, health, mps, xid
from scripts.agent.gpu.nvml import Nvml
from scripts.agent.holders.scan import Scan
from scripts.agent.policy import rules
from scripts.agent.procs import procscan
from scripts.agent.teardown import reset
from scripts.agent.wire import call as wire_call, codes, defaults, requests
from tests.support.gpu_standins import CLIENT, HOLD, agent, mps_program
from tests.support.procs import alive, wait_for

FORGED = "NVRM: Xid (PCI:0000:ff:00): 79, pid=1, GPU has fallen off the bus."
GENUINE = "NVRM: Xid (PCI:0000:3b:00): 63, pid=1896, Row Remapper: New row marked for remapping"
PY3 = "/usr/bin/python3"  # a Python every user can run (the test's own sits in root's 0700 home)
HOLD_ONE = "import sys, time\nf = open(sys.argv[1], 'rb')\ntime.sleep(300)\n"


def rows(n):
    return [{"index": i, "processes": []} for i in range(n)]


# -- Xid lines only from the kernel, at the start of its record; an unknown bus is no GPU's ------------

def test_kmsg_records_of_user_facility_and_quoted_xids_are_not_the_drivers():
    user_write = "12,5001,9000000000,-;" + FORGED  # 12 = LOG_USER (1) * 8 + LOG_WARNING: echo >/dev/kmsg
    overlay = "3,5002,9000000001,-;overlayfs: failed to resolve '/nonexist/%s': -2" % FORGED  # kernel, quoted
    driver = "4,5003,9000000002,-;" + GENUINE + "\n SUBSYSTEM=pci\n DEVICE=+pci:0000:3b:00.0\n"
    assert xid.parse_kmsg_record(user_write) is None
    usec, text = xid.parse_kmsg_record(overlay)
    assert usec == 9000000001 and xid.parse_line(text) is None
    usec, text = xid.parse_kmsg_record(driver)
    assert (usec, xid.parse_line(text)["xid"], xid.parse_line(text)["bus"]) == (9000000002, 63, "0000:3b:00")
    assert xid.parse_kmsg_record("\u00b2,1,2,-;" + GENUINE) is None  # not ASCII digits: not a record


def fake_dmesg(tmp_path, monkeypatch):
    """A stand-in `dmesg`: the kernel's record, plus the user's forged line unless --kernel."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    tool = bindir / "dmesg"
    tool.write_text("#!/bin/sh\necho '[  200.500000] %s'\n[ \"$1\" = --kernel ] && exit 0\n"
                    "echo '[  201.000000] overlayfs: failed to resolve '\"'\"'/x/%s'\"'\"': -2'\n"
                    "echo '[  202.000000] %s'\n" % (GENUINE, FORGED, FORGED))
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", "%s:%s" % (bindir, os.environ["PATH"]))


def test_dmesg_fallback_reads_the_kernel_facility_only(tmp_path, monkeypatch):
    fake_dmesg(tmp_path, monkeypatch)
    events, source, error = xid.kernel_log(100 * 10 ** 6, kmsg=str(tmp_path / "no-kmsg"))
    assert source == "dmesg" and error is None
    assert [(e["xid"], e["bus"]) for e in events] == [(63, "0000:3b:00")]


def test_a_forged_xid_on_an_unknown_bus_does_not_make_the_gpus_need_a_reboot(tmp_path, monkeypatch):
    """No bus known (no NVML). The kernel's own genuine Xid on a bus no listed GPU has is
    noted, never held against every GPU; the forged one is not read at all."""
    fake_dmesg(tmp_path, monkeypatch)
    source = types.SimpleNamespace(name="none")
    gpus = health.assess(rows(2), source, since_us=100 * 10 ** 6, kmsg=str(tmp_path / "no-kmsg"))
    for g in gpus:
        h = g["health"]
        assert h["verdict"] == "unknown", h
        assert not any("Xid 79" in r for r in h["reasons"]), h
        assert any("Xid 63 pid 1896 on PCI 0000:3b:00, not among the GPUs listed here" in r for r in h["reasons"])
    assert health.exit_code(codes.EXIT_OK, gpus) == codes.EXIT_OK


def test_the_sandbox_reads_no_kernel_log(tmp_path, monkeypatch):
    """Fake GPUs are not the machine's: its kernel log (other users' lines, real Xids of real
    GPUs) says nothing about them (seen: the sandbox showed a forged REBOOT NEEDED)."""
    fake_dmesg(tmp_path, monkeypatch)
    gpus = health.assess(rows(2), types.SimpleNamespace(name="sandbox (fake GPUs)"), since_us=100 * 10 ** 6,
                         kmsg=str(tmp_path / "no-kmsg"))
    assert not any("Xid" in r or "kernel log" in r for g in gpus for r in g["health"]["reasons"]), gpus


# -- a protected name protects only what no user could have started so ----------------------------

@pytest.fixture
def open_dir():
    """A directory every uid can reach (tmp_path sits in root's 0700 tree): fake devices, programs."""
    path = Path(tempfile.mkdtemp(prefix="gp-rt3-"))
    path.chmod(0o755)
    dev = path / "nvidia0"
    dev.write_bytes(b"\0" * 4096)
    dev.chmod(0o666)
    yield path
    shutil.rmtree(path)


def holding(pid, dev):
    """Wait until pid has dev open (a real holder); returns its /proc record."""
    def has():
        try:
            return any(os.readlink("/proc/%d/fd/%s" % (pid, fd)) == str(dev) for fd in os.listdir("/proc/%d/fd" % pid))
        except OSError:
            return False
    wait_for(has, "pid %d to open %s" % (pid, dev))
    return procscan.basic(pid)


def user_holder(user, argv0, dev, *extra, stdin=None):
    proc = user.popen(["bash", "-c", 'exec -a "$0" "$@"', argv0, PY3, *extra, "-c", HOLD_ONE, str(dev)],
                      stdin=stdin or subprocess.DEVNULL)
    return proc.pid


@pytest.mark.parametrize("argv0", ["Xorg", "lxc-start", mps.SERVER, "nvidia-persistenced", "dcgm-exporter"])
def test_a_users_process_with_a_protected_name_is_not_protected(second_user, open_dir, argv0):
    pid = user_holder(second_user, argv0, open_dir / "nvidia0")
    info = holding(pid, open_dir / "nvidia0")
    assert rules.names_of(info) & set(rules.PROTECTED_NAMES), "the name is on the list: the process goes by it"
    assert rules.protect_reason(info, set()) is None, "a job user's leftover dodged the teardown by its name"


def test_an_argv_shaped_like_an_agent_call_does_not_protect_a_users_job(second_user, open_dir):
    job = open_dir / "job.py"
    job.write_text(HOLD_ONE.replace("sys.argv[1]", "sys.argv[-1]"))
    job.chmod(0o644)
    with open(job) as stdin:
        proc = second_user.popen(["bash", "-c", 'exec "$@"', "x", PY3, "-", "plan", "--marker", "0",
                                  str(open_dir / "nvidia0")], stdin=stdin)
    info = holding(proc.pid, open_dir / "nvidia0")
    assert wire_call.agent_call(info["argv"]), "the argv reads like an agent call"
    assert rules.protect_reason(info, set()) is None


def system_process(open_dir, name, owner_uid):
    """A process of the system account uid 1 (daemon) running a copy of Python named `name`,
    the copy owned by owner_uid."""
    prog = open_dir / name
    shutil.copy(os.path.realpath("/usr/bin/python3"), prog)
    prog.chmod(0o755)
    os.chown(prog, owner_uid, -1)
    proc = subprocess.Popen(["setpriv", "--reuid=1", "--regid=1", "--clear-groups", "--", str(prog), "-c", HOLD_ONE,
                             str(open_dir / "nvidia0")], stdin=subprocess.DEVNULL, start_new_session=True)
    return proc


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv") or not os.path.exists("/usr/bin/python3"),
                    reason="needs root, setpriv and /usr/bin/python3 to run a process as a system account")
def test_a_system_accounts_root_owned_program_keeps_its_name_protection(open_dir, second_user):
    trusted = system_process(open_dir, "nvidia-persistenced", 0)
    try:
        info = holding(trusted.pid, open_dir / "nvidia0")
        assert "NVIDIA persistence daemon" in (rules.protect_reason(info, set()) or "")
    finally:
        trusted.kill()
        trusted.wait()
    (open_dir / "nvidia-persistenced").unlink()
    writable = system_process(open_dir, "nvidia-persistenced", second_user.uid)  # a user can replace that file
    try:
        info = holding(writable.pid, open_dir / "nvidia0")
        assert rules.protect_reason(info, set()) is None
    finally:
        writable.kill()
        writable.wait()


def test_the_sandbox_trusts_the_names_of_its_own_uid_only(second_user, open_dir, monkeypatch):
    """--fake-devices (cli.py -> rules.trust_own_names): the stand-ins of the agent's own uid keep
    their names; any other user's look-alike does not."""
    pid = user_holder(second_user, "nvidia-persistenced", open_dir / "nvidia0")
    info = holding(pid, open_dir / "nvidia0")
    monkeypatch.setitem(rules._state, "sandbox_uid", second_user.uid)  # as the agent of that user would run
    assert "NVIDIA persistence daemon" in (rules.protect_reason(info, set()) or "")
    monkeypatch.setitem(rules._state, "sandbox_uid", os.geteuid())
    assert rules.protect_reason(info, set()) is None


# -- --mps quit: the daemon by its executable, one bounded wait, never a served daemon --------------

def test_look_alike_mps_processes_are_not_mps_and_their_exe_is_never_run(second_user, open_dir, monkeypatch):
    control = user_holder(second_user, mps.CONTROL, open_dir / "nvidia0")
    server = user_holder(second_user, mps.SERVER, open_dir / "nvidia0")
    procs = {p: holding(p, open_dir / "nvidia0") for p in (control, server)}
    assert mps.describe(procs, []) is None, "argv[0] alone made them the MPS daemon and server"
    monkeypatch.setenv("PATH", str(open_dir))  # no nvidia-cuda-mps-control on PATH
    assert mps.client_program(control) is None, "the user's program would have been run as the quit client"


def test_all_quits_share_one_bounded_wait(tmp_path, ps):
    """Three real daemons (root-owned MPS programs) whose servers never exit: the quits together
    stay within the one limit, and the daemons left over are reported as not sent."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    client = bindir / mps.CONTROL
    client.write_text("#!/bin/sh\nexit 0\n")
    client.chmod(0o755)
    controls, servers = [], []
    for i in range(3):
        pipe = tmp_path / ("pipe%d" % i)
        pipe.mkdir(mode=0o700)
        os.mkfifo(pipe / "control")
        server = ps.start([mps.SERVER, "-c", HOLD], executable=mps_program(tmp_path, mps.SERVER))
        control = ps.start([mps.CONTROL, "-c", HOLD], executable=mps_program(tmp_path, mps.CONTROL))
        start = procscan.basic(server)["start_time"]
        controls.append({"pid": control, "uid": 0, "start_time": 0, "pipe_dir": str(pipe), "cmdline": ""})
        servers.append({"pid": server, "start_time": start, "control": control})
    recs = mps.quit_all({"controls": controls, "servers": servers}, None, timeout_s=5)
    # one 5 s budget for all: the first daemon's server never exits, so its wait takes all of it
    # and the others are not even sent `quit` (had each got a whole wait, each would say so)
    assert not any(r["servers_gone"] for r in recs)
    assert "did not exit within" in recs[0]["error"], recs
    assert all("was spent" in (r["error"] or "") and not r["sent"] for r in recs[1:]), recs


def test_the_callers_deadline_counts_the_mps_quit():
    base = requests.Teardown(timeout=5)
    assert base.replace(mps_quit=True).deadline_s() == base.deadline_s() + defaults.MPS_QUIT_TIMEOUT_S


SPAWNING_CONTROL = (  # the daemon starts its server as its child, as MPS does, and kills it on `quit`
    "import os, subprocess, sys\npipe = os.environ['CUDA_MPS_PIPE_DIRECTORY']\n"
    "os.mkfifo(os.path.join(pipe, 'control'))\n"
    "server = subprocess.Popen(['%s', '-c', 'import sys, time; f = open(sys.argv[1]); time.sleep(300)', sys.argv[2]],"
    " executable=sys.argv[1])\n"
    "open(sys.argv[-1], 'w').close()\n"
    "with open(os.path.join(pipe, 'control')) as f:\n    line = f.readline()\n"
    "if line.strip() == 'quit':\n    server.kill()\n    server.wait()\n" % mps.SERVER)


def test_a_daemon_still_serving_another_users_job_is_not_quit(tmp_path, second_user, open_dir, ps):
    """A real MPS daemon whose server (its child) is on GPU 0 (the fake nvidia0), and a second
    user's job that still holds GPU 0: the scoped `teardown --mps quit` leaves the daemon and
    says why; once the job is gone, the same teardown quits it."""
    pipe = tmp_path / ("gp-mps3-%d" % os.getpid())
    pipe.mkdir(mode=0o700)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / mps.CONTROL).write_text(CLIENT)
    (bindir / mps.CONTROL).chmod(0o755)
    dev = open_dir / "nvidia0"
    control = ps.start([mps.CONTROL, "-c", SPAWNING_CONTROL, mps_program(tmp_path, mps.SERVER), str(dev)],
                       executable=mps_program(tmp_path, mps.CONTROL),
                       env=dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=str(pipe)))
    server = wait_for(lambda: [p for p in procscan.all_pids() if p not in (1, 2) and
                               (procscan.basic(p) or {}).get("ppid") == control], "the MPS server")[0]
    ps.adopt(server)
    holding(server, dev)
    job = user_holder(second_user, "python3", dev)
    holding(job, dev)
    env = {"PATH": "%s:%s" % (bindir, os.environ["PATH"]), "GPU_PIVOT_RUN_DIR": str(tmp_path / "run")}
    common = ["--devices=%s/nvidia*" % open_dir, "--fake-devices", "--grace", "0.2", "--timeout", "0.3",
              "--settle", "0.1", "--scope=" + pipe.name, "--mps", "quit"]
    code, doc = agent("teardown", *common, env_extra=env)
    q = doc["mps_quit"]
    assert len(q) == 1 and q[0]["control"] == control and not q[0]["sent"], q
    assert "still serves pid %d" % job in q[0]["error"]
    assert alive(server) and alive(control) and alive(job)
    os.kill(job, 9)
    wait_for(lambda: not alive(job), "the job to end")
    code, doc = agent("teardown", *common, env_extra=env)
    q = doc["mps_quit"]
    assert len(q) == 1 and q[0]["sent"] and q[0]["servers_gone"], q
    assert not alive(server)


# -- after a hung driver call, no MIG or MPS NVML call waits on the same driver ----------------------

class StuckNvml:
    """NVML whose calls (all but the bus id) never return: what a driver that stopped answering
    looks like from Python. A stand-in: a hung GPU cannot be made here."""

    def __init__(self, hang=lambda name: True):
        self.release = threading.Event()
        self.hang = hang

    def __getattr__(self, name):
        def call(*a):
            if name == "nvmlDeviceGetPciInfo":
                return types.SimpleNamespace(busId=b"00000000:3B:00.0")
            if self.hang(name):
                self.release.wait(60)
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
        return call


def annotate_within(doc, src, seconds):
    t = threading.Thread(target=checkup.annotate, args=(doc, src), daemon=True)
    t0 = time.monotonic()
    t.start()
    t.join(seconds)
    return not t.is_alive(), time.monotonic() - t0


def test_a_hung_health_call_is_the_verdict_and_mig_and_mps_are_not_asked(monkeypatch):
    monkeypatch.setattr(health, "CALL_TIMEOUT_S", 0.3)
    nv = StuckNvml()
    src = types.SimpleNamespace(name="nvml", nvml=Nvml(nv), handles=["h0"])
    doc = Scan({"gpus": [{"index": 0, "processes": []}]}, {}, set())
    try:
        done, _took = annotate_within(doc, src, 60)  # the stuck call never returns: done is the proof
        assert done, "annotate waited on the stuck driver after its verdict"
        assert src.hung and doc["gpus"][0]["health"]["verdict"] == "reboot needed"
        assert "mig" not in doc["gpus"][0] and doc["mps"] is None
    finally:
        nv.release.set()


def test_a_mig_call_that_hangs_is_bounded_too(monkeypatch):
    monkeypatch.setattr(health, "CALL_TIMEOUT_S", 0.3)
    nv = StuckNvml(hang=lambda name: "Mig" in name)
    src = types.SimpleNamespace(name="nvml", nvml=Nvml(nv), handles=["h0"])
    doc = Scan({"gpus": [{"index": 0, "processes": []}]}, {}, set())
    try:
        done, _took = annotate_within(doc, src, 60)
        assert done and src.hung, "a stuck MIG query held the agent"
    finally:
        nv.release.set()


# -- seen in code: reset refuses while some process could not be inspected ------------------------------

def test_reset_refuses_when_a_process_could_not_be_inspected(second_user, open_dir):
    """A real scan, with what an unprivileged agent reports about a process whose fds it cannot
    read (the second user's job): the reset's checks fail on it, and on a hidden /proc."""
    from scripts.agent.holders import scan
    from scripts.agent.options.record import Options

    pid = user_holder(second_user, "python3", open_dir / "nvidia0")
    holding(pid, open_dir / "nvidia0")
    args = Options(devices="%s/nvidia*" % open_dir, fake_devices=True, fake_gpus=None, protect=[],
                   scope=None, scope_uid=None)
    src = types.SimpleNamespace(name="sandbox (fake GPUs)", read=lambda: [{"index": 0, "processes": []}],
                                close=lambda: None)
    doc = scan.collect(args.selection, src)
    doc["holders"] = [h for h in doc["holders"] if h["pid"] != pid]  # unseen: its fds were not readable
    doc["denied"] = [pid]
    checks = {c["check"]: c for c in reset.checks(doc, src, 0)}
    assert not checks["every process inspected"]["ok"] and str(pid) in checks["every process inspected"]["detail"]
    doc["denied"], doc["proc_hidden"] = [], "/proc is mounted with hidepid=2"
    checks = {c["check"]: c for c in reset.checks(doc, src, 0)}
    assert not checks["every process inspected"]["ok"] and "hidepid" in checks["every process inspected"]["detail"]
    doc["proc_hidden"] = None
    assert {c["check"]: c for c in reset.checks(doc, src, 0)}["every process inspected"]["ok"]
