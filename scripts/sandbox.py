"""The sandbox host: fake GPU device files on this machine and processes that hold them.

Why: a fresh machine has no GPU host, and the main job (`make demo`) must still show a
real teardown against real processes: a server tree (`python3 -m sglang.launch_server`
with workers titled `sglang::scheduler_TP<i>`), a process playing `nvidia-persistenced`,
a GPU monitor (`nvitop`) and an unrelated job. It is labelled SANDBOX everywhere it shows.
Nothing here touches /dev: the device files are plain files in the sandbox directory.
"""
from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from .hostconfig import Host
from .route import Route
from .agent import procfs

ROLES = Path(__file__).resolve().parent / "sandbox_roles.py"
SANDBOX_DIR_ENV = "GPU_PIVOT_SANDBOX_DIR"
GPUS = 2


def sandbox_dir() -> Path:
    return Path(os.environ.get(SANDBOX_DIR_ENV) or f"/tmp/gpu-pivot-sandbox-{os.getuid()}")


SERVER_PORT, DATAGEN_PORT = 30000, 30001
HIDDEN_STATES = 8
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


def server_argv(base: Path, port: int, *extra: str) -> list:
    """`python3 -m sglang.launch_server ...` served by the sandbox stand-in on 127.0.0.1:port."""
    return [sys.executable, "-m", "sglang.launch_server", "--model-path", str(base / "fake-model"), "--tp", str(GPUS),
            "--port", str(port), "--http-port", str(port), "--devdir", str(base / "dev"), "--memdir",
            str(base / "gpumem"), *extra]


def sandbox_phases(base: Path) -> dict:
    """The seeds' three pivots on the sandbox, in the same schema as hosts.env phases."""
    from .phases import build_phase

    env = f"PYTHONPATH={base / 'pkg'}"
    py = shlex.quote(sys.executable)
    keys = {
        "datagen": {  # 000: EAGLE3 debug server -> baseline server + dataset preps in parallel
            "ARGV": json.dumps(server_argv(base, DATAGEN_PORT, "--load-s", "1", "--mib", "30000")),
            "ENV": env, "READY": f"http://127.0.0.1:{DATAGEN_PORT}/health", "READY_TIMEOUT": "60",
            "DRAIN_METRICS": f"http://127.0.0.1:{SERVER_PORT}/metrics", "DRAIN_TIMEOUT": "30",
            "PREP": json.dumps([f"{py} -c 'import time; time.sleep(0.5); print(\"prepared {name}\")'"
                                for name in ("sharegpt", "ultrachat", "code-alpaca")]),
        },
        "train": {  # 001: extraction finished -> training, gated on the extracted files
            "ARGV": json.dumps([str(base / "bin" / "torchrun"), str(ROLES), "job", "--devdir", str(base / "dev"), "--memdir",
                                str(base / "gpumem"), "--mib", "60000", "--gpus", str(GPUS)]),
            "READY": "holding", "READY_TIMEOUT": "30",
            "GATES": json.dumps([{"glob": str(base / "hidden_states" / "*.pt"), "min": HIDDEN_STATES},
                                 f"test -s {shlex.quote(str(base / 'hidden_states' / 'data_config.json'))}"]),
        },
        "deploy": {  # 004: old server -> patched server, rolled back if the new one is unhealthy
            "ARGV": json.dumps(server_argv(base, SERVER_PORT, "--load-s", "1", "--code-dir", str(base / "server-code"))),
            "ENV": env, "DIR": str(base / "server-code"), "PATCH": str(base / "patches" / "dynamic-spec.patch"),
            "READY": f"http://127.0.0.1:{SERVER_PORT}/health", "READY_TIMEOUT": "30",
            "SMOKE_URL": f"http://127.0.0.1:{SERVER_PORT}/generate", "SMOKE_BODY": '{"text": "Hello", "max_new_tokens": 8}',
        },
    }
    return {name: build_phase("sandbox", name, k) for name, k in keys.items()}


def sandbox_host() -> Host:
    base = sandbox_dir()
    return Host("sandbox", Route(()), devices=f"{base}/dev/nvidia*", sandbox=True, fake_gpus=str(base / "gpumem"),
                run_dir=str(base / "run"), phases=sandbox_phases(base))


def make_files(base: Path) -> None:
    """The sandbox's model dir, server code, patches and 'extracted hidden states'."""
    model = base / "fake-model"
    model.mkdir(parents=True, exist_ok=True)
    (model / "config.json").write_text('{"architectures": ["DeepseekV3ForCausalLM"]}\n')
    draft = base / "fake-eagle3-draft"
    draft.mkdir(exist_ok=True)
    (draft / "config.json").write_text('{"architectures": ["LlamaForCausalLMEagle3"]}\n')
    code = base / "server-code"
    code.mkdir(exist_ok=True)
    (code / "server_config.json").write_text('{"healthy": true}\n')
    patches = base / "patches"
    patches.mkdir(exist_ok=True)
    (patches / "dynamic-spec.patch").write_text(GOOD_PATCH)
    (patches / "broken.patch").write_text(BROKEN_PATCH)
    hs = base / "hidden_states"
    hs.mkdir(exist_ok=True)
    for i in range(HIDDEN_STATES):
        (hs / f"sample_{i:05d}.pt").write_bytes(b"SANDBOX")
    (hs / "data_config.json").write_text('{"samples": %d, "errors": 0}\n' % HIDDEN_STATES)
    (base / "run").mkdir(exist_ok=True)


def make_devices(devdir: Path, gpus: int = GPUS) -> list:
    """Plain files named like NVIDIA's device nodes."""
    devdir.mkdir(parents=True, exist_ok=True)
    names = [f"nvidia{i}" for i in range(gpus)] + ["nvidiactl", "nvidia-uvm"]
    for name in names:
        (devdir / name).touch()
    return [devdir / n for n in names]


def _named_python(bindir: Path, name: str) -> str:
    """A symlink to this Python named like a daemon, so its comm/argv[0] read as that name."""
    bindir.mkdir(parents=True, exist_ok=True)
    link = bindir / name
    if not link.exists():
        link.symlink_to(sys.executable)
    return str(link)


def _server_shim(pkgdir: Path) -> None:
    """pkg/sglang/launch_server.py, so the server's cmdline really says sglang.launch_server."""
    mod = pkgdir / "sglang"
    mod.mkdir(parents=True, exist_ok=True)
    (mod / "__init__.py").write_text("")
    (mod / "launch_server.py").write_text(
        "# SANDBOX stand-in for sglang.launch_server\nimport runpy, sys\n"
        f"sys.argv = [{str(ROLES)!r}, 'server'] + sys.argv[1:]\n"
        f"runpy.run_path({str(ROLES)!r}, run_name='__main__')\n")


def start_detached(argv: list, ready: Path | None = None, env: dict | None = None, executable: str | None = None) -> int:
    """Start one detached process (own session, no stdio to us); wait until it holds.
    Used by the sandbox and by the tests' process sets."""
    if ready is not None:
        argv = argv + ["--ready", str(ready)]
    proc = subprocess.Popen(argv, executable=executable, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True, env=env, close_fds=True)
    if ready is not None:
        deadline = time.monotonic() + 10
        while not ready.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()  # never leave a half-started holder behind
                raise RuntimeError(f"sandbox process {argv[:3]} did not start (exit {proc.poll()})")
            time.sleep(0.01)
    return proc.pid


def start_processes(base: Path, ignore_term: bool = False) -> dict:
    """Start the sandbox's process set under `base`; returns {role: pid}."""
    devdir = base / "dev"
    make_devices(devdir)
    bindir, pkgdir, readydir = base / "bin", base / "pkg", base / "ready"
    readydir.mkdir(parents=True, exist_ok=True)
    for old in readydir.glob("*"):
        old.unlink()
    _server_shim(pkgdir)
    make_files(base)
    _named_python(bindir, "torchrun")  # the sandbox's training job runs as `torchrun ...`
    env = dict(os.environ, PYTHONPATH=str(pkgdir))
    py = sys.executable
    memdir = base / "gpumem"
    memdir.mkdir(parents=True, exist_ok=True)
    common = ["--devdir", str(devdir)]
    # the EAGLE3 server being debugged (seed 000), with 3 requests still in flight
    server = server_argv(base, SERVER_PORT, "--inflight", "3", "--speculative-algorithm", "EAGLE3",
                         "--speculative-draft-model-path", str(base / "fake-eagle3-draft"))
    if ignore_term:
        server.append("--ignore-term")
    pids = {
        "server": start_detached(server, readydir / "server", env),
        "persistenced": start_detached(["nvidia-persistenced", str(ROLES), "hold", *common], readydir / "persistenced",
                               executable=_named_python(bindir, "nvidia-persistenced")),
        "monitor": start_detached(["nvitop", str(ROLES), "hold", *common], readydir / "monitor",
                          executable=_named_python(bindir, "nvitop")),
        "bystander": start_detached([py, str(ROLES), "idle", "--job", "prepare_dataset"], readydir / "bystander"),
    }
    workers = (readydir / "server").read_text().split()
    for i, pid in enumerate(workers):
        pids[f"worker{i}"] = int(pid)
    return pids


def up(ignore_term: bool = False) -> dict:
    base = sandbox_dir()
    state = status()
    if state["alive"] and len(state["alive"]) == len(state["processes"]):
        return state  # already up
    down()  # partly torn down (e.g. after a demo teardown): start the whole set afresh
    base.mkdir(parents=True, exist_ok=True)
    pids = start_processes(base, ignore_term)
    record = {role: {"pid": pid, "start_time": procfs.start_time(pid)} for role, pid in pids.items()}
    (base / "state.json").write_text(json.dumps(record, indent=1, sort_keys=True))
    return status()


def status() -> dict:
    """Each sandbox process and whether it still runs (pid + start time, never pid alone)."""
    base = sandbox_dir()
    state_file = base / "state.json"
    record = json.loads(state_file.read_text()) if state_file.exists() else {}
    procs = {role: dict(info, alive=procfs.same_process(info["pid"], info["start_time"])) for role, info in record.items()}
    return {"dir": str(base), "devices": f"{base}/dev/nvidia*", "processes": procs,
            "alive": [r for r, p in procs.items() if p["alive"]]}


def down() -> dict:
    """Stop what the sandbox started, by recorded pid + start time, and nothing else:
    its processes, and the phases pivots started on it (each phase's own session)."""
    from . import phase_ops

    host = sandbox_host()
    for name, phase in host.phases.items():
        if (Path(host.run_dir) / f"phase-{name}.json").exists():
            phase_ops.stop(host, phase, "sandbox down")
    state = status()
    for role, info in state["processes"].items():
        if info["alive"]:
            procfs.signal_if_same(info["pid"], info["start_time"], signal.SIGKILL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(procfs.same_process(i["pid"], i["start_time"]) for i in state["processes"].values()):
        time.sleep(0.02)
    state_file = sandbox_dir() / "state.json"
    if state_file.exists():
        state_file.unlink()
    return state
