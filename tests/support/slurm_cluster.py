"""A real one-node Slurm (munged, slurmctld, slurmd) started by the test, all state in a temp dir.

Why real: what the epilog and prolog must get right is Slurm's: which environment they run
in (SLURM_JOB_GPUS, SLURM_JOB_UID), what a non-zero exit does to the node (DRAIN, "Epilog
error") and to the job (requeued held), and whether the reason they set survives. A stand-in
would agree with our assumptions.
Facts this is built on: the measurements of Slurm on these machines (ENGINES.md in the project notes).

The node's GPUs are character devices made with mknod on /dev/zero's numbers (1:5) in the
temp dir: Slurm's gres needs character devices (a plain file makes slurmd refuse it and no
job gets SLURM_JOB_GPUS), and /dev/zero can be mapped, as a CUDA context maps /dev/nvidia*.
A process outside the test that has /dev/zero open has the same numbers but maps none of
these nodes, so the agent sees it at most as a driver handle (protected, never blocking
FREE), and every teardown here is scoped to the test user's uid besides.

Everything is stopped by the PIDs in its own pid files; nothing is started machine-wide.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from pathlib import Path

from tests.support.loopback_sshd import free_port

DAEMONS = ("munged", "slurmctld", "slurmd")
NODE = "gpnode1"  # a gpu-pivot host alias too (letters and digits): `invoke undrain --host gpnode1`


def available() -> str | None:
    """Why a Slurm cluster cannot be started here, or None."""
    if os.geteuid() != 0:
        return "needs root: slurmd runs jobs as another user and the test creates one"
    for tool in ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "scontrol", "sinfo", "squeue"):
        if not shutil.which(tool) and not os.path.exists(f"/usr/sbin/{tool}"):
            return f"{tool} is not installed (apt-get install slurmd slurmctld slurm-client munge)"
    return None


def _tool(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


class SlurmCluster:
    """Start with .start(prolog, epilog); .stop() ends its daemons by pid file."""

    def __init__(self, gpus: int = 2):
        # 0755: the job's user must reach the conf, the munge socket and the device nodes.
        self.dir = Path(tempfile.mkdtemp(prefix="gp-slurm-", dir="/tmp"))
        os.chmod(self.dir, 0o755)
        self.devdir = self.dir / "dev"
        self.devdir.mkdir(mode=0o755)
        self.gpus = gpus
        self.conf = self.dir / "slurm.conf"
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))
        self.started: list = []

    def device(self, index: int) -> Path:
        return self.devdir / f"nvidia{index}"

    # -- configuration ----------------------------------------------------------------------
    def _write(self, prolog: Path | None, epilog: Path | None) -> None:
        d = self.dir
        for sub in ("state", "spool", "munge"):
            (d / sub).mkdir(mode=0o700, exist_ok=True)
        os.chmod(d / "munge", 0o755)  # clients (the job's user) connect to the socket in it
        for i in range(self.gpus):
            path = self.device(i)
            os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 5))
            os.chmod(path, 0o666)  # like /dev/nvidia*: every user may open it
        mem = 1024
        lines = [
            "ClusterName=gptest",
            f"SlurmctldHost={socket.gethostname()}(127.0.0.1)",  # must be this host's name
            "MailProg=/bin/true",
            f"SlurmctldPort={free_port()}",
            f"SlurmdPort={free_port()}",
            "SlurmUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={d / 'munge' / 'munge.socket'}",
            f"StateSaveLocation={d / 'state'}",
            f"SlurmdSpoolDir={d / 'spool'}",
            f"SlurmctldPidFile={d / 'slurmctld.pid'}",
            f"SlurmdPidFile={d / 'slurmd.pid'}",
            f"SlurmctldLogFile={d / 'slurmctld.log'}",
            f"SlurmdLogFile={d / 'slurmd.log'}",
            "ProctrackType=proctrack/linuxproc",  # the setting where a double-forked orphan outlives its job
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "SelectType=select/cons_tres",
            "SchedulerParameters=batch_sched_delay=0,sched_min_interval=0",
            "ReturnToService=2",
            "GresTypes=gpu",
            "MpiDefault=none",
            f"NodeName={NODE} NodeHostname={socket.gethostname()} NodeAddr=127.0.0.1 CPUs={os.cpu_count() or 1} "
            f"RealMemory={mem} Gres=gpu:{self.gpus} State=UNKNOWN",
            f"PartitionName=test Nodes={NODE} Default=YES MaxTime=INFINITE State=UP",
        ]
        if prolog:
            lines.append(f"Prolog={prolog}")
        if epilog:
            lines.append(f"Epilog={epilog}")
        self.conf.write_text("\n".join(lines) + "\n")
        os.chmod(self.conf, 0o644)
        (d / "gres.conf").write_text(f"NodeName={NODE} Name=gpu File={self.devdir}/nvidia[0-{self.gpus - 1}]\n")

    # -- life -------------------------------------------------------------------------------
    def start(self, prolog: Path | None = None, epilog: Path | None = None) -> SlurmCluster:
        self._write(prolog, epilog)
        d = self.dir
        key = d / "munge" / "munge.key"
        subprocess.run([_tool("mungekey"), "--create", "--keyfile", str(key)], check=True, capture_output=True)
        os.chmod(key, 0o600)
        self._daemon([_tool("munged"), "--key-file", str(key), "--socket", str(d / "munge" / "munge.socket"),
                      "--pid-file", str(d / "munged.pid"), "--log-file", str(d / "munged.log"),
                      "--seed-file", str(d / "munge" / "munge.seed"), "--force"], d / "munged.pid")
        self._daemon([_tool("slurmctld"), "-i", "-f", str(self.conf)], d / "slurmctld.pid")
        self._daemon([_tool("slurmd"), "-N", NODE, "-f", str(self.conf)], d / "slurmd.pid")
        self.wait_state("idle", timeout=20)
        return self

    def _daemon(self, argv: list, pidfile: Path) -> None:
        done = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=30)
        if done.returncode:
            raise RuntimeError(f"{argv[0]} exited {done.returncode}: {done.stderr.strip()} {self.logs()}")
        deadline = time.monotonic() + 10
        while not pidfile.exists() or not pidfile.read_text().strip():
            if time.monotonic() > deadline:
                raise RuntimeError(f"{argv[0]} wrote no pid file: {self.logs()}")
            time.sleep(0.02)
        self.started.append(pidfile)

    def stop(self) -> None:
        for pidfile in reversed(self.started):
            try:
                pid = int(pidfile.read_text().split()[0])
                os.kill(pid, signal.SIGTERM)
            except (OSError, ValueError, IndexError):
                continue
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and _alive(pid):
                time.sleep(0.02)
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        self.started = []

    def remove(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    def logs(self) -> str:
        out = []
        for name in ("slurmctld.log", "slurmd.log", "munged.log"):
            path = self.dir / name
            if path.exists():
                out.append(f"--- {name}\n" + "\n".join(path.read_text(errors="replace").splitlines()[-15:]))
        return "\n".join(out)

    # -- queries ----------------------------------------------------------------------------
    def run(self, *argv: str, check: bool = True) -> str:
        done = subprocess.run(list(argv), env=self.env, capture_output=True, text=True, timeout=30)
        if check and done.returncode:
            raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()}")
        return done.stdout

    def node_state(self) -> str:
        return self.run("sinfo", "-h", "-N", "-n", NODE, "-o", "%T").strip()

    def reason(self) -> str:
        return self.run("sinfo", "-h", "-R", "-n", NODE, "-o", "%E").strip()

    def wait_state(self, want: str, timeout: float = 15.0) -> str:
        deadline = time.monotonic() + timeout
        got = ""
        while time.monotonic() < deadline:
            got = self.node_state()
            if got == want:
                return got
            time.sleep(0.05)
        raise AssertionError(f"node {NODE} is {got!r}, not {want!r}, after {timeout}s\n{self.logs()}")

    def job_field(self, job: str, fmt: str) -> str:
        return self.run("squeue", "-h", "-j", job, "-o", fmt, check=False).strip()

    def wait_job_gone(self, job: str, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.job_field(job, "%i"):
                return
            time.sleep(0.05)
        raise AssertionError(f"job {job} still queued after {timeout}s: {self.job_field(job, '%T %r')}")

    def resume(self) -> None:
        self.run("scontrol", "update", f"nodename={NODE}", "state=resume")
        self.wait_state("idle")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False
