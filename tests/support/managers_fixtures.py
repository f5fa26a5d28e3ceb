"""Real process managers, each started by a test in its own temp dir: supervisord, runit, podman.

Why real: a server under supervisord, runsv or podman comes back after a kill, and what the
teardown must name is the manager's own stop command (supervisorctl, sv, podman stop). A
stand-in would show the process tree, never whether the command stops the program for good.
Each manager's every file is under the test's directory (supervisord's config, socket and
logs; runit's service and scan directories; podman's storage, run root, tmp dir and network
config), nothing is started machine-wide, and each is ended by PID at the end (the manager
first, then what it ran, by the pids seen).

A holder is `sandbox_roles.py worker` (a Python process holding fake GPU device files, as
tests/support/procs.py starts): `holder_argv(ps, ready)` is its command line.
"""
from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from scripts.agent.procs import procfs, textsafe
from scripts.config.sandbox import ROLES
from tests.support.paths import REPO
from tests.support.procs import alive, children, wait_for
from tests.support.realhosts import cgroups
from tests.support.realhosts.docker_host import busybox_tarball

# A container's id and a pod's UID as their cgroup paths name them (systemd escapes a UID's
# dashes to underscores in a slice's name)
CID = "3f" * 32
UID = "1f2e3d4c-5b6a-4798-8a7b-6c5d4e3f2a1b"
ESCAPED = UID.replace("-", "_")

def holder_argv(devdir: Path, ready: Path, gpu: int = 0, python: str = sys.executable) -> list[str]:
    """A process holding GPU `gpu`'s fake device files; `ready` appears once it holds them.
    `python`: the host's /usr/bin/python3 in a container (it has the host's /usr, not the venv)."""
    return [python, str(ROLES), "worker", "--devdir", str(devdir), "--gpu", str(gpu), "--ready", str(ready)]


def end(pids) -> None:
    """SIGKILL each pid still the process it was (start time read now; a zombie is left to its parent)."""
    for pid in pids:
        start = procfs.start_time(pid)
        if start is not None:
            procfs.signal_if_same(pid, start, signal.SIGKILL)


def terminate(proc: subprocess.Popen, timeout: float = 15) -> None:
    """A manager daemon the fixture started, ended: SIGTERM (it stops what it runs), SIGKILL after `timeout`."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        for child in children(todo.pop()):
            out.append(child)
            todo.append(child)
    return out


class Supervisord:
    """A real supervisord (`supervisord -n -c CONF`) with its own config, unix socket, pid file
    and log dir under `base`, running `programs` ({name: argv}) with autorestart=true; in a
    group when `group` is given (its programs are then GROUP:NAME to supervisorctl)."""

    def __init__(self, base: Path, programs: dict, group: str | None = None, launch: tuple = ("supervisord",)):
        self.dir = Path(base) / "supervisor"
        self.dir.mkdir(parents=True)
        self.conf = self.dir / "supervisord.conf"
        self.sock = self.dir / "supervisor.sock"
        sections = [
            f"[unix_http_server]\nfile={self.sock}\nchmod=0700\n",
            f"[supervisord]\nlogfile={self.dir}/supervisord.log\npidfile={self.dir}/supervisord.pid\n"
            f"childlogdir={self.dir}\nnodaemon=true\n",
            "[rpcinterface:supervisor]\n"
            "supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface\n",
            f"[supervisorctl]\nserverurl=unix://{self.sock}\n",
        ]
        for name, argv in programs.items():
            sections.append(f"[program:{name}]\ncommand={shlex.join(argv)}\nautorestart=true\nstartsecs=0\n"
                            "startretries=100\nstopwaitsecs=5\n")
        if group:
            sections.append(f"[group:{group}]\nprograms={','.join(programs)}\n")
        self.conf.write_text("\n".join(sections))
        self.group = group
        self.seen: set = set()
        self.proc = subprocess.Popen([*launch, "-n", "-c", str(self.conf)], start_new_session=True,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.pid = self.proc.pid
        wait_for(lambda: self.sock.exists() and self.ctl("pid").stdout.strip() == str(self.pid), "supervisord up")

    def spec(self, name: str) -> str:
        return f"{self.group}:{name}" if self.group else name

    def ctl(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["supervisorctl", "-c", str(self.conf), *args], capture_output=True, text=True,
                              timeout=30)

    def state(self, name: str) -> str:
        """RUNNING, STOPPED, STARTING, BACKOFF... as `supervisorctl status` says."""
        words = self.ctl("status", self.spec(name)).stdout.split()
        return words[1] if len(words) > 1 else "?"

    def program_pid(self, name: str) -> int:
        """The program's pid once RUNNING (waits for it)."""
        def running():
            out = self.ctl("pid", self.spec(name)).stdout.strip()
            return int(out) if out.isdigit() and out != "0" else None
        pid = wait_for(running, f"supervisord program {name} running")
        self.seen.add(pid)
        return pid

    def down(self) -> None:
        """supervisord ended by its pid (SIGTERM: it stops its programs), then what it ran."""
        self.seen.update(descendants(self.pid))
        terminate(self.proc)
        end(sorted(self.seen))


class ServiceScan:
    """A real service scanner on a scan directory under `base`, each service's directory
    base/<kind>/sv/NAME with a `run` script that execs `argv`, linked into the scan dir as
    /etc/service links /etc/sv: runit (`runsvdir -P` -> `runsv NAME`), s6 (`s6-svscan` ->
    `s6-supervise NAME`) or daemontools (`svscan` -> `supervise NAME`). `service_dir(name)` is
    the path `sv`, `s6-svc` and `svc` take. `cwd`: where the scanner is started (default: its
    scan directory; a boot script starts it from /)."""

    SCANNERS = {"runit": (["runsvdir", "-P"], "runsv"), "s6": (["s6-svscan"], "s6-supervise"),
                "daemontools": (["svscan"], "supervise")}

    def __init__(self, base: Path, services: dict, kind: str = "runit", cwd: str | None = None):
        self.kind = kind
        scanner, self.supervisor = self.SCANNERS[kind]
        self.dir = Path(base) / kind
        self.scan = self.dir / "service"
        self.scan.mkdir(parents=True)
        self.seen: set = set()
        for name, argv in services.items():
            sv = self.dir / "sv" / name
            sv.mkdir(parents=True)
            run = sv / "run"
            run.write_text(f"#!/bin/sh\nexec {shlex.join(argv)}\n")
            run.chmod(0o755)
            (self.scan / name).symlink_to(sv)
        self.proc = subprocess.Popen([*scanner, str(self.scan)], start_new_session=True, cwd=cwd or self.scan,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.pid = self.proc.pid
        self.names = list(services)

    def service_dir(self, name: str) -> Path:
        return self.scan / name

    def _tool(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(list(args), capture_output=True, text=True, timeout=30)

    def status(self, name: str) -> str:
        """'up' or 'down', as the scanner's own status tool says (sv status, s6-svstat, svstat)."""
        d = str(self.service_dir(name))
        if self.kind == "runit":
            word = self._tool("sv", "status", d).stdout.split(":", 1)[0]
            return {"run": "up"}.get(word, word)
        if self.kind == "s6":
            return self._tool("s6-svstat", d).stdout.split(" ", 1)[0]
        return self._tool("svstat", d).stdout.split(": ", 1)[-1].split(" ", 1)[0]

    def supervisor_pid(self, name: str) -> int:
        """The pid of `runsv NAME` / `s6-supervise NAME` / `supervise NAME`."""
        def find():
            for pid in children(self.pid):
                try:
                    argv = procfs.read_bytes(f"/proc/{pid}/cmdline").split(b"\0")[:2]
                except OSError:
                    continue
                if argv == [self.supervisor.encode(), name.encode()]:
                    return pid
            return None
        pid = wait_for(find, f"{self.supervisor} {name}")
        self.seen.add(pid)
        return pid

    runsv_pid = supervisor_pid

    def service_pid(self, name: str) -> int:
        """The pid of what the service's run script exec'd, once it runs (the supervisor's child).

        Not any child: after a service dies its supervisor forks for `./finish` (a child still
        named like the supervisor, gone at once when there is none), and a restart is a fork
        named so until it execs `./run`. Either, taken for the service, is a pid that never holds
        a GPU (s6 under load: the restart test waited 30 s on the finish fork)."""
        supervisor = self.supervisor_pid(name)

        def running():
            for pid in children(supervisor):
                try:
                    argv0 = procfs.read_bytes(f"/proc/{pid}/cmdline").split(b"\0", 1)[0]
                    state = procfs.read_bytes(f"/proc/{pid}/stat").rsplit(b")", 1)[1].split()[0]
                except (OSError, IndexError):
                    continue
                if argv0 and argv0 != self.supervisor.encode() and state != b"Z":
                    return pid
            return None

        pid = wait_for(running, f"{self.kind} service {name} running")
        self.seen.add(pid)
        return pid

    def down(self) -> None:
        """The scanner ended by its pid first (it would start a supervisor again that exits
        before it), then each service taken down and its supervisor told to exit (`sv
        force-shutdown`, `s6-svc -xd`, `svc -dx`), then every pid seen."""
        self.seen.update(descendants(self.pid))
        terminate(self.proc)
        for name in self.names:
            d = str(self.service_dir(name))
            if not (self.service_dir(name) / "supervise").exists():
                continue
            if self.kind == "runit":
                self._tool("sv", "-w", "5", "force-shutdown", d)
            elif self.kind == "s6":
                self._tool("s6-svc", "-xd", d)
            else:
                self._tool("svc", "-dx", d)
        end(sorted(self.seen))


class Runit(ServiceScan):
    def __init__(self, base: Path, services: dict):
        super().__init__(base, services, "runit")


STOP_TIMEOUT_S = 60  # supervisorctl and podman stop wait out the program's own stop timeout (10 s by default)


def run_stop(manager: dict, timeout: float = STOP_TIMEOUT_S, force: bool = False) -> tuple[bool, str]:
    """Run a manager's stop command (its argv, no shell) as the teardown's plan would. Returns
    (ok, what it said: its last line). Only a `stops_by_default` manager unless `force`: a
    Kubernetes pod, a CRI container, Ray or an untrusted daemon is named, never stopped."""
    argv = manager.get("stop_argv")
    if not argv or not (force or manager.get("stops_by_default")):
        raise ValueError("not a stop the teardown runs: %s" % manager.get("stop_command"))
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              timeout=timeout, cwd="/")  # supervisorctl looks for a config in its directory
    except (OSError, subprocess.SubprocessError) as exc:
        return False, "%s: %s" % (argv[0], exc)
    lines = textsafe.decode(done.stdout).strip().splitlines()
    return done.returncode == 0, textsafe.printable(lines[-1] if lines else "exit %d" % done.returncode)


class PodmanError(Exception):
    """podman cannot run a container here: the message is its error."""


class NoRuntime(PodmanError):
    """No OCI runtime runs a container on this host: the message names each one's error."""


def runtime_candidates(cgroup_fs: str | None = None) -> tuple[str, ...]:
    """The runtimes to try, best first for this host's cgroups: crun refuses a cgroup-v1 or
    hybrid host ("cgroups in hybrid mode not supported"), where runc works."""
    if cgroup_fs is None:
        cgroup_fs = subprocess.run(["stat", "-fc", "%T", "/sys/fs/cgroup"], capture_output=True,
                                   text=True).stdout.strip()
    return ("crun", "runc") if cgroup_fs == "cgroup2fs" else ("runc", "crun")


_PICKED: dict[tuple[str, ...], str | NoRuntime] = {}


def pick_runtime(pm: Podman, candidates: tuple[str, ...]) -> str:
    """The first of `candidates` that runs a trivial container here, tried once per test
    process; NoRuntime, with each one's error, when none does."""
    if candidates not in _PICKED:
        errors = []
        for runtime in candidates:
            out = pm.podman("run", "--rm", "--runtime", runtime, *pm.run_options, pm.IMAGE, "/bin/true")
            if out.returncode == 0:
                _PICKED[candidates] = runtime
                break
            said = (out.stderr.strip() or out.stdout.strip() or f"exit {out.returncode}").splitlines()[-1]
            errors.append(f"{runtime}: {said}")
        else:
            _PICKED[candidates] = NoRuntime("no OCI runtime runs a container here (" + "; ".join(errors) + ")")
    picked = _PICKED[candidates]
    if isinstance(picked, NoRuntime):
        raise picked
    return picked


MACHINE_PATHS = ("/var/lib/containers", "/run/containers", "/etc/containers/networks")


class Podman:
    """podman as root with every path of its own under `base` (--root, --runroot, --tmpdir,
    --network-config-dir), the cgroupfs manager with containers under a cgroup named for this
    test process (removed at the end, in every hierarchy), no network, and an image imported
    from a busybox-static tarball (no registry). A container runs the host's Python from the
    host's /usr (read-only), the repository's scripts and the test's directory bind-mounted at
    the same paths, so a holder in it holds the very device files the host's scan sees."""

    IMAGE = "localhost/gpu-pivot-test/busybox:1"

    def __init__(self, base: Path, runtimes: tuple[str, ...] | None = None):
        self.dir = Path(base) / "podman"
        for sub in ("root", "tmp", "net", "tmpdir"):
            (self.dir / sub).mkdir(parents=True)
        self.runroot = Path(tempfile.mkdtemp(prefix="gpp-", dir="/tmp"))  # podman refuses one over 50 characters
        self.globals = ["--root", str(self.dir / "root"), "--runroot", str(self.runroot),
                        "--tmpdir", str(self.dir / "tmp"), "--cgroup-manager", "cgroupfs",
                        "--network-config-dir", str(self.dir / "net"), "--events-backend", "none"]
        self.cgroup_parent = f"/{cgroups.PREFIX}{cgroups.owner_tag()}-podman-{os.getpid()}-{time.monotonic_ns()}"
        # a nofile limit above the host's makes runc refuse to start the container
        self.run_options = ["--network", "none", "--cgroup-parent", self.cgroup_parent,
                            "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=4096:4096"]
        self.names: list = []
        self.seen: set = set()
        # podman (4.3) writes these machine-wide whatever its options say (the image import's blob
        # cache, netavark's run dir): those it made are removed by down()
        self.made = [p for p in MACHINE_PATHS if not os.path.lexists(p)]
        tarball = self.dir / "busybox.tar"
        busybox_tarball(tarball)
        with tarfile.open(tarball, "a") as tar:  # the host's /usr/lib is mounted there: its loader's paths
            for link, target in (("lib", "usr/lib"), ("lib64", "usr/lib64")):
                info = tarfile.TarInfo(link)
                info.type, info.linkname = tarfile.SYMTYPE, target
                tar.addfile(info)
        out = self.podman("import", str(tarball), self.IMAGE)
        if out.returncode != 0:
            raise PodmanError(out.stderr.strip() or out.stdout.strip())
        try:
            self.runtime = pick_runtime(self, runtimes or runtime_candidates())
        except NoRuntime:
            self.down()
            raise

    def podman(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        env = dict(os.environ, TMPDIR=str(self.dir / "tmpdir"))
        return subprocess.run(["podman", *self.globals, *args], capture_output=True, text=True, timeout=timeout,
                              env=env)

    def run(self, name: str, argv: list[str], shared: Path, restart: str = "always") -> str:
        """`podman run -d --restart=RESTART` of `argv` in a container named `name`; its id."""
        mounts = ["-v", "/usr:/usr:ro", "-v", f"{REPO / 'scripts'}:{REPO / 'scripts'}:ro", "-v", f"{shared}:{shared}"]
        out = self.podman("run", "--runtime", self.runtime, "-d", "--name", name, f"--restart={restart}",
                          *self.run_options, *mounts, self.IMAGE, *argv)
        if out.returncode != 0:
            raise PodmanError(out.stderr.strip() or out.stdout.strip())
        self.names.append(name)
        return out.stdout.strip().splitlines()[-1]

    def state(self, name: str) -> str:
        """running, exited, stopped... as `podman inspect` says."""
        return self.podman("inspect", "--format", "{{.State.Status}}", name).stdout.strip()

    def restart_policy(self, name: str) -> str:
        return self.podman("inspect", "--format", "{{.HostConfig.RestartPolicy.Name}}", name).stdout.strip()

    def main_pid(self, name: str) -> int:
        """The container's first process, as seen from here, once it runs."""
        def running():
            out = self.podman("inspect", "--format", "{{.State.Pid}}", name).stdout.strip()
            return int(out) if out.isdigit() and out != "0" and alive(int(out)) else None
        pid = wait_for(running, f"podman container {name} running", timeout=30)
        self.seen.add(pid)
        return pid

    def down(self) -> None:
        """Each container removed (`podman rm -f -t 0`), then any pid seen, then the cgroups
        podman made for them."""
        for name in self.names:
            self.podman("rm", "-f", "-t", "0", name)
        end(sorted(self.seen))
        for mount, _, _ in cgroups.hierarchies():
            d = Path(mount) / self.cgroup_parent.lstrip("/")
            if d.exists():
                cgroups.kill_and_remove([d])
        for mount in (self.runroot, self.dir / "root" / "overlay"):  # overlay mounts podman left, if any
            subprocess.run(["umount", "-R", str(mount)], capture_output=True)
        shutil.rmtree(self.runroot, ignore_errors=True)
        for path in self.made:
            shutil.rmtree(path, ignore_errors=True)


def podman_usable(base: Path) -> tuple[Podman | None, str]:
    """(a Podman, "") or (None, why not: podman's own error). NoRuntime passes through: the
    caller skips, as no container can run on this host."""
    if not shutil.which("podman"):
        return None, "podman is not installed"
    try:
        return Podman(base), ""
    except NoRuntime:
        raise
    except (PodmanError, subprocess.SubprocessError, OSError) as exc:
        return None, str(exc)


class CgroupLayout:
    """A runtime's real cgroup layout made under this test process's own cgroup, in every
    hierarchy (tests/support/realhosts/cgroups.py: locked, named for its owner, swept if it crashes),
    and processes moved into it: what a kubelet with containerd or CRI-O, or a CRI made
    without Kubernetes, leaves in /proc/PID/cgroup, where none of them runs."""

    def __init__(self):
        self.roots = cgroups.make("managers")

    def place(self, pid: int, layout: str) -> None:
        """Move pid into `layout` (`kubepods.slice/.../cri-containerd-ID.scope`) in every hierarchy."""
        for d in self.prepare(layout):
            (d / "cgroup.procs").write_text(str(pid))

    def prepare(self, layout: str) -> list[Path]:
        """Make `layout` in every hierarchy, ready for tasks; its directories (a process in a
        PID namespace of its own moves itself: its cgroup.procs takes that namespace's pids)."""
        dirs = []
        for root in self.roots:
            d = root / layout
            d.mkdir(parents=True, exist_ok=True)
            for part in [*reversed(d.relative_to(root).parents)][1:] + [d.relative_to(root)]:
                for knob in ("cpuset.cpus", "cpuset.mems"):  # v1 cpuset refuses tasks until these are set
                    f = root / part / knob
                    if f.exists() and not f.read_text().strip():
                        f.write_text((f.parent.parent / knob).read_text())
            dirs.append(d)
        return dirs

    def down(self) -> None:
        problems = cgroups.kill_and_remove(self.roots)
        assert not problems, problems


RAYLET = """
import subprocess, sys, time
devdir, n, python = sys.argv[1], int(sys.argv[2]), sys.argv[3]  # argv[0] `raylet`: sys.executable is unknown
worker = ("import sys, time; fs = [open(sys.argv[1] + '/nvidia%s' % sys.argv[2], 'rb')]; "
          "open(sys.argv[3], 'w'); time.sleep(3600)")
procs = {}
while True:  # a raylet starts a worker again when one dies
    for i in range(n):
        if i not in procs or procs[i].poll() is not None:
            procs[i] = subprocess.Popen(['ray::RayWorkerWrapper', '-c', worker, devdir, str(i),
                                         '%s/ray-worker%d.ready' % (devdir, i)], executable=python)
    time.sleep(0.2)
"""


class RayShaped:
    """A Ray-shaped manager: a process whose program is `raylet` (as Ray's own binary is named)
    starting `ray::RayWorkerWrapper` workers, one per GPU, and starting a worker again when it
    dies. Ray itself (a 60 MB wheel with its GCS and dashboard) is not installed for this: what
    the teardown reads is the tree and the names, and what it must do is name `ray stop`
    and signal nothing of Ray's."""

    def __init__(self, ps, workers: int = 2):
        self.devdir = ps.devdir
        self.proc = subprocess.Popen(["bash", "-c", f'exec -a raylet {sys.executable} -c "$0" "$@"', RAYLET,
                                      str(ps.devdir), str(workers), sys.executable], start_new_session=True)
        ps.adopt(self.proc.pid)
        self.pid = self.proc.pid
        self.ps = ps
        self.n = workers

    def worker_pids(self) -> list[int]:
        """The live workers, once each holds its GPU."""
        wait_for(lambda: all((self.devdir / f"ray-worker{i}.ready").exists() for i in range(self.n)), "ray workers")
        pids = children(self.pid)
        for pid in pids:
            self.ps.adopt(pid)
        return pids

