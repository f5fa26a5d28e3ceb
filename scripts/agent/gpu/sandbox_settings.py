"""SANDBOX only: GPU settings kept in a file of the sandbox directory, read and set through the
same calls as NVML's, so `make pivot-train` shows a baseline restored and a phase's settings
set without a GPU. Never used on a real host: only the sandbox's fake source has it.

The file (DIR/gpu-settings.json, beside the fake GPUs' memory dir) is the sandbox's own, in
its private directory; it is written whole, O_EXCL|O_NOFOLLOW then renamed, never through a
link. A missing or unreadable file reads as the defaults below.
"""
import json
import os
import threading

DEFAULT = {"persistence": 1, "compute_mode": 0, "app_clocks": [1980, 2619], "power_limit_mw": 700000,
           "power_default_mw": 700000, "mig": 0}
NVML_CLOCK_GRAPHICS, NVML_CLOCK_MEM = 0, 2


class SandboxSettings:
    """The NVML calls settings.py and settings_write.py make, on the sandbox's file. A handle
    is the GPU's index."""

    def __init__(self, path, count):
        self.path, self.count = path, count
        self._lock = threading.Lock()

    def _all(self):
        try:
            with open(self.path) as f:
                doc = json.load(f)
        except (OSError, ValueError):
            doc = {}
        return [dict(DEFAULT, **(doc.get(str(i)) or {})) for i in range(self.count)]

    def _set(self, h, key, value):
        with self._lock:
            gpus = self._all()
            gpus[h][key] = value
            write_whole(self.path, json.dumps({str(i): g for i, g in enumerate(gpus)}))

    def nvmlDeviceGetPersistenceMode(self, h):  # noqa: N802 (NVML's names)
        return self._all()[h]["persistence"]

    def nvmlDeviceGetComputeMode(self, h):  # noqa: N802
        return self._all()[h]["compute_mode"]

    def nvmlDeviceGetApplicationsClock(self, h, kind):  # noqa: N802
        graphics, memory = self._all()[h]["app_clocks"]
        return graphics if kind == NVML_CLOCK_GRAPHICS else memory

    def nvmlDeviceGetPowerManagementLimit(self, h):  # noqa: N802
        return self._all()[h]["power_limit_mw"]

    def nvmlDeviceGetPowerManagementDefaultLimit(self, h):  # noqa: N802
        return self._all()[h]["power_default_mw"]

    def nvmlDeviceGetMigMode(self, h):  # noqa: N802
        return self._all()[h]["mig"], self._all()[h]["mig"]

    def nvmlDeviceSetPersistenceMode(self, h, mode):  # noqa: N802
        self._set(h, "persistence", int(mode))

    def nvmlDeviceSetComputeMode(self, h, mode):  # noqa: N802
        self._set(h, "compute_mode", int(mode))

    def nvmlDeviceSetApplicationsClocks(self, h, mem_mhz, graphics_mhz):  # noqa: N802
        self._set(h, "app_clocks", [int(graphics_mhz), int(mem_mhz)])

    def nvmlDeviceSetPowerManagementLimit(self, h, limit_mw):  # noqa: N802
        self._set(h, "power_limit_mw", int(limit_mw))


def write_whole(path, text):
    """Replace path with text in one step: a fresh O_EXCL temp file (0600) renamed over it."""
    tmp = "%s.tmp.%d.%d" % (path, os.getpid(), threading.get_ident())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.rename(tmp, path)
