"""GPU memory per GPU, from NVML (v2 memory call), else nvidia-smi CSV, else none.

Why v2: NVML's v1 `used` counts ~615 MiB of driver-reserved memory on an idle H200, so a
"0 MiB used" check built on it never passes. v2 reports `used` without it and `reserved`
apart. nvidia-smi's CSV `memory.used` already excludes it (fixture query-gpu-idle.csv:
used 0, reserved 616). Every result names its source, so "no GPU data" is never silent.

A reader is opened once and read many times (verify polls every 50 ms; one NVML memory
query costs ~0.01 ms). The sandbox host uses a clearly labelled fake source that derives
memory from live sandbox processes.
"""
import contextlib
import glob
import json
import os
import shutil
import subprocess

from . import contract, procfs, smi_parse

MIB = 1024 * 1024


def _mib(nbytes):
    """Bytes -> MiB, rounded up: 1 byte still in use must not read as 0 MiB."""
    return None if nbytes is None else -(-int(nbytes) // MIB)


class NvmlSource:
    name = "nvml"

    def __init__(self):
        import pynvml

        self.nvml = pynvml
        pynvml.nvmlInit()
        self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]

    def read(self):
        nv = self.nvml
        gpus = []
        for index, h in enumerate(self.handles):
            try:
                mem = nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2)
                used, reserved, total = mem.used, mem.reserved, mem.total
                memory_call = "v2"
            except (nv.NVMLError, AttributeError, TypeError):
                mem = nv.nvmlDeviceGetMemoryInfo(h)  # old driver: v1 used includes reserved
                used, reserved, total = mem.used, None, mem.total
                memory_call = "v1"
            procs = []
            for p in nv.nvmlDeviceGetComputeRunningProcesses(h):
                raw = p.usedGpuMemory
                procs.append({"pid": p.pid, "used_mib": None if raw is None or raw >= 2 ** 64 - 1 else _mib(raw)})
            name = nv.nvmlDeviceGetName(h)
            gpus.append({"index": index, "uuid": _text(nv.nvmlDeviceGetUUID(h)), "name": _text(name),
                         "used_mib": _mib(used), "reserved_mib": _mib(reserved), "total_mib": _mib(total),
                         "memory_call": memory_call, "processes": procs})
        return gpus

    def close(self):
        try:
            self.nvml.nvmlShutdown()
        except Exception:
            pass


def _text(value):
    return value.decode() if isinstance(value, bytes) else value


class SmiSource:
    name = "nvidia-smi"

    def __init__(self):
        if not shutil.which("nvidia-smi"):
            raise FileNotFoundError("nvidia-smi not on PATH")

    def read(self):
        gpus = smi_parse.query_gpu(_run(smi_parse.GPU_QUERY))
        apps = smi_parse.query_compute_apps(_run(smi_parse.APP_QUERY))
        for g in gpus:
            g["memory_call"] = "csv"
            g["processes"] = [{"pid": a["pid"], "used_mib": a["used_mib"]} for a in apps if a["gpu_uuid"] == g["uuid"]]
        return gpus

    def close(self):
        pass


def _run(argv):
    return subprocess.run(argv, check=True, capture_output=True, text=True, timeout=20).stdout


class SandboxSource:
    """SANDBOX only: GPUs = the fake device files nvidiaN; memory = what live sandbox
    processes declared in DIR/<pid>.json ({"gpu": N, "mib": M, "start_time": T})."""

    name = "sandbox (fake GPUs)"
    TOTAL_MIB = 143771

    def __init__(self, memdir, devices_glob):
        self.memdir = memdir
        self.count = len([p for p in glob.glob(devices_glob) if os.path.basename(p)[6:].isdigit()])

    def read(self):
        gpus = [{"index": i, "uuid": "SANDBOX-GPU-%d" % i, "name": "SANDBOX fake GPU", "used_mib": 0,
                 "reserved_mib": 0, "total_mib": self.TOTAL_MIB, "memory_call": "sandbox", "processes": []}
                for i in range(self.count)]
        for path in glob.glob(os.path.join(self.memdir, "*.json")):
            try:
                with open(path) as f:
                    rec = json.load(f)
            except (OSError, ValueError):
                continue
            pid = int(os.path.basename(path)[:-5].split("-")[0])
            if rec["gpu"] < len(gpus) and procfs.same_process(pid, rec["start_time"]):
                gpus[rec["gpu"]]["used_mib"] += rec["mib"]
                gpus[rec["gpu"]]["processes"].append({"pid": pid, "used_mib": rec["mib"]})
        return gpus

    def close(self):
        pass


class NoSource:
    name = "none"

    def read(self):
        return []

    def close(self):
        pass


def total_used_mib(gpus):
    """Used MiB summed over GPUs (unknown counts as 0): progress lines and freed-MiB figures."""
    return sum(g["used_mib"] or 0 for g in gpus)


@contextlib.contextmanager
def reader(args, source=None):
    """Yield (source, why better sources were not used): the caller's open reader when it
    polls with one, else a fresh one that is closed on the way out."""
    if source is not None:
        yield source, []
        return
    source, tried = open_source(args.fake_gpus, args.devices)
    try:
        yield source, tried
    finally:
        source.close()


def open_source(fake_dir=None, devices_glob=contract.DEVICE_GLOB):
    """The best source this host has, and why each better one was not used."""
    if fake_dir:
        return SandboxSource(fake_dir, devices_glob), []
    tried: list = []
    for cls in (NvmlSource, SmiSource):
        try:
            return cls(), tried
        except Exception as exc:  # ImportError, NVMLError (no driver), FileNotFoundError
            tried.append("%s: %s: %s" % (cls.name, type(exc).__name__, exc))
    return NoSource(), tried
