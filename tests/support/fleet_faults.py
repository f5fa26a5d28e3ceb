"""Faults a fleet meets, made real on loopback: a TCP tarpit and an sshd stopped mid-call.

Used by tests/cli/test_console_robustness.py and runnable on its own for the closing note:

    .venv/bin/python -m tests.support.fleet_faults      # prints the 8-host run: wall time, each host's line

What it builds: 6 healthy hosts (aliases of one loopback sshd, each with its own agent state
directory), gpu7 = a tarpit (a socket on 127.0.0.1 that accepts and never speaks) and gpu8 =
its own loopback sshd that is stopped (SIGSTOP, the listener and its session processes) once
the command has started there. Only processes this module started are stopped or ended.
"""
from __future__ import annotations

import os
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path

from scripts.config.hostconfig import build_host
from tests.support.loopback_sshd import LoopbackSshd
from tests.support.paths import REPO
from tests.support.procs import wait_for


class Tarpit:
    """A socket on 127.0.0.1 that completes TCP handshakes (the kernel does, from the
    listen backlog) and never sends a byte: ssh waits for a banner that never comes."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]

    def close(self) -> None:
        self.sock.close()


def descendants(pid: int) -> list:
    """pid's descendants (children first found through /proc/PID/task/*/children)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tasks:
            try:
                kids = [int(k) for k in Path(f"/proc/{p}/task/{t}/children").read_text().split()]
            except OSError:
                continue
            out.extend(kids)
            todo.extend(kids)
    return out


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def sshd_processes(server: LoopbackSshd) -> list:
    """The server's listener and its per-connection sshd processes (never the session's command)."""
    assert server.proc is not None
    return [server.proc.pid] + [p for p in descendants(server.proc.pid) if comm(p).startswith("sshd")]


def stop_sshd(server: LoopbackSshd) -> list:
    stopped = sshd_processes(server)
    for pid in stopped:
        os.kill(pid, signal.SIGSTOP)
    return stopped


def end_sshd(server: LoopbackSshd) -> None:
    """Resume, then end every process under this server (we started them all), then the server."""
    assert server.proc is not None
    everything = descendants(server.proc.pid)
    for pid in [server.proc.pid, *everything]:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
    for pid in everything:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    server.stop()


def wait_session(server: LoopbackSshd, before: int, timeout: float = 20.0) -> None:
    """Until the server logged one more session start than `before`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.log.exists() and server.log.read_text().count("Starting session") > before:
            return
        time.sleep(0.02)
    raise RuntimeError("no ssh session started on the server to stop")


def proof_arrived(invoke_pid: int, port: int) -> bool:
    """Has the ssh client (under invoke_pid) to 127.0.0.1:port received the line that proves
    its command started on the host (route.marked)? Read from the client's stderr file."""
    for pid in descendants(invoke_pid):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if comm(pid) != "ssh" or str(port).encode() not in argv:
                continue
            if b"=====gpu-pivot-ran" in Path(f"/proc/{pid}/fd/2").read_bytes():
                return True
        except OSError:
            continue
    return False


def python_with_run_dir(where: Path, run_dir: Path) -> Path:
    """An interpreter for ALIAS_PYTHON that gives the agent its own state dir (lock, last.json):
    every fleet host its own, as separate machines would have (one shared lock once made two
    aliases of this machine wait on each other)."""
    where.mkdir(parents=True, exist_ok=True)
    path = where / "python3"
    path.write_text(f"#!/bin/sh\nGPU_PIVOT_RUN_DIR={run_dir} exec python3 \"$@\"\n")
    path.chmod(0o755)
    return path


def hosts_env_text(good: LoopbackSshd, frozen: LoopbackSshd, tarpit: Tarpit, base: Path, healthy: int = 6) -> str:
    text = ""
    for i in range(1, healthy + 1):
        py = python_with_run_dir(base / f"py{i}", base / f"run{i}")
        text += good.hosts_env(f"gpu{i}", extra={"PYTHON": str(py)})
    n = healthy + 1
    text += (f"GPU{n}_SSH={good.dest()}\nGPU{n}_SSH_OPTS='-p {tarpit.port} -o UserKnownHostsFile={good.known_hosts} "
             "-o StrictHostKeyChecking=yes'\n")
    text += frozen.hosts_env(f"gpu{n + 1}", extra={"PYTHON": str(python_with_run_dir(base / "py8", base / "run8"))})
    return text


def fleet_run(good: LoopbackSshd, base: Path, timeout_s: float = 6.0) -> dict:
    """`invoke run --host gpu[1-8] --timeout T -- sh -c 'sleep 1; echo done-on-$0'` with gpu8's
    sshd stopped once its session has started; returns rc, wall, output and each host's line."""
    import subprocess

    frozen = LoopbackSshd(base / "frozen", keys_from=good).start()
    tarpit = Tarpit()
    try:
        env_file = base / "hosts.env"
        env_file.write_text(hosts_env_text(good, frozen, tarpit, base))
        env = dict(os.environ, GPU_PIVOT_HOSTS_FILE=str(env_file))
        before = frozen.log.read_text().count("Starting session") if frozen.log.exists() else 0
        started = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-m", "invoke", "run", "--host", "gpu[1-8]", "--timeout",
                                 str(timeout_s), "--", "sh", "-c", "sleep 1; echo done"],
                                cwd=REPO, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        wait_session(frozen, before)
        wait_for(lambda: proof_arrived(proc.pid, frozen.port), "gpu8's command to start", timeout=20)
        stopped = stop_sshd(frozen)  # mid-call: its command runs (`sleep 1`), its output not yet sent
        out, err = proc.communicate(timeout=timeout_s + 60)
        wall = time.monotonic() - started
    finally:
        end_sshd(frozen)
        tarpit.close()
    text = out.decode() + err.decode()
    finished = [f"gpu{i}" for i in range(1, 9) if f"===== gpu{i} =====\ndone" in out.decode()]
    return {"rc": proc.returncode, "wall_s": round(wall, 2), "finished": finished, "stopped_pids": stopped,
            "text": text, "timeout_s": timeout_s}


def main() -> int:
    base = Path(tempfile.mkdtemp(prefix="gp-fleet-faults-"))
    os.environ.setdefault("GPU_PIVOT_CONTROL_DIR", str(base / "cm"))
    good = LoopbackSshd(base / "good", env={"GPU_PIVOT_RUN_DIR": str(base / "remote-run")}).start()
    try:
        r = fleet_run(good, base)
    finally:
        good.stop()
    print(f"invoke run --host gpu[1-8] --timeout {r['timeout_s']:g} -- sh -c 'sleep 1; echo done'")
    print("  gpu7 = TCP tarpit on 127.0.0.1 (accepts, never speaks); gpu8 = loopback sshd SIGSTOPped mid-call")
    print(f"  exit {r['rc']}, wall {r['wall_s']}s, finished: {', '.join(r['finished'])} ({len(r['finished'])}/8)")
    for line in r["text"].splitlines():
        if line.startswith("gpu-pivot:"):
            print("  " + line)
    return 0 if len(r["finished"]) == 6 else 1


def gpu_host(server, alias="gpu1", opts="", **extra):
    """A host reached over `server` (a loopback sshd) with extra ssh options and hosts.env keys."""
    keys = {"SSH": server.dest(), "SSH_OPTS": f"{server.ssh_opts} {opts}".strip()}
    keys.update(extra)
    return build_host(alias, keys, "test")


def held_devices(ps):
    """A holder of the test's fake GPU, so `verify --wait` keeps the agent busy on the host."""
    ps.role("hold")
    return {"DEVICES": ps.glob, "FAKE_DEVICES": "yes", "PYTHON": str(python_with_run_dir(
        ps.base / "py", ps.base / "run"))}


if __name__ == "__main__":
    sys.exit(main())
