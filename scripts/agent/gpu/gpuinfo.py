"""GPU memory per GPU, from NVML (v2 memory call), else nvidia-smi CSV, else none.

Why v2: NVML's v1 `used` counts ~615 MiB of driver-reserved memory on an idle H200, so a
"0 MiB used" check built on it never passes. v2 reports `used` without it and `reserved`
apart. nvidia-smi's CSV `memory.used` already excludes it (fixture query-gpu-idle.csv:
used 0, reserved 616). Every result names its source, so "no GPU data" is never silent.

A reader is opened once and read many times (a teardown polls `usage()` every few ms
while the driver frees memory; one NVML memory query costs ~0.01 ms), and may be opened
on a thread (Opening) so NVML's init overlaps other work. The sandbox host uses a clearly
labelled fake source that derives memory from live sandbox processes.
"""
import contextlib
import glob
import json
import os
import threading
import time

from ..procs import procfs
from ..wire import defaults
from . import nvml, smi_parse

MIB = 1024 * 1024


def _mib(nbytes):
    """Bytes -> MiB, rounded up: 1 byte still in use must not read as 0 MiB."""
    return None if nbytes is None else -(-int(nbytes) // MIB)


class NvmlSource:
    name = "nvml"

    def __init__(self):
        self.nvml = nvml.open_nvml()  # what reads and sets GPU settings too
        try:
            self.handles = self.nvml.handles()
        except Exception:
            self.nvml.close()
            raise
        self.settings_nv, self.settings_handles = self.nvml, self.handles
        self._names: dict = {}  # index -> (uuid, name): fixed for the life of the handle, read once

    def _memory(self, h):
        """(used, reserved, total, call) bytes (nvml.Nvml.memory); raises where it is not read."""
        mem = self.nvml.memory(h)
        if mem is nvml.NA:
            raise nvml.NvmlError("nvmlDeviceGetMemoryInfo", nvml.NOT_SUPPORTED, "Not Supported")
        return mem

    def _processes(self, h):
        procs = self.nvml.compute_processes(h)
        if procs is nvml.NA:
            raise nvml.NvmlError("nvmlDeviceGetComputeRunningProcesses", nvml.NOT_SUPPORTED, "Not Supported")
        return [{"pid": pid, "used_mib": _mib(used)} for pid, used in procs]

    def usage(self):
        """[(used MiB, compute processes)] per GPU: the two calls a teardown polls every few
        ms while the driver frees memory (each about 0.01 ms), without names or UUIDs. A GPU
        whose calls fail reads (None, None): unknown, which reads_free never calls free."""
        out: list = []
        for h in self.handles:
            try:
                out.append((_mib(self._memory(h)[0]), len(self._processes(h))))
            except Exception:
                out.append((None, None))
        return out

    def read(self):
        """Every GPU's row. Each query is asked on its own, as health.py asks its own (one
        failing field of one GPU must not make the whole scan raise): a field that fails is None (or
        no process listed) and is named in the row's `unread`, which verify.evaluate counts as
        not free: an unknown value is never "free"."""
        gpus = []
        for index, h in enumerate(self.handles):
            unread = []
            try:
                used, reserved, total, memory_call = self._memory(h)
            except Exception as exc:
                used = reserved = total = memory_call = None
                unread.append("memory: %s" % _error(exc))
            try:
                procs = self._processes(h)
            except Exception as exc:
                procs = []
                unread.append("compute processes: %s" % _error(exc))
            uuid, name = self._identity(index, h)
            row = {"index": index, "uuid": uuid, "name": name,
                   "used_mib": _mib(used), "reserved_mib": _mib(reserved), "total_mib": _mib(total),
                   "memory_call": memory_call, "processes": procs}
            if unread:
                row["unread"] = unread
            gpus.append(row)
        return gpus

    def _identity(self, index, h):
        """(uuid, name), read once (fixed for the life of the handle); (None, '?') while they fail."""
        if index not in self._names:
            try:
                uuid, name = self.nvml.uuid(h), self.nvml.name(h)
            except Exception:
                return None, "?"
            self._names[index] = (uuid or None, name or "?")
        return self._names[index]

    def close(self):
        self.nvml.close(hung=getattr(self, "hung", False))  # health.py saw a call not return: no shutdown


def _error(exc):
    return "%s: %s" % (type(exc).__name__, exc) if str(exc) else type(exc).__name__


class SmiSource:
    name = "nvidia-smi"

    def __init__(self):
        import shutil  # here, not at the top: shutil (bz2, lzma) would cost every teardown's start ~3 ms
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
    import subprocess

    return subprocess.run(argv, check=True, capture_output=True, text=True, timeout=20).stdout


class SandboxSource:
    """SANDBOX only: GPUs = the fake device files nvidiaN; memory = what live sandbox
    processes declared in DIR/<pid>.json ({"gpu": N, "mib": M, "start_time": T})."""

    name = "sandbox (fake GPUs)"
    TOTAL_MIB = 143771

    def __init__(self, memdir, devices_glob):
        self.memdir = memdir
        self.count = len([p for p in glob.glob(devices_glob) if os.path.basename(p)[6:].isdigit()])
        self.settings_handles = list(range(self.count))
        from .sandbox_settings import SandboxSettings  # the sandbox's GPU settings: a file beside its memory dir

        self.settings_nv = SandboxSettings(os.path.join(os.path.dirname(os.path.abspath(memdir)), "gpu-settings.json"),
                                           self.count)  # one object: its lock serialises the threads' writes

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

    def usage(self):
        return [(g["used_mib"], len(g["processes"])) for g in self.read()]

    def close(self):
        pass


class NoSource:
    name = "none"

    def read(self):
        return []

    def usage(self):
        return []

    def close(self):
        pass


def reads_free(source, max_used_mib):
    """True/False from the source's quick per-GPU read (NVML: memory and compute processes
    only), None when it has none worth polling (nvidia-smi costs a process per read).
    Only a hint for when to scan: free is decided by a full scan (verify.evaluate)."""
    usage = getattr(source, "usage", None)
    if usage is None:
        return None
    return all(procs == 0 and (used is None or used <= max_used_mib) for used, procs in usage())


FAST_POLL_S = 0.002  # the driver frees a holder's memory as it exits, 0.3-0.7 s after the signal: look every 2 ms


def until_reads_free(source, max_used_mib, limit_s):
    """Poll the source's quick read every FAST_POLL_S until it says free or limit_s passes
    (at once when the source has no quick read). Decides only when to scan, never that
    anything is free."""
    end = time.monotonic() + limit_s
    while reads_free(source, max_used_mib) is False and time.monotonic() < end:
        time.sleep(FAST_POLL_S)


class Opening:
    """open_source() on a thread, used as the source it yields (name, read, usage, close,
    plus `tried`). Why: importing pynvml and NVML's init cost ~0.1 s on an H200 host, which
    a teardown starts only after its signals (start()), so it runs while the driver releases
    the targets' memory instead of delaying the first signal. Any use before start() opens
    it there and then."""

    def __init__(self, fake_dir=None, devices_glob=defaults.DEVICE_GLOB, start=True):
        self._args = (fake_dir, devices_glob)
        self._opened = None
        self._thread = None
        self.open_s = None  # how long opening took (pynvml import + NVML init), for the teardown's timings
        if start:
            self.start()

    def start(self):
        if self._thread is None:
            self._thread = threading.Thread(target=self._open, name="gpu-source-open")
            self._thread.daemon = True
            self._thread.start()
        return self

    def _open(self):
        t0 = time.monotonic()
        try:
            self._opened = open_source(*self._args)
        except Exception as exc:  # open_source catches the expected failures; anything else: no source
            self._opened = (NoSource(), ["opening a GPU source failed: %s: %s" % (type(exc).__name__, exc)])
        self.open_s = round(time.monotonic() - t0, 4)

    def opened(self):
        self.start()._thread.join()
        return self._opened

    @property
    def tried(self):
        return self.opened()[1]

    def __getattr__(self, attr):  # name, read, usage, nvml, handles: the opened source's
        if attr.startswith("_"):
            raise AttributeError(attr)
        return getattr(self.opened()[0], attr)

    def close(self):
        if self._thread is not None:  # never opened: nothing to close
            self.opened()[0].close()


def total_used_mib(gpus):
    """Used MiB summed over GPUs, for progress lines and freed-MiB figures; None when a GPU's is
    unknown (no NVML, a failed read) or no GPU is seen: unknown is never shown as 0."""
    if not gpus or any(g["used_mib"] is None for g in gpus):
        return None
    return sum(g["used_mib"] for g in gpus)


@contextlib.contextmanager
def reader(gpus, source=None):
    """Yield (source, why better sources were not used): the caller's open reader when it
    polls with one, else a fresh one that is closed on the way out."""
    if source is not None:
        yield source, []
        return
    source, tried = open_source(gpus.fake_gpus, gpus.devices)
    try:
        yield source, tried
    finally:
        source.close()


def open_source(fake_dir=None, devices_glob=defaults.DEVICE_GLOB):
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
