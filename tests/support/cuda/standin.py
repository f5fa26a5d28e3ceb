"""The STAND-IN libcuda.so.1 (fake_libcuda.c beside this file), built with gcc for a test, and
the agent run with the probe pointed at it.

Why a launcher and not an env var: the probe loads libcuda by its soname in production, and no
variable or flag can make it load another file; a test sets probe.LIBCUDA in-process, here in
the agent process it starts (probe_agent below), which production never runs.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.gpu_standins import STANDIN
from tests.support.paths import REPO

SOURCE = Path(__file__).with_name("fake_libcuda.c")
LAUNCH = ("import sys; sys.path.insert(0, sys.argv[1]); from scripts.agent.gpu import probe; "
          "probe.LIBCUDA = sys.argv[2]; from scripts.agent import cli; sys.exit(cli.main(sys.argv[3:]))")


def build(dest: Path) -> Path:
    """The stand-in library compiled into dest; skips where gcc is missing (.ci/packages has it)."""
    if shutil.which("gcc") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("gcc is missing (.ci/packages lists it)")
        pytest.skip("gcc is missing: `make system-deps` installs it")
    lib = dest / "libcuda.so.1"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(lib), str(SOURCE)], check=True, capture_output=True)
    return lib


def uuid_hex(n: int) -> str:
    return "%032x" % n


def nvml_uuid(n: int) -> str:
    h = uuid_hex(n)
    return "GPU-%s-%s-%s-%s-%s" % (h[:8], h[8:12], h[12:16], h[16:20], h[20:])


def control(path: Path, lines: list) -> dict:
    """Write the stand-in's control file; the environment that points the stand-in at it."""
    path.write_text("\n".join(lines) + "\n")
    return {"GPU_PIVOT_FAKE_CUDA": str(path)}


def probe_agent(lib: Path, tmp: Path, recording: dict, env_extra: dict, *args) -> tuple:
    """(exit code, JSON document) of the real agent's `ARGS --json` with NVML the stand-in
    replaying `recording` and the probe loading the stand-in libcuda `lib`."""
    rec = tmp / "nvml-recording.json"
    rec.write_text(json.dumps(recording))
    env = dict(os.environ, PYTHONPATH=str(STANDIN), GPU_PIVOT_NVML_RECORDING=str(rec), **env_extra)
    done = subprocess.run([sys.executable, "-c", LAUNCH, str(REPO), str(lib), *args, "--json"], capture_output=True,
                          text=True, env=env, timeout=120, cwd=tmp)
    return done.returncode, json.loads(done.stdout)
