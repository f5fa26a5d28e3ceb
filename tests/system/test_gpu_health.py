"""GPU health and CUDA MPS on real NVIDIA GPUs. `pytest -m gpu` on the GPU machine; skipped
cleanly (with the reason) wherever NVML sees no GPU, as in CI.

Prints the NVML answers behind each verdict and the MPS states (run with -s: a GPU session's
notes paste them). Every teardown is scoped to a token only the test's own
processes carry (its torch tree's command line, its MPS daemon's pipe directory).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from scripts.agent.gpu import mps
from scripts.agent.procs import procfs, procscan
from scripts.agent.wire import requests
from scripts.config.hostconfig import build_host
from scripts.reach.transport import call_agent
from tests.support.gpu_support import GpuTree, gpu_count
from tests.support.procs import wait_for

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(gpu_count() == 0, reason="no NVIDIA GPU visible through NVML")]


def local_host(token):
    return build_host("local", {"PYTHON": sys.executable, "TARGETS": r"gpu_tree\.py|mps_client\.py",
                                "SCOPE": token}, "test")


def show(title, value):
    print(f"\n## {title}\n{json.dumps(value, indent=1, sort_keys=True, default=str)}", flush=True)


def health_of(doc, key="gpus"):
    return [{"gpu": g["index"], **g["health"]} for g in doc[key]]


def test_verify_json_says_ok_per_gpu_with_the_nvml_answers_behind_it(tmp_path):
    host = local_host(f"gpupivot-health-{os.getpid()}")
    result = call_agent(host, requests.Verify(wait=10))
    doc = result.doc
    show("verify --json: health per GPU", health_of(doc))
    assert doc["gpu_source"] == "nvml"
    assert result.code == 0, doc["problems"]
    for g in doc["gpus"]:
        h = g["health"]
        assert h["verdict"] == "ok", h
        assert "recovery action 0" in h["read"]
        assert any(r.startswith("remapped rows 0 correctable, 0 uncorrectable, pending False, failure False")
                   for r in h["read"]), h["read"]
    reset = call_agent(host, requests.Reset(gpu=0))
    show("reset --gpu 0 (dry run): preconditions", reset.doc["checks"])
    assert reset.code == 0 and reset.doc["ready"] and not reset.doc["ran"], reset.doc["checks"]
    scan = call_agent(host, requests.Scan()).doc
    show("status: MIG per GPU", [{"gpu": g["index"], **g.get("mig", {})} for g in scan["gpus"]])
    assert all(g["mig"]["current"] in ("disabled", "enabled", "not supported") for g in scan["gpus"])


def test_teardown_ends_with_health_from_nvml_xid_events(tmp_path):
    token = f"gpupivot-health-{os.getpid()}-teardown"
    tree = GpuTree(tmp_path, token, children=1, gib=1)
    try:
        result = call_agent(local_host(token), requests.Teardown(grace=5, timeout=30))
        doc = result.doc
        show("teardown: health per GPU (after)", health_of(doc, "after"))
        assert result.code == 0, doc["problems"]
        assert tree.alive() == []
        for g in doc["after"]:
            assert g["health"]["verdict"] == "ok", g["health"]
            assert "NVML Xid events since the teardown started" in g["health"]["read"] or any(
                r.startswith("kernel log") for r in g["health"]["read"]), g["health"]["read"]
    finally:
        tree.kill()


CLIENT = """
import os, sys, time, torch
x = torch.ones(64 * 2**20, device="cuda:0")  # 256 MiB through the MPS server
torch.cuda.synchronize()
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(str(os.getpid()))
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(3600)
"""


def _daemons(pipe_dir):
    out = []
    for pid in procscan.all_pids():
        info = procscan.basic(pid)
        if info and mps.is_control(info) and mps.pipe_dir(pid) == pipe_dir:
            out.append(pid)
    return out


def _servers():
    return [p for p in procscan.all_pids() if (procscan.basic(p) or {}).get("argv") and mps.is_server(
        procscan.basic(p) or {})]


@pytest.fixture
def mps_daemon(tmp_path):
    if not subprocess.run(["sh", "-c", "command -v nvidia-cuda-mps-control"], capture_output=True).returncode == 0:
        pytest.skip("nvidia-cuda-mps-control is not installed")
    if _servers() or any(mps.is_control(procscan.basic(p) or {}) for p in procscan.all_pids()):
        pytest.skip("another CUDA MPS daemon runs on this machine: this test quits only its own")
    token = f"gpupivot-mps-{os.getpid()}"
    pipe = tmp_path / token
    logs = tmp_path / "mps-log"
    pipe.mkdir(mode=0o700)
    logs.mkdir()
    env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=str(pipe), CUDA_MPS_LOG_DIRECTORY=str(logs))
    subprocess.run(["nvidia-cuda-mps-control", "-d"], env=env, check=True, timeout=30)
    daemons = wait_for(lambda: _daemons(str(pipe)), "the MPS control daemon")
    starts = {p: procfs.start_time(p) for p in daemons}
    yield token, pipe, env, daemons[0]
    if any(procfs.same_process(p, s) for p, s in starts.items()):  # the test failed before --mps quit
        subprocess.run(["nvidia-cuda-mps-control"], input=b"quit\n", env=env, timeout=30)


def test_mps_server_with_a_live_client_then_none_then_mps_quit(tmp_path, mps_daemon):
    token, pipe, env, daemon = mps_daemon
    host = local_host(token)
    ready = tmp_path / "client.ready"
    script = tmp_path / "mps_client.py"
    script.write_text(CLIENT)
    client = subprocess.Popen([sys.executable, str(script), str(ready), token], env=env, start_new_session=True)
    try:
        wait_for(lambda: ready.exists() or client.poll() is not None, "the torch client under MPS", timeout=300)
        assert client.poll() is None, "the MPS client failed"
        doc = call_agent(host, requests.Scan()).doc
        show("status with a live client: mps", doc.get("mps"))
        servers = doc["mps"]["servers"]
        assert len(servers) == 1 and servers[0]["control"] == daemon
        assert client.pid in [c["pid"] for c in servers[0]["clients"]], servers[0]
        protected = {h["pid"]: h["protected"] for h in doc["holders"]}
        assert "CUDA MPS server" in (protected.get(servers[0]["pid"]) or "")
    finally:
        client.send_signal(signal.SIGKILL)
        client.wait(30)
    server, server_start = servers[0]["pid"], servers[0]["start_time"]
    wait_for(lambda: client.pid not in [p["pid"] for g in call_agent(host, requests.Scan()).doc["gpus"]
                                        for p in g["processes"]], "the client to leave NVML's list", timeout=30)
    doc = call_agent(host, requests.Scan()).doc
    show("status with no client: mps", doc.get("mps"))
    assert doc["mps"]["servers"][0]["clients"] == []
    result = call_agent(host, requests.Verify())
    show("verify with an idle MPS server: problems", result.doc["problems"])
    assert result.code == 1 and any(f"MPS server pid {server} keeps" in p and "no client" in p
                                    for p in result.doc["problems"])
    assert not any(f"pid {daemon} " in p for p in result.doc["problems"]), "the daemon itself holds no memory"
    result = call_agent(host, requests.Teardown(grace=1, timeout=2, settle=0.5))
    show("teardown (default: MPS protected): problems", result.doc["problems"])
    assert result.code == 1 and procfs.same_process(server, server_start), "protected by default"
    assert result.doc["mps_quit"] == []
    t0 = time.monotonic()
    result = call_agent(host, requests.Teardown(grace=1, timeout=30, mps_quit=True))
    show("teardown --mps quit: mps_quit, health", {"mps_quit": result.doc["mps_quit"],
                                                    "health": health_of(result.doc, "after"),
                                                    "wall_s": round(time.monotonic() - t0, 3)})
    assert result.code == 0, result.doc["problems"]
    q = result.doc["mps_quit"]
    assert len(q) == 1 and q[0]["control"] == daemon and q[0]["sent"] and q[0]["servers_gone"], q
    assert not _servers() and not _daemons(str(pipe)), (_servers(), _daemons(str(pipe)))
    assert all(g["health"]["verdict"] == "ok" for g in result.doc["after"]), health_of(result.doc, "after")
