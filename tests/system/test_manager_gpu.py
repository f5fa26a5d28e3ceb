"""On real NVIDIA GPUs: a CUDA server under a real supervisord (autorestart=true) is freed for
good by `invoke teardown`, through `supervisorctl stop`, while supervisord lives on.

Why on a GPU: the verdict reads NVML there (the driver's own list of compute processes), and
a program supervisord restarts takes its CUDA context again within a second: only the driver
says whether the GPU stayed free. `pytest -m gpu` on the GPU machine; skipped wherever NVML
sees no GPU. The holder opens a CUDA context through libcuda itself (tests/system/test_oneliner_gpu.py's
holder) and carries a token only this test uses, which is the hosts.env SCOPE. The GPU machine
has no Debian supervisor: `pip download supervisor==4.2.5 --no-deps -d .whl` here, and there
`pip install --no-index --no-deps --target /tmp/site .whl/*.whl` with /tmp/site/bin on PATH
(bench/gpu_session.sh installs .whl/ so). H200: 1 passed.
"""
from __future__ import annotations

import os
import sys
import time

import pytest

from tests.conftest import invoke, need_tools
from tests.support.gpu_support import CUDA_HOLD, gpu_count
from tests.support.managers_fixtures import Supervisord
from tests.support.procs import alive, wait_for

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(gpu_count() == 0, reason="no NVIDIA GPU visible through NVML")]

AFTER_STOP_S = 5


def compute_pids() -> set:
    """The pids NVML lists as compute processes on any GPU."""
    import pynvml

    pynvml.nvmlInit()
    try:
        return {p.pid for i in range(pynvml.nvmlDeviceGetCount())
                for p in pynvml.nvmlDeviceGetComputeRunningProcesses(pynvml.nvmlDeviceGetHandleByIndex(i))}
    finally:
        pynvml.nvmlShutdown()


def test_a_cuda_server_under_supervisord_is_freed_for_good(tmp_path, hosts_env):
    need_tools("supervisord", "supervisorctl", why="a CUDA server under a real supervisord")
    token = f"gpupivot-supervisord-{os.getpid()}"
    server = tmp_path / "cuda_server.py"
    server.write_text(CUDA_HOLD)
    ready = tmp_path / "ready"
    sd = Supervisord(tmp_path, {"vllm": [sys.executable, str(server), str(ready), token]}, group="infer")
    try:
        pid = sd.program_pid("vllm")
        wait_for(ready.exists, "the server's CUDA context", timeout=120)
        wait_for(lambda: pid in compute_pids(), "NVML lists the server", timeout=30)
        hosts_env(f"LOCAL_PYTHON={sys.executable}\nLOCAL_TARGETS='cuda_server\\.py'\nLOCAL_SCOPE={token}\n")
        plan = invoke("plan", "--host", "local", timeout=120)
        shown = " ".join(plan.stdout.decode().split())  # the line is wrapped to the screen between words
        assert f"will be stopped with supervisorctl -c {sd.conf} stop infer:vllm" in shown, plan.stdout
        ran = invoke("teardown", "--host", "local", "--yes", "--grace", "5", timeout=180)
        out = ran.stdout.decode() + ran.stderr.decode()
        assert ran.returncode == 0 and "FREED" in out, out
        time.sleep(AFTER_STOP_S)  # autorestart would have started it again by now
        assert sd.state("vllm") == "STOPPED"
        assert not alive(pid) and alive(sd.pid)
        assert compute_pids() == set()
    finally:
        sd.down()
