"""The teardown scenario of the tests and benchmarks, built from real processes.

Targets: a server tree (parent + 2 spawned workers + a tokenizer child holding no GPU +
a double-forked helper left in its session), a server that ignores SIGTERM, an
orphan worker whose parent exited, a renamed worker (`VLLM::EngineCore`).
Bystanders: `nvidia-persistenced` and an `nvitop` monitor (both hold the device files)
and an unrelated python job that holds no GPU. Python processes show `python3` as
argv[0], as on the incidents' hosts, so `pkill -f python3` matches them there too.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from scripts.config.sandbox import ROLES
from scripts.ops.sandbox import _server_shim
from tests.support.procs import ProcessSet, wait_for

TARGET_ROLES = ("server", "worker0", "worker1", "tokenizer", "group_helper", "stubborn", "stubborn_worker", "orphan",
                "renamed")
BYSTANDER_ROLES = ("persistenced", "monitor", "unrelated")


def target_pattern(ps: ProcessSet) -> str:
    """The program this scenario's servers run. Patterns name programs, so the test is kept
    to its own processes by the scope (its temp dir in their command line) instead."""
    return r"sglang\.launch_server"


def host_keys(ps: ProcessSet) -> dict:
    """hosts.env keys (without the ALIAS_ prefix) that keep a teardown to this scenario:
    its fake device files, its program, and its temp dir as the scope."""
    return {"DEVICES": ps.glob, "TARGETS": target_pattern(ps), "FAKE_DEVICES": "yes", "SCOPE": str(ps.base)}


def env_lines(ps: ProcessSet, alias: str = "local") -> str:
    return "".join(f"{alias.upper()}_{k}='{v}'\n" for k, v in host_keys(ps).items())


def _server(ps: ProcessSet, *flags: str) -> int:
    """`python3 -m sglang.launch_server --devdir DIR ...` (the sandbox's stand-in module)."""
    pkg = ps.base / "pkg"
    _server_shim(pkg)
    env = dict(os.environ, PYTHONPATH=str(pkg))
    pid = ps.start(["python3", "-m", "sglang.launch_server", "--devdir", str(ps.devdir), *flags],
                   executable=sys.executable, env=env)
    ready = ps.base / f"ready{ps.n}"
    ps.pids.extend(int(p) for p in ready.read_text().split())  # its workers: ended by PID too
    return pid


def start(ps: ProcessSet, stubborn: bool = True) -> dict:
    """Start everything; returns {role: pid}."""
    roles = {}
    server_ready = ps.base / f"ready{ps.n + 1}"
    roles["server"] = _server(ps, "--tp", "2", "--memdir", str(ps.memdir), "--helpers")
    kids = [int(p) for p in server_ready.read_text().split()]
    roles["worker0"], roles["worker1"], roles["tokenizer"] = kids
    roles["group_helper"] = int(wait_for(lambda: _read(Path(str(server_ready) + ".grandchild")), "group helper"))
    ps.pids.extend([*kids, roles["group_helper"]])
    if stubborn:
        ready = ps.base / f"ready{ps.n + 1}"
        roles["stubborn"] = _server(ps, "--tp", "1", "--gpu", "1", "--ignore-term", "--ignore-term-workers",
                                    "--memdir", str(ps.memdir), "--mib", "1024")
        roles["stubborn_worker"] = int(ready.read_text().split()[0])
        ps.pids.append(roles["stubborn_worker"])
    roles["orphan"] = _orphan(ps)
    roles["renamed"] = ps.role("worker", "--gpu", "1", title="VLLM::EngineCore")
    roles["persistenced"] = ps.role("hold", title="nvidia-persistenced")
    roles["monitor"] = ps.role("hold", title="nvitop")
    roles["unrelated"] = ps.role("idle", "--job", "prepare_dataset", title="python3", executable=sys.executable)
    return roles


def _read(path: Path):
    return path.exists() and path.read_text().strip()


def _orphan(ps: ProcessSet) -> int:
    ps.n += 1
    ready, pidfile = ps.base / f"ready{ps.n}", ps.base / f"orphan{ps.n}.pid"
    code = ("import subprocess, sys; p = subprocess.Popen(sys.argv[2:], executable=sys.argv[1], "
            "stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); "
            f"open({str(pidfile)!r}, 'w').write(str(p.pid))")
    parent = subprocess.Popen([sys.executable, "-c", code, sys.executable, "python3", str(ROLES), "worker",
                               "--devdir", str(ps.devdir), "--gpu", "0", "--ready", str(ready)], start_new_session=True)
    parent.wait()
    pid = int(pidfile.read_text())
    ps.pids.append(pid)
    wait_for(ready.exists, "orphan ready")
    return pid
