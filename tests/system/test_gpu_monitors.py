"""GPU tests: a teardown while someone watches the GPUs (`watch -n 1 nvidia-smi`, a faster
poll, a renamed copy of nvidia-smi, a pynvml exporter loop). `pytest -m gpu` on the GPU
machine; skipped cleanly wherever NVML sees no GPU, as in CI.

Why: nvidia-smi and every NVML client open and map the device files and have no CUDA context.
Taken for holders, each poll made the teardown end NOT FREE after 30-61 s with "FREED at"
printed dozens of times (a real H200, driver 580). NVML's process list is what says who has
a context: the watcher must change nothing, and the `free at` line comes once.
"""
import os
import sys

import pytest

from tests.conftest import invoke
from tests.support.gpu_support import POLLERS, GpuTree, Poller, gpu_count, nvml_used_mib

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(gpu_count() == 0, reason="no NVIDIA GPU visible through NVML")]


@pytest.mark.parametrize("kind", POLLERS)
def test_a_teardown_while_the_gpus_are_watched_ends_freed(tmp_path, hosts_env, kind):
    token = f"gpupivot-test-{os.getpid()}-{kind}"
    tree = GpuTree(tmp_path, token, children=0, gib=8)  # a one-process server holding 8 GiB
    poller = Poller(tmp_path, kind)
    try:
        hosts_env(f"LOCAL_PYTHON={sys.executable}\nLOCAL_TARGETS='gpu_tree\\.py'\nLOCAL_SCOPE={token}\n")
        out = invoke("teardown", "--host", "local", "--yes", "--grace", "3", timeout=90)
        text = out.stdout.decode(errors="replace")
        assert out.returncode == 0, text + out.stderr.decode(errors="replace")
        assert text.count("local: free at ") == 1, text
        assert text.count("FREED") == 1 and "FREED and verified" in text and "RESPAWN" not in text
        assert tree.alive() == [] and poller.alive()
        assert nvml_used_mib() == [0] * gpu_count()
    finally:
        poller.stop()
        tree.kill()
