"""Stand-ins for what needs a GPU, for the tests on this machine (it has none): the NVML
stand-in module (support/standin/nvml, replaying a recording), the agent run as a subprocess
against it, a process that holds device files, and the CUDA MPS programs (known by their
executable's real path, so a copy of this Python, root-owned, stands in for each)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.paths import REPO, STANDIN as STANDINS

STANDIN = STANDINS / "nvml"
AGENT = REPO / "scripts" / "gpuagent.py"
# holds every device file named before --ready open, then says so by creating the --ready file
HOLD = ("import sys, time\nf = [open(p, 'rb') for p in sys.argv[1:sys.argv.index('--ready')] if p[:1] == '/']\n"
        "open(sys.argv[-1], 'w').close()\ntime.sleep(3600)\n")
# an H200 as NVML's memory and process queries see it when idle (nothing else recorded)
H200_MEMORY = {"uuid": "GPU-0", "name": "NVIDIA H200", "bus": "00000000:19:00.0", "used": 0, "reserved": 645922816,
               "total": 150754820096, "processes": []}


def agent(sub, *args, recording=None, tmp=None, env_extra=None, timeout=60):
    """(exit code, JSON document) of `gpuagent.py SUB --json ARGS`; with a recording, NVML is the stand-in."""
    env = dict(os.environ)
    if recording is not None:
        path = Path(tmp) / ("rec-%d.json" % time.monotonic_ns())
        path.write_text(json.dumps(recording))
        env["PYTHONPATH"] = os.pathsep.join([str(STANDIN), env.get("PYTHONPATH", "")])
        env["GPU_PIVOT_NVML_RECORDING"] = str(path)
    env.update(env_extra or {})
    done = subprocess.run([sys.executable, str(AGENT), sub, "--json", *args], capture_output=True, text=True,
                          env=env, timeout=timeout, cwd=REPO)
    return done.returncode, json.loads(done.stdout)


CLIENT = ("#!/bin/sh\n# stand-in for nvidia-cuda-mps-control without -d: writes stdin to the daemon's pipe\n"
          "exec cat > \"$CUDA_MPS_PIPE_DIRECTORY/control\"\n")


def mps_program(tmp_path, name):
    """A root-owned program file named like an MPS program: a copy of this Python (MPS is known
    by its executable's real path, a root-owned file; argv[0] and comm do not count)."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the MPS programs are root-owned files")
    progdir = tmp_path / "mps-programs"
    progdir.mkdir(mode=0o755, exist_ok=True)
    path = progdir / name
    if not path.exists():
        shutil.copy(os.path.realpath(sys.executable), path)
        path.chmod(0o755)
    return str(path)
