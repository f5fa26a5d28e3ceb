"""The sandbox: fake GPU device files on this machine and processes that hold them, started and stopped.

Why: a fresh machine has no GPU host, and the main job (`make demo`) must still show a
real teardown against real processes: a server tree (`python3 -m sglang.launch_server`
with workers titled `sglang::scheduler_TP<i>`), a process playing `nvidia-persistenced`,
a GPU monitor (`nvitop`) and an unrelated job. It is labelled SANDBOX everywhere it shows.
Nothing here touches /dev: the device files are plain files in the sandbox directory.

The host the tasks reach it as, and its directory, are configuration (scripts/config/sandbox.py).

The whole account: docs/design-notes.md (scripts/ops/sandbox.py)."""
from __future__ import annotations

import os
import shlex
import signal
import sys
import time
from pathlib import Path

from ..agent.procs import procfs
from ..config.sandbox import (
    GPUS,
    HIDDEN_STATES,
    LEFT_BY_LAST_JOB,
    PORTS_FILE,
    ROLES,
    StateDirError,
    checked_dir,
    existing_dir,
    ports,
    private,
    sandbox_dir,
    sandbox_host,
    server_argv,
)
from . import sandbox_shm
from .sandbox_fs import read_json, subdir, touch, write, write_json, write_script
from .sandbox_procs import SandboxStartError, free_port, member_env, members, start_detached

TORCHRUN = """#!/bin/sh
# SANDBOX stand-in for torchrun: the training job runs with argv[0] `torchrun`, like the real one.
# A regular file made fresh by `invoke sandbox up` (never a link to python).
exec {py} -c 'import os, sys; os.execv(sys.argv[1], ["torchrun"] + sys.argv[2:])' {py} "$@"
"""


GOOD_PATCH = """--- a/server_config.json
+++ b/server_config.json
@@ -1 +1 @@
-{"healthy": true}
+{"healthy": true, "dynamic_spec": true}
"""
BROKEN_PATCH = """--- a/server_config.json
+++ b/server_config.json
@@ -1 +1 @@
-{"healthy": true}
+{"healthy": false}
"""


def make_files(base: Path) -> None:
    """The sandbox's model dir, server code, patches and 'extracted hidden states'."""
    write(subdir(base, "fake-model") / "config.json", '{"architectures": ["DeepseekV3ForCausalLM"]}\n')
    write(subdir(base, "fake-eagle3-draft") / "config.json", '{"architectures": ["LlamaForCausalLMEagle3"]}\n')
    write(subdir(base, "server-code") / "server_config.json", '{"healthy": true}\n')
    patches = subdir(base, "patches")
    write(patches / "dynamic-spec.patch", GOOD_PATCH)
    write(patches / "broken.patch", BROKEN_PATCH)
    hs = subdir(base, "hidden_states")
    for i in range(HIDDEN_STATES):
        write(hs / f"sample_{i:05d}.pt", b"SANDBOX")
    write(hs / "data_config.json", '{"samples": %d, "errors": 0}\n' % HIDDEN_STATES)
    subdir(base, "run")


def make_devices(devdir: Path, gpus: int = GPUS) -> list:
    """Plain files named like NVIDIA's device nodes (a link planted at one is refused)."""
    devdir.mkdir(parents=True, exist_ok=True)
    names = [f"nvidia{i}" for i in range(gpus)] + ["nvidiactl", "nvidia-uvm"]
    for name in names:
        touch(devdir / name)
    return [devdir / n for n in names]


def _server_shim(pkgdir: Path) -> None:
    """pkg/sglang/launch_server.py, so the server's cmdline really says sglang.launch_server."""
    mod = subdir(private(pkgdir, parents=True), "sglang")
    write(mod / "__init__.py", "")
    write(mod / "launch_server.py",
          "# SANDBOX stand-in for sglang.launch_server\nimport runpy, sys\n"
          f"sys.argv = [{str(ROLES)!r}, 'server'] + sys.argv[1:]\n"
          f"runpy.run_path({str(ROLES)!r}, run_name='__main__')\n")


def start_processes(base: Path, ignore_term: bool = False) -> dict:
    """Start the sandbox's process set under `base` (a checked private dir); returns {role: pid}.
    Daemons run as sys.executable with argv[0] = their name: nothing in `base` is executed
    but the torchrun launcher, a regular file made fresh here."""
    devdir = subdir(base, "dev")
    make_devices(devdir)
    bindir, pkgdir, readydir, memdir = (subdir(base, d) for d in ("bin", "pkg", "ready", "gpumem"))
    for old in readydir.glob("*"):
        old.unlink()
    _server_shim(pkgdir)
    make_files(base)
    write_script(bindir / "torchrun", TORCHRUN.format(py=shlex.quote(sys.executable)))  # the train phase's job
    env = member_env(base, dict(os.environ, PYTHONPATH=str(pkgdir)))
    plain = member_env(base)
    logs = subdir(base, "logs")
    py = sys.executable
    common = ["--devdir", str(devdir)]
    server_port = ports(base)[0]
    # the EAGLE3 server being debugged (the EAGLE3 data-generation pivot), with 3 requests still in flight
    server = server_argv(base, server_port, "--inflight", "3", "--speculative-algorithm", "EAGLE3",
                         "--speculative-draft-model-path", str(base / "fake-eagle3-draft"))
    if ignore_term:
        server.append("--ignore-term")
    write_json(base / "gpu-settings.json", {str(i): LEFT_BY_LAST_JOB for i in range(GPUS)})  # the last job's drift
    staged = sandbox_shm.stage_weights(base)  # weights staged before the server: the teardown keeps them
    if staged:
        server += ["--staged", staged, "--shm-tag", sandbox_shm.tag(base)]
    pids = {}
    for role, argv, exe, role_env in (
            ("server", server, None, env),
            ("persistenced", ["nvidia-persistenced", str(ROLES), "hold", *common], py, plain),
            ("monitor", ["nvitop", str(ROLES), "hold", *common], py, plain),
            ("bystander", [py, str(ROLES), "idle", "--job", "prepare_dataset", *common], None, plain)):
        pids[role] = start_detached(argv, readydir / role, role_env, executable=exe, log=logs / f"{role}.log")
    workers = (readydir / "server").read_text().split()
    for i, pid in enumerate(workers):
        pids[f"worker{i}"] = int(pid)
    return pids


def up(ignore_term: bool = False) -> dict:
    """Start the sandbox (or leave it, when all of it runs). Raises SandboxDirError (one
    line naming the directory) before anything runs when the directory is not ours."""
    base = checked_dir()
    state = status()
    if state["alive"] and len(state["alive"]) == len(state["processes"]):
        return state  # already up
    down()  # partly torn down (e.g. after a demo teardown): start the whole set afresh
    write_json(base / PORTS_FILE, {"server": free_port(), "datagen": free_port()})
    try:
        pids = start_processes(base, ignore_term)
    except SandboxStartError:
        down()  # the roles that did start: none is left running
        raise
    record = {role: {"pid": pid, "start_time": procfs.start_time(pid)} for role, pid in pids.items()}
    write_json(base / "state.json", record)
    return status()


def status() -> dict:
    """Each sandbox process and whether it still runs (pid + start time, never pid alone),
    read from the checked directory only."""
    base = existing_dir()
    record = (read_json(base / "state.json") if base is not None else None) or {}
    procs = {role: dict(info, alive=procfs.same_process(info["pid"], info["start_time"]))
             for role, info in record.items()}
    where = sandbox_dir()
    server_port, datagen_port = ports(base)
    recorded = {(p["pid"], p["start_time"]) for p in procs.values()}
    return {"dir": str(where), "devices": f"{where}/dev/nvidia*", "processes": procs,
            "ports": {"server": server_port, "datagen": datagen_port},
            "alive": [r for r, p in procs.items() if p["alive"]],
            # processes of this sandbox its state does not list (its directory was removed by hand)
            "unrecorded": [pid for pid, start in members(where) if (pid, start) not in recorded]}


def down() -> dict:
    """Stop what the sandbox started, by recorded pid + start time, and nothing else:
    its processes, and the phases pivots started on it (each phase's own session)."""
    from . import phase as phase_ops

    base = existing_dir()
    state = status()
    state["stopped_unrecorded"] = _stop_members(sandbox_dir())
    if base is None:
        return state
    host = sandbox_host()
    for name, phase in host.phases.items():
        if (base / "run" / f"phase-{name}.json").exists():
            phase_ops.stop(host, phase, "sandbox down")
    recorded = list(state["processes"].values())
    for info in recorded:
        if info["alive"]:
            procfs.signal_if_same(info["pid"], info["start_time"], signal.SIGKILL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(procfs.same_process(i["pid"], i["start_time"]) for i in recorded):
        time.sleep(0.02)
    try:
        (base / "state.json").unlink()  # unlink never follows a link
    except FileNotFoundError:
        pass
    state["shm_removed"] = sandbox_shm.remove_ours(base)
    return state


def _stop_members(base: Path) -> list:
    """SIGKILL the processes that carry this sandbox's identity (sandbox_procs.members):
    the ones a state.json no longer lists, e.g. after the directory was removed by hand."""
    found = members(base)
    for pid, start in found:
        procfs.signal_if_same(pid, start, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(procfs.same_process(pid, start) for pid, start in found):
        time.sleep(0.02)
    return [pid for pid, _start in found]


DEMO_TREE = ("server", "worker0", "worker1")
DEMO_KEPT = ("persistenced", "monitor", "bystander")


DEMO_NAMES = {"persistenced": "nvidia-persistenced", "monitor": "the nvitop monitor", "bystander": "the unrelated job",
              "server": "the server", "worker0": "worker 0", "worker1": "worker 1"}
STOP_LINE = "Stop them with: invoke sandbox down   (in the venv: . .venv/bin/activate, as README.md says)"


def demo_check() -> int:
    """`make demo`'s last lines, checked rather than printed: 0 when the server tree is gone
    and nvidia-persistenced, the monitor and the unrelated job still run, else 1. Either way
    it ends by naming what still runs and the one command that stops it: the demo leaves the
    sandbox up, for `invoke status` to show (README, "First commands")."""
    procs = status()["processes"]
    alive = {r: procs.get(r, {}).get("alive", False) for r in DEMO_TREE + DEMO_KEPT}
    left = [r for r in DEMO_TREE if alive[r]]
    lost = [r for r in DEMO_KEPT if not alive[r]]
    ok = not left and not lost and bool(procs)
    if ok:
        print("SANDBOX demo done: the server tree is gone; nvidia-persistenced, the nvitop monitor and the "
              "unrelated job are alive.")
    else:
        print(f"SANDBOX demo FAILED: still running {left or 'none'}; killed by mistake {lost or 'none'}",
              file=sys.stderr)
    running = [f"{DEMO_NAMES.get(r, r)} (pid {procs[r]['pid']})" for r in sorted(procs) if procs[r]["alive"]]
    if running:
        print(f"Still running (the SANDBOX, left up to look at: invoke status): {', '.join(running)}.")
        print(STOP_LINE)
    return 0 if ok else 1


if __name__ == "__main__":
    if sys.argv[1:] != ["check"]:
        sys.exit("usage: python -m scripts.ops.sandbox check")
    from ..config.errors import ConfigError

    try:
        sys.exit(demo_check())
    except (ConfigError, StateDirError) as exc:  # a bad or refused sandbox dir: one line, as the tasks say it
        print(f"gpu-pivot: {exc}", file=sys.stderr)
        sys.exit(2 if isinstance(exc, ConfigError) else 3)
