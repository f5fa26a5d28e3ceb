"""The Slurm epilog, prolog and `invoke undrain` on a real one-node Slurm (tests/support/slurm_cluster.py).

Real jobs run as a throwaway user made for this module (useradd, removed at the end), so the
epilog, which only touches processes of the job's uid holding the job's GPUs, can match
nothing but what these jobs left. The node's GPUs are mknod'ed character devices in the
cluster's temp dir; a job's "CUDA context" is a read-only mapping of its GPU's node.

The unkillable leftover is a job's orphan frozen in a cgroup-v1 freezer cgroup: it shows
state D, as a process stuck in the driver does, and SIGKILL takes effect only when it is
thawed - exactly what an epilog meets when a process will not die, and what `undrain`
must refuse to resume until it is gone.
"""
from __future__ import annotations

import fcntl
import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import pytest

from tests.conftest import REPO, invoke
from tests.support.procs import alive, state, wait_for
from tests.support.second_user import make_user, remove_user
from tests.support.slurm_cluster import NODE, SlurmCluster, available

FREEZER = Path("/sys/fs/cgroup/freezer")

# A job's worker that outlives it: double fork + setsid (out of the job's process tree and
# session), then open and map the job's GPU node. Writes its pid; with a second argument it
# keeps the job running until that file exists (so the test can freeze the orphan first).
HOLDER = r"""
import mmap, os, sys, time
devdir, pidfile = sys.argv[1], sys.argv[2]
hold_job_until = sys.argv[3] if len(sys.argv) > 3 else None
gpu = os.environ["CUDA_VISIBLE_DEVICES"].split(",")[0]
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        fd = os.open(os.path.join(devdir, "nvidia" + gpu), os.O_RDONLY)
        ctx = mmap.mmap(fd, 4096, prot=mmap.PROT_READ)
        with open(pidfile + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.rename(pidfile + ".tmp", pidfile)
        time.sleep(600)
    os._exit(0)
while not os.path.exists(pidfile):
    time.sleep(0.01)
while hold_job_until and not os.path.exists(hold_job_until):
    time.sleep(0.01)
"""

WRAPPER = """#!/bin/sh
# What a cluster would set as {kind}=: gpu-pivot's {kind} with this cluster's settings.
GPU_PIVOT_SLURM_CONF={conf}
export GPU_PIVOT_SLURM_CONF
exec {script} >>{log} 2>&1
"""

pytestmark = pytest.mark.skipif(bool(available()) and os.environ.get("CI") != "true",
                                reason=available() or "")


class Lab:
    """The cluster, the job user and the files jobs and tests share."""

    def __init__(self, cluster: SlurmCluster, user, sshd):
        self.c = cluster
        self.user = user
        self.sshd = sshd
        self.jobs = cluster.dir / "jobs"
        self.holder = cluster.dir / "holder.py"
        self.run_dir = cluster.dir / "run"

    def submit(self, *script_args: str, gres: int = 1) -> str:
        argv = ["sbatch", "--parsable", f"--gres=gpu:{gres}", f"--output={self.jobs}/job-%j.out",
                f"--chdir={self.jobs}", "--wrap", " ".join(["/usr/bin/python3", str(self.holder), str(self.c.devdir),
                                                            *script_args])]
        done = self.user.run(argv, env=self.user.env(SLURM_CONF=str(self.c.conf)), text=True)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip().split(";")[0]

    def log(self, kind: str) -> str:
        path = self.c.dir / f"{kind}.log"
        return path.read_text() if path.exists() else ""

    def audit(self) -> list:
        path = self.run_dir / "audit.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def hosts_env(self, tmp_path: Path) -> dict:
        path = tmp_path / "hosts.env"
        path.write_text(self.sshd.hosts_env(NODE, extra={"DEVICES": f"{self.c.devdir}/nvidia*",
                                                        "FAKE_DEVICES": "yes"}))
        return dict(os.environ, GPU_PIVOT_HOSTS_FILE=str(path), SLURM_CONF=str(self.c.conf))


@pytest.fixture(scope="module")
def lab(sshd):
    why = available()
    if why:
        pytest.fail(f"CI must run the Slurm tests: {why}")  # only reached under CI=true
    user = make_user()
    cluster = SlurmCluster(gpus=2)
    try:
        d = cluster.dir
        conf = d / "gpu-pivot-slurm.env"
        conf.write_text(f"DEVICES={cluster.devdir}/nvidia*\nFAKE_DEVICES=yes\nRUN_DIR={d / 'run'}\n"
                        "GRACE=1\nTIMEOUT=1\nSETTLE=0.3\n")
        os.chmod(conf, 0o644)
        wrappers = {}
        for kind in ("prolog", "epilog"):
            path = d / f"{kind}.sh"
            path.write_text(WRAPPER.format(kind=kind.capitalize(), conf=conf, script=REPO / "scripts" / "slurm" / kind,
                                           log=d / f"{kind}.log"))
            path.chmod(0o755)
            wrappers[kind] = path
        lab = Lab(cluster, user, sshd)
        lab.holder.write_text(HOLDER)
        lab.holder.chmod(0o644)
        lab.jobs.mkdir()
        os.chown(lab.jobs, user.uid, user.gid)
        cluster.start(prolog=wrappers["prolog"], epilog=wrappers["epilog"])
        yield lab
    finally:
        cluster.stop()
        remove_user(user)
        if not os.environ.get("GP_SLURM_KEEP"):
            cluster.remove()


@pytest.fixture
def idle(lab):
    """Each test starts on an idle node and leaves it so (resumed, whatever it did)."""
    lab.c.wait_state("idle")
    yield lab
    if lab.c.node_state() != "idle":
        lab.c.resume()


def orphan_pid(lab: Lab, job: str) -> int:
    path = lab.jobs / f"orphan-{job}"
    return int(wait_for(lambda: path.exists() and path.read_text(), f"job {job}'s orphan"))


def test_the_orphan_a_job_leaves_on_its_gpu_is_freed_and_the_node_stays_idle(idle):
    lab = idle
    job = lab.submit(str(lab.jobs / "orphan-$SLURM_JOB_ID"))
    pid = wait_for(lambda: (lab.jobs / f"orphan-{job}").exists() and orphan_pid(lab, job), "orphan")
    lab.c.wait_job_gone(job)
    wait_for(lambda: not alive(pid), f"orphan {pid} gone", timeout=10)
    sent = [a for a in lab.audit() if a["pid"] == pid]
    assert [a["signal"] for a in sent][:1] == ["SIGTERM"] and sent[0]["result"] == "sent", sent
    assert sent[0]["operator"] == f"slurm-epilog job {job} uid {lab.user.uid}"
    assert f"gpu-pivot epilog job {job}: GPUs [0] free" in lab.log("epilog")
    lab.c.wait_state("idle")
    assert lab.c.reason() == ""


def _freeze(pid: int) -> Path:
    group = FREEZER / f"gp-test-{secrets.token_hex(4)}"
    group.mkdir()
    (group / "tasks").write_text(str(pid))
    (group / "freezer.state").write_text("FROZEN")
    wait_for(lambda: (group / "freezer.state").read_text().strip() == "FROZEN", "frozen")
    return group


def _thaw(group: Path) -> None:
    (group / "freezer.state").write_text("THAWED")


def _remove_group(group: Path) -> None:
    if group.exists():
        _thaw(group)
        for pid in filter(None, (group / "tasks").read_text().split()):
            wait_for(lambda p=int(pid): not alive(p), f"pid {pid} gone after thaw")
        wait_for(lambda: not (group / "tasks").read_text().strip(), "freezer cgroup empty")
        group.rmdir()


@pytest.mark.skipif(not (FREEZER / "freezer.state").exists() and not FREEZER.is_dir(),
                    reason="needs the cgroup v1 freezer (/sys/fs/cgroup/freezer) to make a process SIGKILL cannot end")
def test_an_unkillable_leftover_drains_with_a_specific_reason_and_undrain_waits_until_it_is_gone(idle, tmp_path):
    lab = idle
    release = lab.jobs / f"release-{secrets.token_hex(4)}"
    job = lab.submit(str(lab.jobs / "orphan-$SLURM_JOB_ID"), str(release))
    pid = orphan_pid(lab, job)
    group = _freeze(pid)
    try:
        release.touch()
        lab.c.wait_job_gone(job)
        lab.c.wait_state("drained", timeout=60)  # the epilog's own budget ends it; how soon: make bench
        reason = lab.c.reason()
        assert reason.startswith(f"gpu-pivot epilog job {job}: pid {pid} (python3"), reason
        assert "state D" in reason and "nvidia0" in reason and "after SIGKILL" in reason, reason
        assert state(pid) == "D"
        sent = {a["signal"] for a in lab.audit() if a["pid"] == pid}
        assert {"SIGTERM", "SIGKILL"} <= sent, sent

        env = lab.hosts_env(tmp_path)
        still = invoke("undrain", "--host", NODE, env=env)
        out = still.stdout.decode()
        assert still.returncode == 1, out + still.stderr.decode()
        assert f"{NODE}: left drained" in out and f"pid {pid}" in out, out
        assert lab.c.node_state() == "drained" and lab.c.reason() == reason

        _thaw(group)  # the pending SIGKILL ends it now, as a driver call that finally returns would
        wait_for(lambda: not alive(pid), f"pid {pid} ends once thawed")
        done = invoke("undrain", "--host", NODE, env=env)
        out = done.stdout.decode()
        assert done.returncode == 0, out + done.stderr.decode()
        assert f"{NODE}: resumed" in out and reason in out, out
        lab.c.wait_state("idle")
        again = invoke("undrain", "--host", NODE, env=env)
        assert again.returncode == 0 and f"{NODE}: not drained (idle): nothing to do" in again.stdout.decode()
    finally:
        _remove_group(group)


def test_a_job_whose_gpus_are_held_is_requeued_held_and_the_node_drained(idle, shared_ps):
    lab = idle
    holders = []
    for i in range(lab.c.gpus):  # whichever GPU the job gets is held, by a process the test started
        holders.append(shared_ps.start([sys.executable, "-c", HOLD_AS_ROOT, str(lab.c.device(i))]))
    job = lab.submit(str(lab.jobs / "never-$SLURM_JOB_ID"))
    lab.c.wait_state("drained", timeout=15)
    reason = lab.c.reason()
    assert reason.startswith(f"gpu-pivot prolog job {job}: pid "), reason
    assert any(f"pid {p} " in reason for p in holders) and "holds nvidia" in reason, reason
    wait_for(lambda: "held" in lab.c.job_field(job, "%r").lower(), f"job {job} requeued held")
    assert lab.c.job_field(job, "%T") == "PENDING"
    assert not (lab.jobs / f"never-{job}").exists()  # the job never ran
    lab.c.run("scancel", job)
    shared_ps.kill_all()


HOLD_AS_ROOT = r"""
import mmap, os, sys, time
ctx = mmap.mmap(os.open(sys.argv[1], os.O_RDONLY), 4096, prot=mmap.PROT_READ)
open(sys.argv[-1], "w").close()
time.sleep(600)
"""


def _epilog(env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([str(REPO / "scripts" / "slurm" / "epilog")], env=env, capture_output=True, text=True,
                          timeout=30)


def test_epilog_outside_slurm_is_bounded_idempotent_and_refuses_bad_input(tmp_path):
    conf = tmp_path / "conf.env"
    conf.write_text(f"DEVICES={tmp_path}/nvidia*\nFAKE_DEVICES=yes\nRUN_DIR={tmp_path / 'run'}\n")
    os.mknod(tmp_path / "nvidia0", 0o600 | 0o020000, os.makedev(1, 5))
    base = {"GPU_PIVOT_SLURM_CONF": str(conf), "SLURM_JOB_ID": "7", "SLURM_JOB_UID": "4000000",
            "SLURM_JOB_GPUS": "0"}
    for _ in range(2):  # nothing there: free, twice
        done = _epilog(base)
        assert done.returncode == 0, done.stderr
        assert "gpu-pivot epilog job 7: GPUs [0] free" in done.stdout
    bad = _epilog(dict(base, SLURM_JOB_UID="nobody"))
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr
    assert "SLURM_JOB_UID='nobody'" in bad.stderr
    missing = _epilog(dict(base, SLURM_JOB_GPUS="3"))
    assert missing.returncode == 1 and "GPU 3: no device file nvidia3" in missing.stderr
    conf.write_text("GRACE=8\nTIMEOUT=5\n")
    slow = _epilog(base)
    assert slow.returncode == 2 and "must stay under" in slow.stderr, slow.stderr


def test_undrain_resumes_only_nodes_drained_for_gpu_leftovers():
    from scripts.engines import undrain

    assert undrain.decide("n1", "drained", "gpu-pivot epilog job 4: pid 9 ...", force=False) is None
    assert undrain.decide("n1", "drained", "Kill task failed", force=False) is None
    person = undrain.decide("n1", "drained", "bad DIMM, do not use", force=False)
    assert person is not None and person.action == "left alone" and "--force" in person.detail and person.code == 1
    assert undrain.decide("n1", "drained", "bad DIMM, do not use", force=True) is None
    busy = undrain.decide("n1", "draining", "gpu-pivot epilog job 4: x", force=True)
    assert busy is not None and busy.action == "left drained" and "jobs running" in busy.detail
    unknown = undrain.decide("n9", None, "", force=False)
    assert unknown is not None and unknown.code == 2


def test_the_drain_reason_is_one_bounded_line():
    from scripts.engines.slurm_job import REASON_MAX, Job, reason_text

    job = Job("12", 1000, (0,), "n1")
    text = reason_text("epilog", job, ["pid 5 (x\ny, state D) still holds " + "a" * 400, "second"])
    assert "\n" not in text and len(text) == REASON_MAX and text.startswith("gpu-pivot epilog job 12: pid 5 (x y")
    assert reason_text("prolog", job, ["one", "two", "three"]).endswith("one (+2 more)")


def test_a_neighbouring_jobs_busy_gpu_is_not_this_jobs_problem():
    """NVML cannot exist here: the agent's document is written out as NVML's rows would read,
    and read through the contract's record (a verify's scan; a teardown's final scan reads
    the same)."""
    from scripts.agent.wire import records
    from scripts.engines.slurm_job import _last_scan, job_problems

    def doc(**kw):
        gpus = [{"index": i, "name": "H200", "used_mib": used, "reserved_mib": 0, "total_mib": 81559,
                 "processes": procs} for i, used, procs in kw.get("gpus", [])]
        scan = {"hostname": "n1", "gpu_source": "nvml", "gpus": gpus, "holders": kw.get("holders", []),
                "denied": kw.get("denied", [])}
        verify = records.read_document(dict(scan, command="verify", exit_code=1, free=False, problems=[]))
        teardown = records.read_document(dict(scan, command="teardown", exit_code=1, before=gpus, after=gpus,
                                               wall_s=1.0, plan={"targets": [], "protected": []}))
        assert _last_scan(verify) == _last_scan(teardown)
        return _last_scan(verify)

    busy_neighbour = [(0, 0, []), (1, 80000, [{"pid": 77, "used_mib": 80000}])]
    other = {"pid": 77, "state": "R", "devices": [], "gpu_mib": {"1": 80000}, "protected": None}
    assert job_problems(*doc(gpus=busy_neighbour, holders=[other]), (0,), 0) == []
    assert job_problems(*doc(gpus=busy_neighbour, holders=[other]), (1,), 0) == [
        "GPU 1: compute process pid 77 (80000 MiB)", "GPU 1: 80000 MiB used > 0 MiB",
        "pid 77 (state R) holds memory on GPU 1"]
    holder = {"pid": 5, "state": "S", "devices": ["/dev/nvidia0"], "gpu_mib": {}, "protected": None}
    assert job_problems(*doc(gpus=busy_neighbour, holders=[holder]), (0,), 0) == ["pid 5 (state S) holds /dev/nvidia0"]
    monitor = dict(holder, protected="GPU monitor", mapped_devices=[])
    assert job_problems(*doc(gpus=busy_neighbour, holders=[monitor]), (0,), 0) == []
    assert job_problems(*doc(gpus=busy_neighbour, denied=[12]), (0,), 0) == [
        "not every process could be inspected, so nothing is called free"]


def test_the_epilog_ends_within_its_budget_when_the_controller_does_not_answer(idle):
    """sinfo and scontrol (3 s each) ran after the agent's budget,
    so a leftover SIGKILL cannot end, another teardown's lock held for most of the lock wait,
    and a controller that does not answer (slurmctld stopped with SIGSTOP: its socket
    accepts, nothing replies) made the epilog run over 10 s."""
    from scripts.agent.teardown import hostlock

    lab = idle
    conf = lab.c.dir / "slow-epilog.env"
    conf.write_text(f"DEVICES={lab.c.devdir}/nvidia*\nFAKE_DEVICES=yes\nRUN_DIR={lab.run_dir}\n"
                    "GRACE=1\nTIMEOUT=1\nSETTLE=0\n")  # short waits: the budget's rest is for a loaded machine
    ready = lab.jobs / f"ready-{secrets.token_hex(4)}"
    holder = lab.user.popen([lab.user.python, "-c", HOLD_AS_ROOT, str(lab.c.device(0)), str(ready)])
    wait_for(ready.exists, "the job user's leftover mapped nvidia0")
    group = _freeze(holder.pid)
    ctld = int((lab.c.dir / "slurmctld.pid").read_text())
    lab.run_dir.mkdir(mode=0o700, exist_ok=True)
    lock = os.open(lab.run_dir / hostlock.LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX)

    def release_when_waited():  # the epilog's teardown waits 0.8 s of its 1 s for the lock
        wait_for(lambda: any("slurm-epilog job 990 " in a["cmdline"] for a in hostlock.teardown_agents()),
                 "the epilog's teardown agent", timeout=15)
        time.sleep(0.8)
        os.close(lock)

    releaser = threading.Thread(target=release_when_waited)
    os.kill(ctld, signal.SIGSTOP)
    try:
        releaser.start()
        done = subprocess.run([str(REPO / "scripts" / "slurm" / "epilog")], capture_output=True, text=True, timeout=120,
                              env={"GPU_PIVOT_SLURM_CONF": str(conf), "SLURM_JOB_ID": "990", "SLURMD_NODENAME": NODE,
                                   "SLURM_JOB_UID": str(lab.user.uid), "SLURM_JOB_GPUS": "0",
                                   "SLURM_CONF": str(lab.c.conf)})
        assert done.returncode == 1, done.stderr
        # it ended on its own (the controller never answered) and said why; how long it takes is
        # measured by make bench, not here (a loaded machine)
        assert f"pid {holder.pid} " in done.stderr and "drain reason not set" in done.stderr, done.stderr
    finally:
        releaser.join(20)
        os.kill(ctld, signal.SIGCONT)
        if alive(holder.pid):
            os.kill(holder.pid, signal.SIGKILL)
        _remove_group(group)
        holder.wait(10)


class _Verified:
    """What `verify` read: NVML's health verdict cannot exist without a GPU, so its result is written out."""

    def __init__(self, code: int, problems: list):
        self.result = types.SimpleNamespace(code=code, free=True, problems=problems)


def _undrain(lab: Lab, verify) -> list:
    from scripts.engines import undrain
    from scripts.ops import fleet

    return undrain.undrain([types.SimpleNamespace(alias=NODE)], False, verify, fleet.each_host)


def test_undrain_resumes_only_on_exit_0_and_only_a_node_still_drained_as_it_read(idle, monkeypatch):
    """Exit 9 (free, but the GPU needs a reset or a reboot) and the
    race seen in code: a person drains the node for another reason during the verify."""
    lab = idle
    monkeypatch.setenv("SLURM_CONF", str(lab.c.conf))
    reason = "gpu-pivot epilog job 4: pid 5 (python3 user x, state D) still holds after SIGKILL: nvidia0"
    lab.c.run("scontrol", "update", f"nodename={NODE}", "state=drain", f"reason={reason}")
    lab.c.wait_state("drained")

    [reboot] = _undrain(lab, lambda h: _Verified(9, ["GPU 0: Xid 79 (fell off the bus): reboot the node"]))
    assert reboot.action == "left drained" and "Xid 79" in reboot.detail and reboot.code == 9, reboot
    assert lab.c.node_state() == "drained" and lab.c.reason() == reason

    def person_drains_meanwhile(h):
        lab.c.run("scontrol", "update", f"nodename={NODE}", "state=drain", "reason=bad DIMM, do not use")
        return _Verified(0, [])

    [raced] = _undrain(lab, person_drains_meanwhile)
    assert raced.action == "left alone" and "bad DIMM" in raced.detail and raced.code == 1, raced
    assert lab.c.node_state() == "drained" and lab.c.reason() == "bad DIMM, do not use"

    lab.c.run("scontrol", "update", f"nodename={NODE}", "state=drain", f"reason={reason}")
    [resumed] = _undrain(lab, lambda h: _Verified(0, []))
    assert resumed.action == "resumed" and resumed.code == 0, resumed
    lab.c.wait_state("idle")
