"""Say who and where the agent is, and which GPU tools this host has."""
import glob
import os
import platform
import shutil
import socket
import sys

from ..options.record import Options
from ..wire import codes, records


def add_arguments(parser):
    pass


def run(opts: Options):
    from ..gpu import nvml as nvml_door  # import only: initialising NVML is scan's job, not ping's

    nvml, nvml_why = nvml_door.available()
    doc = {
        "hostname": socket.gethostname(),
        "pid": os.getpid(),
        "uid": os.getuid(),
        # who became root with sudo (sudo sets it; `pct exec` may not pass it into a container)
        "sudo_user": os.environ.get("SUDO_USER") if os.getuid() == 0 else None,
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "kernel": platform.release(),
        "nvml": nvml,
        "nvml_error": nvml_why,
        "nvidia_smi": shutil.which("nvidia-smi"),
        "fuser": shutil.which("fuser"),
        "pidfd": hasattr(os, "pidfd_open"),
        "devices_glob": opts.devices,
        "devices": sorted(glob.glob(opts.devices)),
    }
    return codes.EXIT_OK, records.written(records.PingResult, doc, code=codes.EXIT_OK)
