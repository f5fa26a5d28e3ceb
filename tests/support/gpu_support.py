"""Helpers for the GPU tests and the GPU benchmark (run on the GPU machine only)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from scripts.agent.procs import procfs

HERE = Path(__file__).resolve().parent


def add_tree_arguments(parser) -> None:
    """The flags the GPU benchmarks share (bench/gpu_teardown.py, bench/exit_probe.py): how many
    reps, the tree (a parent + CHILDREN, each holding GIB on every GPU) and where the JSON goes."""
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--children", type=int, default=3)
    parser.add_argument("--gib-per-proc", type=float, default=20)
    parser.add_argument("--out", required=True)


def gpu_count() -> int:
    """Visible NVIDIA GPUs through NVML, 0 where there is no driver, no GPU or no pynvml."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return pynvml.nvmlDeviceGetCount()
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return 0


def nvml_used_mib() -> list:
    import pynvml

    pynvml.nvmlInit()
    try:
        return [-(-pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i),
                                                   version=pynvml.nvmlMemory_v2).used // 2**20)
                for i in range(pynvml.nvmlDeviceGetCount())]
    finally:
        pynvml.nvmlShutdown()


class GpuTree:
    """Start tests/support/gpu_tree.py; .pids = [parent, children...] once all hold their memory."""

    def __init__(self, workdir: Path, token: str, children: int = 3, gib: float = 2.0, wrapped: bool = False):
        """`wrapped`: started by a shell that outlives it (`bash -c 'python3 gpu_tree.py ...; sleep'`),
        a supervisor the teardown names and does not stop, so its settle window is watched whole."""
        self.ready = Path(workdir) / f"{token}.ready"
        argv = [sys.executable, str(HERE / "gpu_tree.py"), "--token", token, "--children", str(children), "--gib",
                str(gib), "--ready", str(self.ready)]
        if wrapped:
            import shlex

            argv = ["bash", "-c", shlex.join(argv) + "; exec sleep 3600"]
        self.proc = subprocess.Popen(argv, start_new_session=True)
        deadline = time.monotonic() + 300
        while not self.ready.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"gpu tree did not start (exit {self.proc.poll()})")
            time.sleep(0.05)
        self.pids = [int(p) for p in self.ready.read_text().split()]
        self.starts = {p: procfs.start_time(p) for p in self.pids}

    def kill(self, sig=signal.SIGKILL) -> None:
        """Signal the whole tree at once, by PID + start time (the floor measurement), and the
        shell that wraps it, if any (once the tree is gone: it would only start `sleep`)."""
        for pid, start in self.starts.items():
            procfs.signal_if_same(pid, start, sig)
        if self.proc.pid not in self.starts and self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            pass

    def alive(self) -> list:
        return [p for p, s in self.starts.items() if procfs.same_process(p, s)]


class Monitor:
    def __init__(self, workdir: Path):
        ready = Path(workdir) / "monitor.ready"
        self.proc = subprocess.Popen([sys.executable, str(HERE / "gpu_monitor.py"), str(ready)], start_new_session=True)
        while not ready.exists():
            if self.proc.poll() is not None:
                raise RuntimeError("monitor did not start")
            time.sleep(0.02)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


POLLERS = ("smi-1s", "smi-0.2s", "renamed-smi-0.2s", "pynvml-0.2s")


class Poller:
    """What someone watching the GPUs runs beside a server: `watch -n 1 nvidia-smi` (a loop
    that runs nvidia-smi every INTERVAL s), the same with a copy of nvidia-smi under another
    name, or a pynvml loop that opens NVML, reads every GPU and closes it each time (an
    exporter). `kind` is one of POLLERS. Its own session; ended by its process group, which
    is its own."""

    def __init__(self, workdir: Path, kind: str):
        import shutil

        interval = kind.rsplit("-", 1)[1].rstrip("s")
        smi = shutil.which("nvidia-smi") or "nvidia-smi"
        if kind.startswith("renamed"):
            copy = Path(workdir) / "gpu-watch"
            shutil.copy(smi, copy)
            smi = str(copy)
        if kind.startswith("pynvml"):
            body = (f"{sys.executable} -c 'import pynvml; pynvml.nvmlInit(); "
                    "[(pynvml.nvmlDeviceGetMemoryInfo(h), pynvml.nvmlDeviceGetComputeRunningProcesses(h)) "
                    "for h in map(pynvml.nvmlDeviceGetHandleByIndex, range(pynvml.nvmlDeviceGetCount()))]; "
                    "pynvml.nvmlShutdown()'")
        else:
            body = f"{smi} >/dev/null"
        self.kind = kind
        self.proc = subprocess.Popen(["bash", "-c", f"while :; do {body}; sleep {interval}; done"],
                                     start_new_session=True, stdin=subprocess.DEVNULL)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the group is the loop's own (new session)
            self.proc.wait()


# A CUDA context opened through libcuda itself (no torch), holding 1 GiB of GPU 0; argv: READY
# (created once it holds), then anything (tokens that name or scope it)
CUDA_HOLD = r"""
import ctypes, sys, time
cuda = ctypes.CDLL("libcuda.so.1")
dev, ctx, ptr = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
assert cuda.cuInit(0) == 0
assert cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
assert cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev) == 0
assert cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(1 << 30)) == 0
open(sys.argv[1], "w").close()
time.sleep(600)
"""
