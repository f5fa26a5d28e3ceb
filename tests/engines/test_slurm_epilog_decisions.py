"""The Slurm epilog run by hand as slurmd would run it: what it decides about a job's leftovers.

No Slurm daemons here (tests/engines/test_slurm.py has the real cluster): these are about what the
epilog itself decides. The job's user is a real second user (useradd, removed at the end);
its processes are real, hold a real character device (mknod on /dev/zero's numbers, 0666,
mapped as a CUDA context maps /dev/nvidiaN) in the test's temp dir, and "another running
job" is a process in a cgroup made as Slurm's cgroup plugins make a job's
(/slurm_<node>/uid_<U>/job_<N>/step_0, root's), made by the test under the cgroup v1 freezer
hierarchy (and /system.slice/<node>_slurmstepd.scope/job_<N> in the cgroup2 tree) and
removed at the end. Every process is ended by PID.
"""
from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import pytest

from scripts.engines import slurm_cgroup
from tests.conftest import REPO
from tests.support.procs import alive, wait_for

FREEZER = Path("/sys/fs/cgroup/freezer")
EPILOG = REPO / "scripts" / "slurm" / "epilog"
PROLOG = REPO / "scripts" / "slurm" / "prolog"
SYSTEMD = Path("/sys/fs/cgroup/systemd")

# Opens and maps the device, says so in a file, then waits to be ended. Told what through its
# environment, so its argv can take any shape a job might give it.
HOLD = r"""
import mmap, os, time
ctx = mmap.mmap(os.open(os.environ["GP_DEV"], os.O_RDONLY), 4096, prot=mmap.PROT_READ)
open(os.environ["GP_READY"] + ".tmp", "w").close()
os.rename(os.environ["GP_READY"] + ".tmp", os.environ["GP_READY"])
time.sleep(600)
"""
# How a job's leftover may dress up as something protected by name.
DODGES = {
    "host PROTECT pattern": ("{py}", "{hold}", "--as", "gp-dcgm-monitor"),
    # bash cannot exec the suite's venv python as the user (it lives under root's 0700 home): the system one
    "exec -a Xorg": ("bash", "-c", 'exec -a Xorg "$0" "$@"', shutil.which("python3", path="/usr/bin:/bin") or "{py}",
                     "{hold}"),
    "argv of a gpu-pivot agent call": ("{py}", "-", "plan", "--marker", "0"),
}


class Node:
    """Device nodes and the epilog's settings file in a temp dir the job's user can reach."""

    def __init__(self, tmp: Path, user, protect: str = ""):
        self.dir = tmp
        self.user = user
        (tmp / "ready").mkdir()
        os.chown(tmp / "ready", user.uid, user.gid)
        for i in (0, 1):
            os.mknod(tmp / f"nvidia{i}", 0o666 | 0o020000, os.makedev(1, 5))
            os.chmod(tmp / f"nvidia{i}", 0o666)
        self.conf = tmp / "conf.env"
        self.conf.write_text(f"DEVICES={tmp}/nvidia*\nFAKE_DEVICES=yes\nRUN_DIR={tmp / 'run'}\nGRACE=1\nTIMEOUT=1\n"
                             f"SETTLE=0.2\n" + (f"PROTECT={protect}\n" if protect else ""))
        (tmp / "hold.py").write_text(HOLD)
        self.n = 0

    def hold(self, gpu: int, shape: tuple = ("{py}", "{hold}")) -> int:
        """A process of the job's user holding nvidia<gpu> (argv as `shape` says; the code
        also comes on stdin); its pid once it has mapped it."""
        self.n += 1
        ready = self.dir / "ready" / str(self.n)
        argv = [w.format(py=self.user.python, hold=self.dir / "hold.py") for w in shape]
        env = self.user.env(GP_DEV=self.dir / f"nvidia{gpu}", GP_READY=ready)
        with open(self.dir / "hold.py") as code:
            proc = self.user.popen(argv, env=env, stdin=code, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(ready.exists, f"holder {self.n} mapped nvidia{gpu}")
        return proc.pid

    def epilog(self, job: str, gpus: str = "0", **extra: str) -> subprocess.CompletedProcess:
        env = {"GPU_PIVOT_SLURM_CONF": str(self.conf), "SLURM_JOB_ID": job, "SLURM_JOB_UID": str(self.user.uid),
               "SLURM_JOB_GPUS": gpus, **extra}
        return subprocess.run([str(EPILOG)], env=env, capture_output=True, text=True, timeout=30)

    def prolog(self, job: str, uid: int, gpus: str = "0") -> subprocess.CompletedProcess:
        env = {"GPU_PIVOT_SLURM_CONF": str(self.conf), "SLURM_JOB_ID": job, "SLURM_JOB_UID": str(uid),
               "SLURM_JOB_GPUS": gpus}
        return subprocess.run([str(PROLOG)], env=env, capture_output=True, text=True, timeout=30)


@pytest.fixture
def node_dir():
    """A 0755 dir in /tmp (pytest's tmp_path sits in root's 0700 dir: the job's user cannot reach it)."""
    path = Path(tempfile.mkdtemp(prefix="gp-slurmreg-", dir="/tmp"))
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path)


class Cgroups:
    """Cgroup directories a test makes (or has its user make), removed deepest first at the
    end, once the test has ended the processes in them. One that was there before is kept."""

    def __init__(self):
        self.made: list = []

    def make(self, root: Path, rel: str, owner=None) -> Path:
        """root/rel, each missing folder made; `owner` (a user) gets the last one, as
        systemd's Delegate= gives a user its service's cgroup."""
        path = root
        for part in rel.strip("/").split("/"):
            path = path / part
            if not path.exists():
                path.mkdir()
                self.made.append(path)
        if owner is not None:
            for f in (path, path / "cgroup.procs", *[p for p in [path / "tasks"] if p.exists()]):
                os.chown(f, owner.uid, owner.gid)
        return path

    def track(self, path: Path) -> Path:
        self.made.append(path)
        return path

    def remove(self) -> None:
        for group in sorted(self.made, key=lambda g: -len(g.parts)):
            if group.exists():
                wait_for(lambda g=group: not (g / "cgroup.procs").read_text().strip(), f"{group} empty")
                group.rmdir()


def put(group: Path, pid: int) -> None:
    (group / "cgroup.procs").write_text(str(pid))


@pytest.fixture
def cgroups():
    if not (FREEZER / "tasks").exists():
        pytest.skip("needs the cgroup v1 freezer hierarchy to make a job's cgroup")
    made = Cgroups()
    yield made
    made.remove()


@pytest.fixture
def job_cgroups(cgroups):
    """make(job, pid, uid): put pid in job <job>'s cgroup as Slurm's proctrack/cgroup v1 makes
    it, /slurm_<node>/uid_<uid>/job_<job>/step_0 (root's, 0755), in the freezer hierarchy
    (or `hierarchy`); `path_uid` names another uid in the path than the process's."""
    node = f"slurm_gptest-{secrets.token_hex(4)}"

    def make(job: str, pid: int, uid: int, hierarchy: Path = FREEZER, path_uid: int | None = None) -> Path:
        step = cgroups.make(hierarchy, f"{node}/uid_{uid if path_uid is None else path_uid}/job_{job}/step_0")
        put(step, pid)
        return step

    return make


def _end(user, *pids: int) -> None:
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)
    for proc in user.procs:
        proc.wait(10)


def test_the_epilog_leaves_the_same_users_running_job_on_a_shared_gpu_alone(second_user, node_dir, job_cgroups):
    """Job 12 ended; job 13 of the same user runs on the same GPU (gres/shard)."""
    node = Node(node_dir, second_user)
    pids: list = []
    try:
        running = node.hold(0)
        pids.append(running)
        job_cgroups("13", running, second_user.uid)
        alone = node.epilog("12")  # nothing of job 12 left: job 13's process is no blocker either
        assert alone.returncode == 0 and "GPUs [0] free" in alone.stdout, alone.stderr
        assert alive(running), "the epilog of job 12 killed job 13's process"

        leftover = node.hold(0)
        pids.append(leftover)
        job_cgroups("12", leftover, second_user.uid)
        escaped = node.hold(0)  # double-forked out of every job cgroup (proctrack/linuxproc): still job 12's user's
        pids.append(escaped)
        done = node.epilog("12")
        assert done.returncode == 0, done.stderr
        assert "gpu-pivot epilog job 12: GPUs [0] free" in done.stdout
        wait_for(lambda: not alive(leftover) and not alive(escaped), "job 12's leftovers ended")
        assert alive(running), "the epilog of job 12 killed job 13's process"
    finally:
        _end(second_user, *pids)


@pytest.mark.parametrize("dodge", sorted(DODGES))
def test_no_name_spares_a_leftover_of_the_jobs_user(second_user, node_dir, dodge):
    """No name, pattern or argv shape spares a process of the job's
    user holding the job's GPU (the last two need the agent's own check: rules.trusted_names)."""
    node = Node(node_dir, second_user, protect="gp-dcgm-monitor")
    dodger = node.hold(0, DODGES[dodge])
    try:
        done = node.epilog("21")
        assert done.returncode == 0, done.stderr
        wait_for(lambda: not alive(dodger), f"pid {dodger} ended")
    finally:
        _end(second_user, dodger)


def test_root_jobs_and_non_ascii_digits_are_refused_with_one_line(tmp_path):
    """'²'.isdigit() is True and int('²') raises; uid 0 is the node's, not a job's."""
    conf = tmp_path / "conf.env"
    conf.write_text(f"DEVICES={tmp_path}/nvidia*\nFAKE_DEVICES=yes\nRUN_DIR={tmp_path / 'run'}\n")
    base = {"GPU_PIVOT_SLURM_CONF": str(conf), "SLURM_JOB_ID": "7", "SLURM_JOB_UID": "4000000", "SLURM_JOB_GPUS": "0"}
    for key, value in (("SLURM_JOB_UID", "²"), ("SLURM_JOB_ID", "١٢"), ("SLURM_JOB_GPUS", "0,³"),
                       ("SLURM_JOB_UID", "0")):
        done = subprocess.run([str(EPILOG)], env=dict(base, **{key: value}), capture_output=True, text=True,
                              timeout=30)
        assert done.returncode == 2, (key, value, done.stderr)
        assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
        assert f"{key}=" in done.stderr and repr(value) in done.stderr or value in done.stderr, done.stderr


def test_the_wrapper_refuses_a_checkout_another_user_owns(second_user, tmp_path):
    """Seen in code: root ran $root/.venv/bin/python of a checkout any owner could change."""
    co = tmp_path / "co"
    shutil.copytree(REPO / "scripts", co / "scripts", ignore=shutil.ignore_patterns("__pycache__"))
    ran = tmp_path / "ran"
    (co / ".venv" / "bin").mkdir(parents=True)
    fake = co / ".venv" / "bin" / "python"
    fake.write_text(f"#!/bin/sh\ntouch {ran}\n")
    fake.chmod(0o755)
    os.chmod(tmp_path, 0o755)
    env = {"SLURM_JOB_ID": "3", "SLURM_JOB_UID": "4000000", "PATH": "/usr/bin:/bin"}
    wrapper = co / "scripts" / "slurm" / "epilog"

    done = subprocess.run([str(wrapper)], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and ran.exists(), done.stderr  # root's checkout: it runs
    ran.unlink()

    os.chown(fake, second_user.uid, second_user.gid)  # the user could now put anything there
    done = subprocess.run([str(wrapper)], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and not ran.exists(), done.stderr
    assert done.stderr.count("\n") == 1 and f"{fake} is owned by uid {second_user.uid}" in done.stderr, done.stderr

    os.chown(fake, 0, 0)
    os.chown(co, second_user.uid, second_user.gid)  # the checkout's directory: the user may swap its contents
    done = subprocess.run([str(wrapper)], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and not ran.exists() and f"{co} is owned by uid" in done.stderr, done.stderr


def test_a_job_folder_the_user_made_excuses_no_leftover(second_user, node_dir, cgroups, job_cgroups):
    """systemd delegates user@UID.service to its user (name=systemd on v1,
    the cgroup2 tree), so the user can mkdir `job_99` there and move a leftover into it. One
    leftover stays in job 12's own freezer cgroup too (v1: name=systemd then names job 99
    beside it); the other is only in the user's job_99. Before the fix both read as job 99's:
    the prolog of the next job (another user's) and the epilog of job 12 called GPU 0 free."""
    node = Node(node_dir, second_user)
    delegated = cgroups.make(SYSTEMD, f"gptest-user@{second_user.uid}-{secrets.token_hex(3)}.service",
                             owner=second_user)
    forged = cgroups.track(delegated / "job_99")
    pids: list = []
    try:
        both, only = node.hold(0), node.hold(0)
        pids += [both, only]
        job_cgroups("12", both, second_user.uid)
        moved = second_user.run(["sh", "-c", f"mkdir {forged} && echo {both} > {forged}/cgroup.procs && "
                                             f"echo {only} > {forged}/cgroup.procs"])
        assert moved.returncode == 0, moved.stderr  # unprivileged, as on a real node
        assert "job_99" in Path(f"/proc/{only}/cgroup").read_text()

        pro = node.prolog("14", 4242)
        assert pro.returncode == 1, pro.stdout + pro.stderr
        assert f"pid {both} " in pro.stderr or f"pid {only} " in pro.stderr, pro.stderr
        assert alive(both) and alive(only), "the prolog signalled something"

        done = node.epilog("12")
        assert done.returncode == 0 and "GPUs [0] free" in done.stdout, done.stderr
        wait_for(lambda: not alive(both) and not alive(only), "both leftovers ended by job 12's epilog")
    finally:
        _end(second_user, *pids)


def test_only_a_root_owned_slurm_cgroup_of_the_same_uid_and_one_job_excuses(second_user, node_dir, cgroups,
                                                                            job_cgroups):
    """A holder is another job's only when its cgroup is
    in Slurm's layout, root's all the way down to job_<N>, names the holder's own uid (v1),
    and no hierarchy names a different job. Each leftover below breaks one of these and is
    killed by job 12's epilog; the genuine job 13 processes (v1 and cgroup2) are left alone."""
    node = Node(node_dir, second_user)
    uid = second_user.uid
    tag = secrets.token_hex(3)
    pids: list = []
    try:
        genuine, other_uid, two_jobs, user_made = (node.hold(0) for _ in range(4))
        pids += [genuine, other_uid, two_jobs, user_made]
        job_cgroups("13", genuine, uid)
        job_cgroups("13", other_uid, uid, path_uid=4242)  # root made it, but for another uid
        job_cgroups("13", two_jobs, uid)
        job_cgroups("14", two_jobs, uid, hierarchy=Path("/sys/fs/cgroup/pids"))  # pids says another job
        # a Slurm-looking tree whose uid_ folder the user may write: the user makes job_13 itself
        mine = cgroups.make(FREEZER, f"slurm_gptest-{tag}/uid_{uid}", owner=second_user)
        step = cgroups.track(cgroups.track(mine / "job_13") / "step_0")
        moved = second_user.run(["sh", "-c", f"mkdir -p {step} && echo {user_made} > {step}/cgroup.procs"])
        assert moved.returncode == 0, moved.stderr
        killed = [other_uid, two_jobs, user_made]

        unified = slurm_cgroup.mounts().get(slurm_cgroup.UNIFIED)
        if unified:  # cgroup2: the genuine layout, and the same with a job folder others may write to
            v2_genuine, v2_open = node.hold(0), node.hold(0)
            pids += [v2_genuine, v2_open]
            scope = f"system.slice/gptest-{tag}_slurmstepd.scope"
            put(cgroups.make(Path(unified), f"{scope}/job_13/step_0/user/task_0"), v2_genuine)
            put(cgroups.make(Path(unified), f"{scope}/job_15/step_0/user/task_0"), v2_open)
            os.chmod(Path(unified) / scope / "job_15", 0o777)
            killed.append(v2_open)

        done = node.epilog("12")
        assert done.returncode == 0 and "GPUs [0] free" in done.stdout, done.stderr
        wait_for(lambda: not any(alive(p) for p in killed), "every leftover not truly in job 13 ended")
        assert alive(genuine), "the epilog of job 12 killed job 13's process"
        if unified:
            assert alive(v2_genuine), "the epilog of job 12 killed job 13's process (cgroup2)"
    finally:
        _end(second_user, *pids)


def test_job_in_reads_only_slurms_layouts():
    """The rule on recorded /proc/PID/cgroup lines (v1, v2, multiple-slurmd names, and
    the forgeries): no processes, so every layout is covered whatever this host mounts."""
    mounts = {"freezer": "/cg/freezer", "cpu": "/cg/cpu,cpuacct", "cpuacct": "/cg/cpu,cpuacct",
              "name=systemd": "/cg/systemd", slurm_cgroup.UNIFIED: "/cg/unified"}
    seen: list = []

    def root_only(path: str) -> bool:
        seen.append(path)
        return "open" not in path

    def job(text: str, uids=(1001,) * 4) -> str | None:
        return slurm_cgroup.job_in(text, list(uids), mounts, root_only)

    v1 = "6:freezer:/slurm/uid_1001/job_12/step_0\n2:cpu,cpuacct:/slurm/uid_1001/job_12/step_0/task_0\n"
    assert job(v1 + "1:name=systemd:/system.slice/slurmd.service\n0::/\n") == "12"
    assert "/cg/freezer/slurm/uid_1001/job_12" in seen and "/cg/freezer/slurm" in seen
    assert not any(p.endswith("step_0") for p in seen), "the step folder is the user's: not to be checked"
    assert job("6:freezer:/slurm_node7/uid_1001/job_12/step_batch\n") == "12"
    assert job("0::/system.slice/slurmstepd.scope/job_12/step_batch/user/task_0\n") == "12"
    assert job("0::/system.slice/gpu-7_slurmstepd.scope/job_12/step_0/user/task_0\n") == "12"
    assert job("0::/\n6:freezer:/\n") is None  # proctrack/linuxproc: in no job
    for forged in ("1:name=systemd:/user.slice/user-1001.slice/user@1001.service/job_99\n",
                   "0::/user.slice/user-1001.slice/user@1001.service/job_99\n",
                   "6:freezer:/x/slurm/uid_1001/job_12/step_0\n",  # not at the hierarchy's root
                   "1:name=systemd:/slurm/uid_1001/job_12/step_0\n",  # a named hierarchy: not Slurm's
                   "0::/system.slice/slurmstepd.scope/x/job_12\n",
                   "6:freezer:/slurm/uid_1001/job_12/step_0\n7:pids:/slurm/uid_1001/job_12\n",  # pids: not mounted
                   "6:freezer:/slurm_open/uid_1001/job_12/step_0\n"):  # a folder others may write to
        assert job(forged) is None, forged
        assert job(v1 + forged) is None, forged  # beside the genuine job: still nobody's
    assert job(v1.replace("job_12/step_0/task_0", "job_13/step_0/task_0")) is None  # two jobs
    assert job(v1, uids=(1001, 0, 1001, 1001)) is None  # another uid than the path's
    assert job(v1, uids=()) is None  # uids unreadable
