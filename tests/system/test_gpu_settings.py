"""GPU test: each GPU's settings read through the real NVML, as `invoke status` shows them, agree
with nvidia-smi's; nothing is set. `pytest -m gpu` on the GPU machine; skipped without a GPU."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from scripts.agent.wire import requests
from scripts.config.hostconfig import build_host
from scripts.reach.transport import call_agent
from tests.conftest import invoke
from tests.support.gpu_support import gpu_count
from tests.support.task_help import columns

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(gpu_count() == 0, reason="no NVIDIA GPU visible through NVML")]

SMI = "persistence_mode,compute_mode,clocks.applications.graphics,clocks.applications.memory,power.limit," \
      "power.default_limit,mig.mode.current"


def _smi(text):
    """nvidia-smi's CSV cell as the agent words it: None for [N/A] / [Not Supported]."""
    text = text.strip()
    if text.startswith("["):
        return None
    words = {"Enabled": "on", "Disabled": "off", "Default": "default", "Exclusive_Process": "exclusive_process",
             "Prohibited": "prohibited"}
    if text in words:
        return words[text]
    number = float(text)
    return int(number) if number == int(number) else number


def test_status_reads_every_gpus_settings_as_nvidia_smi_does(tmp_path):
    doc = call_agent(build_host("local", {"PYTHON": sys.executable}, "test"), requests.Scan()).doc
    assert doc["gpu_source"] == "nvml"
    assert len(doc["gpus"]) == gpu_count()
    names = ("persistence", "compute_mode", "graphics_clock_mhz", "memory_clock_mhz", "power_limit_w",
             "power_default_w", "mig")
    for g in doc["gpus"]:
        st = g["settings"]
        assert st["unread"] == {}, st
        for name in names:  # a value, or None named as not supported: never 0 for unknown
            assert (st[name] is None) == (name in st["not_supported"]), (name, st)
            assert st[name] != 0, (name, st)
        assert st["power_limit_w"] is not None and st["power_default_w"] is not None, st
    if shutil.which("nvidia-smi"):
        smi_out = subprocess.run(["nvidia-smi", "--query-gpu=index," + SMI, "--format=csv,noheader,nounits"],
                                 capture_output=True, text=True)
        # a driver whose nvidia-smi no longer knows a field refuses the query: nothing to compare with
        for line in smi_out.stdout.strip().splitlines() if smi_out.returncode == 0 else ():
            cells = [c.strip() for c in line.split(",")]
            st = doc["gpus"][int(cells[0])]["settings"]
            smi = dict(zip(names, map(_smi, cells[1:]), strict=True))
            for name in names:
                assert st[name] == smi[name] or (st[name] is None and smi[name] is None), (name, st, smi, line)
    # the screen: the settings table at 80 columns, against a baseline read from hosts.env
    first = doc["gpus"][0]["settings"]
    hosts = tmp_path / "hosts.env"
    hosts.write_text(f"LOCAL_PYTHON={sys.executable}\n"
                     f"LOCAL_GPU_BASELINE='{json.dumps({'power_limit_w': first['power_limit_w']})}'\n")
    shown = invoke("status", "--host", "local", env=dict(columns(80), GPU_PIVOT_HOSTS_FILE=str(hosts)))
    text = shown.stdout.decode()
    assert "GPU settings" in text and "*: differs from LOCAL_GPU_BASELINE" in " ".join(text.split()), text
    assert all(len(line) <= 80 for line in text.splitlines()), text
    same = [g for g in doc["gpus"] if g["settings"]["power_limit_w"] == first["power_limit_w"]]
    for g in same:
        assert f"GPU {g['index']} differs" not in text, text
    assert os.environ.get("GPU_PIVOT_NVML_RECORDING") is None  # the real NVML, not the stand-in
