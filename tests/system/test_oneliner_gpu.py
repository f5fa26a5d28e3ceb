"""The emergency line on real NVIDIA GPUs, beside `invoke teardown`: a CUDA context PROTECT names
is kept by both (and keeps the verdict not free: it holds memory), an unprotected one is stopped by
both. `pytest -m gpu` on the GPU machine; skipped wherever NVML sees no GPU.

The holders open a CUDA context through the driver library itself (libcuda), no framework: a
process that maps the device files and holds memory, as a server does. Each carries a token only
this test uses, and the token is the hosts.env SCOPE."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import invoke
from tests.support.gpu_support import CUDA_HOLD, gpu_count
from tests.support.parsers import oneliner_report
from tests.support.procs import alive, wait_for

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(gpu_count() == 0, reason="no NVIDIA GPU visible through NVML")]

def _world(tmp: Path, token: str) -> dict:
    procs = {}
    for role, extra in (("keep", ["keep-me"]), ("stop", [])):
        ready = tmp / f"{role}.ready"
        procs[role] = subprocess.Popen([sys.executable, "-c", CUDA_HOLD, str(ready), token, *extra],
                                       start_new_session=True)
        wait_for(ready.exists, f"{role}'s CUDA context", timeout=120)
    return procs


def test_the_line_keeps_a_protected_cuda_context_as_invoke_teardown_does(tmp_path, hosts_env):
    token = f"gpupivot-oneliner-{os.getpid()}"
    hosts_env(f"LOCAL_PYTHON={sys.executable}\nLOCAL_PROTECT=keep-me\nLOCAL_SCOPE={token}\n")
    survivors, codes = {}, {}
    for how in ("invoke teardown", "pasted line"):
        procs = _world(tmp_path, f"{token}-{how.split()[0]}")
        try:
            if how == "invoke teardown":
                ran = invoke("teardown", "--host", "local", "--yes", "--grace", "5", "--settle", "1", timeout=180)
            else:
                line = invoke("oneliner", "--host", "local", "--action", "teardown", "--grace", "5")
                assert line.returncode == 0, line.stderr
                ran = subprocess.run(["bash", "-c", line.stdout.decode().strip()], capture_output=True, timeout=180)
                report = oneliner_report.parse_report(ran.stdout.decode())
                keep = procs["keep"].pid
                assert report["protected"] == [keep] and report["protected-mapped"] == [keep], report
                assert report["decisions"][keep][0] == "keep" and "PROTECT" in report["decisions"][keep][1]
                assert report["sigTERM"] == [procs["stop"].pid] and report["verdict"] == "not-free", report
                assert report["gpus-with-memory-used"] >= 1
            codes[how] = ran.returncode
            survivors[how] = {role for role, p in procs.items() if alive(p.pid)}
        finally:
            for p in procs.values():
                if p.poll() is None:
                    p.kill()
                p.wait(30)
    assert survivors["invoke teardown"] == survivors["pasted line"] == {"keep"}, survivors
    assert codes["invoke teardown"] == codes["pasted line"] == 1, codes  # the kept one holds GPU memory
