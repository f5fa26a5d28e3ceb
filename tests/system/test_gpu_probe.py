"""The CUDA probe and the NVLink fabric state on real NVIDIA GPUs. `pytest -m gpu` on the GPU
machine; skipped cleanly (with the reason) wherever NVML sees no GPU, as in CI.

Read-only for the GPU's settings: the probe creates a context, allocates, touches and frees a
buffer and destroys the context, as any CUDA job does; nothing is set or reset. Prints the
probe's and the fabric's answers (run with -s: a GPU session's notes paste them).
"""
from __future__ import annotations

import json
import os
import sys

import pytest

from scripts.agent.gpu import gpuinfo, probe
from scripts.agent.wire import requests
from scripts.config.hostconfig import build_host
from scripts.reach.transport import call_agent
from tests.support.gpu_support import gpu_count

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(gpu_count() == 0, reason="no NVIDIA GPU visible through NVML")]


def show(title, value):
    print(f"\n## {title}\n{json.dumps(value, indent=1, sort_keys=True, default=str)}", flush=True)


def test_the_probe_passes_on_every_gpu_matched_by_uuid_and_timed():
    source, _ = gpuinfo.open_source()
    try:
        gpus = source.read()
        res = probe.run(gpus, 64, source=source)
    finally:
        source.close()
    show("probe.run", res)
    hidden = os.environ.get("CUDA_VISIBLE_DEVICES") is not None
    for g in gpus:
        r = res["gpus"][str(g["index"])]
        if hidden and r["state"] == "hidden":
            continue
        assert r["state"] == "ok", r
        assert isinstance(r["cuda_ordinal"], int) and 0 < r["seconds"] < probe.DEADLINE_S
    assert res["released_s"] is not None  # NVML stopped listing the probe's child before run() returned


def test_verify_probe_through_the_agent_exits_0_and_reads_the_fabric():
    host = build_host("local", {"PYTHON": sys.executable}, "test")
    req = requests.Verify(wait=10.0, probe_mib=64)
    result = call_agent(host, req)
    doc = result.doc
    show("verify --probe", {"exit": result.code, "probe": doc.get("probe"),
                            "gpus": [{k: g.get(k) for k in ("index", "uuid", "probe", "fabric", "health")}
                                     for g in doc["gpus"]]})
    if not doc["free"]:
        pytest.skip("the GPUs are not free here: the probe is not run on a GPU in use")
    assert result.code == 0, doc["problems"]
    for g in doc["gpus"]:
        assert g["fabric"]["state"] in ("completed", "not supported"), g["fabric"]
        assert g["probe"]["state"] in ("ok", "hidden"), g["probe"]
    # a scan right after the probe does not see its context
    after = call_agent(host, requests.Scan()).doc
    assert not any(p["pid"] == doc["probe"]["pid"] for g in after["gpus"] for p in g["processes"])
