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
SETS = {"nvmlDeviceSetPersistenceMode": "persistence", "nvmlDeviceSetComputeMode": "compute_mode",
        "nvmlDeviceSetPowerManagementLimit": "power_limit_mw"}  # the setter -> its key in the file


class SandboxSettings:
    """nvml.Nvml's settings methods, which settings.py and settings_write.py call, on the
    sandbox's file. A handle is the GPU's index."""

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

    def persistence(self, h):
        return self._all()[h]["persistence"]

    def compute_mode(self, h):
        return self._all()[h]["compute_mode"]

    def app_clock(self, h, kind):
        graphics, memory = self._all()[h]["app_clocks"]
        return graphics if kind == "graphics" else memory

    def power_limit_mw(self, h):
        return self._all()[h]["power_limit_mw"]

    def power_default_mw(self, h):
        return self._all()[h]["power_default_mw"]

    def mig_mode(self, h):
        return self._all()[h]["mig"], self._all()[h]["mig"]

    def write(self, h, call, values):
        """The NVML setter `call` (nvml.SETTERS) on the file: values as NVML takes them."""
        if call == "nvmlDeviceSetApplicationsClocks":  # (memory MHz, graphics MHz), kept as [graphics, memory]
            self._set(h, "app_clocks", [int(values[1]), int(values[0])])
        else:
            self._set(h, SETS[call], int(values[0]))


def write_whole(path, text):
    """Replace path with text in one step: a fresh O_EXCL temp file (0600) renamed over it."""
    tmp = "%s.tmp.%d.%d" % (path, os.getpid(), threading.get_ident())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.rename(tmp, path)
