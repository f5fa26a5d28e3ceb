"""Start real process trees that hold fake GPU device files; end them by PID only."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from scripts.agent.procs import procfs
from scripts.config.sandbox import ROLES
from scripts.ops.sandbox import make_devices
from scripts.ops.sandbox_procs import start_detached


class ProcessSet:
    """Processes a test started (and their descendants it learns of); killed by PID at the end."""

    def __init__(self, base: Path):
        self.base = Path(base)
        self.devdir = self.base / "dev"
        make_devices(self.devdir)
        self.memdir = self.base / "gpumem"
        self.memdir.mkdir(exist_ok=True)
        self.pids: list = []
        self.n = 0

    @property
    def glob(self) -> str:
        return f"{self.devdir}/nvidia*"

    def _ready(self) -> Path:
        self.n += 1
        return self.base / f"ready{self.n}"

    def start(self, argv: list, executable: str | None = None, env: dict | None = None) -> int:
        pid = start_detached(list(argv), self._ready(), env=env, executable=executable)
        self.pids.append(pid)
        return pid

    def role(self, role: str, *extra: str, title: str | None = None, executable: str | None = None, **kw) -> int:
        argv = [title or sys.executable, str(ROLES), role, "--devdir", str(self.devdir), *extra]
        return self.start(argv, executable=executable or (sys.executable if title else None), **kw)

    def server(self, *extra: str, tp: int = 2, **kw) -> tuple:
        """A server tree: parent + tp workers. Returns (parent pid, [worker pids])."""
        ready = self.base / f"ready{self.n + 1}"
        pid = self.role("server", "--tp", str(tp), "--memdir", str(self.memdir), *extra, **kw)
        workers = [int(p) for p in ready.read_text().split()]
        self.pids.extend(workers)
        return pid, workers

    def supervised_worker(self, pause: float) -> tuple:
        """`bash supervise.sh`: a worker holding GPU 0, started again `pause` s after each exit
        (a supervisor the plan does not name). Returns (supervisor pid, script path) once the
        first worker runs."""
        sup = self.base / "supervise.sh"
        sup.write_text(f"while :; do {sys.executable} {ROLES} worker --devdir {self.devdir} --gpu 0; "
                       f"sleep {pause}; done\n")
        supervisor = subprocess.Popen(["bash", str(sup)], start_new_session=True)
        self.adopt(supervisor.pid)
        wait_for(lambda: children(supervisor.pid), "first worker")
        return supervisor.pid, sup

    def detached_worker(self, pause: float) -> int:
        """A keepalive that starts a worker holding GPU 0 with `setsid -f` (left to PID 1 at once)
        and starts it again `pause` s after it is gone: related to the worker by nothing (no
        ancestor, session or group of it), so a teardown neither freezes nor stops it, and only
        the settle window sees its restart. Returns its pid once the first worker runs."""
        pidfile = self.base / "worker.pid"
        run = f"{sys.executable} {ROLES} worker --devdir {self.devdir} --gpu 0"
        start = (f"rm -f {pidfile}; setsid -f sh -c 'echo $$ > {pidfile}.new; mv {pidfile}.new {pidfile}; exec {run}'; "
                 f"until [ -s {pidfile} ]; do sleep 0.01; done")
        # the restart comes `pause` s after the keepalive sees the worker gone (polled every 50 ms)
        keepalive = subprocess.Popen(["bash", "-c", f"{start}; while :; do kill -0 $(cat {pidfile}) 2>/dev/null || "
                                      f"{{ sleep {pause}; {start}; }}; sleep 0.05; done"], start_new_session=True)
        self.adopt(keepalive.pid)
        wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), "first worker")
        return keepalive.pid

    def adopt(self, pid: int) -> None:
        self.pids.append(pid)

    def kill_all(self) -> None:
        """End what the test started, by PID + start time: the pids it adopted, then any process
        of ours still carrying this set's own temp dir in its command line (a supervisor's
        restart that came after the test last looked: it must not outlive the test)."""
        self._kill(self.pids)
        self._kill(self._left_behind())
        for pid in self.pids:
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass

    def _left_behind(self) -> list:
        # the dir whole (`.../test_x1` must not take `.../test_x10`'s): followed by a / or an argument's end
        tokens = (str(self.base).encode() + b"/", str(self.base).encode() + b"\0")
        out = []
        for name in os.listdir("/proc"):
            if not name.isdigit() or int(name) == os.getpid():
                continue
            try:
                mine = os.stat(f"/proc/{name}").st_uid == os.geteuid()
                if mine and any(t in procfs.read_bytes(f"/proc/{name}/cmdline") for t in tokens):
                    out.append(int(name))
            except OSError:
                continue
        return out

    @staticmethod
    def _kill(pids) -> None:
        for pid in pids:
            start = procfs.start_time(pid)
            if start is not None:
                try:
                    os.kill(pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
                procfs.signal_if_same(pid, start, signal.SIGKILL)


def wait_for(pred, what: str, timeout: float = 30.0):
    """pred()'s first true value, polled until `timeout`. The bound is for a test that would
    otherwise hang, not a speed claim: on a machine loaded on every core a supervisor's restart
    or an interpreter's start takes many times its quiet time, so it is generous."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def state(pid: int) -> str | None:
    stat = procfs.read_stat(pid)
    return stat["state"] if stat else None


def alive(pid: int) -> bool:
    return state(pid) not in (None, "Z", "X")


def children(pid: int) -> list:
    """The direct children of pid (its main thread's), as the kernel lists them."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def process_group(pid: int) -> list:
    """The pids of pid's process group, as /proc lists them now."""
    pgid = os.getpgid(pid)
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.getpgid(int(name)) == pgid:
                    out.append(int(name))
            except OSError:
                pass
    return out


def cmdline(pid: int) -> str:
    """pid's argv joined by spaces ("" once it is gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


class Bystanders:
    """`with Bystanders(n):` n idle `sleep` processes under one shell of their own session, the
    many processes of a busy host (DataLoader workers, Ray, containers), ended on exit by
    their process group, which is theirs alone."""

    def __init__(self, n: int, timeout: float = 300.0):
        self.n, self.timeout = n, timeout
        self.shell: subprocess.Popen | None = None

    def __enter__(self):
        self.shell = subprocess.Popen(["bash", "-c", f"for i in $(seq {self.n}); do sleep 3600 & done; wait"],
                                      start_new_session=True, stdin=subprocess.DEVNULL)
        wait_for(lambda: len(children(self.shell.pid)) >= self.n or self.shell.poll() is not None,
                 f"{self.n} bystanders", self.timeout)
        if len(children(self.shell.pid)) < self.n:
            self.__exit__()
            raise RuntimeError(f"could not start {self.n} processes (pid_max, or a ulimit?)")
        return self

    def __exit__(self, *exc):
        if self.shell is not None and self.shell.poll() is None:
            os.killpg(self.shell.pid, signal.SIGKILL)
            self.shell.wait()


def tmux_pane(ps, tmp_path: Path, shell_cmd: str = "bash --norc --noprofile -i") -> tuple:
    """A person's terminal: a tmux server of the test's own socket with one pane running
    `shell_cmd`; both adopted by `ps` (ended by PID). Returns (socket, tmux server pid, pane
    pid). Skips where tmux is not installed (.ci/packages has it)."""
    import shutil

    import pytest

    if not shutil.which("tmux"):
        pytest.skip("tmux is not installed (apt-get install tmux; .ci/packages has it)")
    sock = tmp_path / "tmux.sock"
    subprocess.run(["tmux", "-S", str(sock), "new-session", "-d", "-x", "200", "-y", "50", shell_cmd], check=True)
    server = int(subprocess.run(["tmux", "-S", str(sock), "display-message", "-p", "#{pid}"],
                                capture_output=True, text=True, check=True).stdout)
    ps.adopt(server)
    pane = int(subprocess.run(["tmux", "-S", str(sock), "list-panes", "-F", "#{pane_pid}"], capture_output=True,
                              text=True, check=True).stdout)
    ps.adopt(pane)
    return sock, server, pane
