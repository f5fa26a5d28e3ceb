"""The CUDA probe (verify --probe, a pivot's probe step) and the NVLink fabric state, on this
machine (no GPU).

What cannot exist here is CUDA and NVML: a STAND-IN libcuda.so.1 (tests/support/cuda, built
with gcc by the test, with the real signatures) is loaded through the probe's real ctypes
path in its real forked child, and the stand-in NVML replays the recorded healthy H200
answers; which call fails with which code, the UUIDs in CUDA's order and a hang are set by
each test. The agent is the real one, run as a subprocess; device files are the test's own.
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from scripts.agent import cli
from scripts.agent.gpu import health, probe
from scripts.agent.holders import scan
from scripts.agent.wire import codes
from scripts.ops.pivot import Pivot, PivotOptions
from scripts.views import health as health_view
from tests.agent.gpu.test_health import H200, nvml
from tests.support.cuda import standin
from tests.support.procs import wait_for

TWO = [dict(H200, uuid=standin.nvml_uuid(0), bus="00000000:19:00.0"),
       dict(H200, uuid=standin.nvml_uuid(1), bus="00000000:3b:00.0")]
REVERSED = ["uuid " + standin.uuid_hex(1), "uuid " + standin.uuid_hex(0)]  # CUDA's order: NVML's GPU 1 first


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    return standin.build(tmp_path_factory.mktemp("cuda"))


@pytest.fixture
def in_process(lib, monkeypatch, tmp_path):
    """The probe in this process pointed at the stand-in; returns the control-file writer."""
    monkeypatch.setattr(probe, "LIBCUDA", str(lib))

    def write(lines):
        for k, v in standin.control(tmp_path / "cuda-control", lines).items():
            monkeypatch.setenv(k, v)
    return write


def verify_probe(lib, ps, tmp_path, gpus, lines, *extra):
    env = standin.control(tmp_path / "cuda-control", lines)
    return standin.probe_agent(lib, tmp_path, {"gpus": gpus}, env, "verify", "--devices=" + ps.glob,
                               "--fake-devices", "--run-dir=" + str(tmp_path / "run"), "--probe", *extra)


def test_gpus_are_matched_by_uuid_when_cuda_order_is_reversed(in_process, tmp_path):
    log = tmp_path / "calls"
    in_process(REVERSED + ["fail cuCtxCreate_v2 214 0", "log %s" % log])  # CUDA device 0 = NVML's GPU 1
    gpus = [{"index": 0, "uuid": standin.nvml_uuid(0)}, {"index": 1, "uuid": standin.nvml_uuid(1)}]
    res = probe.run(gpus, 8)
    assert res["gpus"]["0"]["state"] == "ok" and res["gpus"]["0"]["cuda_ordinal"] == 1
    assert res["gpus"]["1"] == dict(res["gpus"]["1"], state="failed", cuda_ordinal=0, code=214, call="cuCtxCreate_v2")
    assert "CUDA_ERROR_ECC_UNCORRECTABLE (214)" in res["gpus"]["1"]["error"]
    calls = log.read_text().split("\n")
    assert "cuMemsetD8_v2 1" in calls and "cuCtxSynchronize 1" in calls and "cuCtxDestroy_v2 1" in calls
    assert "cuMemFree_v2 1" in calls and "cuMemAlloc_v2 0" not in calls  # the failed context allocated nothing


def test_a_gpu_cuda_does_not_list_is_said_not_guessed(in_process, monkeypatch):
    in_process(["uuid " + standin.uuid_hex(0)])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    res = probe.run([{"index": 0, "uuid": standin.nvml_uuid(0)}, {"index": 1, "uuid": standin.nvml_uuid(1)}], 8)
    assert res["gpus"]["0"]["state"] == "ok"
    assert res["gpus"]["1"]["state"] == "hidden" and "CUDA_VISIBLE_DEVICES=0" in res["gpus"]["1"]["error"]


def test_a_failed_probe_exits_9_with_cudas_error_and_nvmls_reason(lib, ps, tmp_path):
    code, doc = verify_probe(lib, ps, tmp_path, TWO, REVERSED + ["fail cuMemAlloc_v2 214 0"])
    assert code == codes.EXIT_UNHEALTHY == doc["exit_code"], doc
    assert doc["free"] is True and doc["gpus"][0]["health"]["verdict"] == "ok"
    bad = doc["gpus"][1]["health"]
    assert bad["verdict"] == "reset needed"
    why = " ".join(bad["reasons"])
    assert "CUDA probe failed: cuMemAlloc_v2: CUDA_ERROR_ECC_UNCORRECTABLE (214)" in why
    assert "NVML read: recovery action 0" in why and doc["gpus"][1]["fabric"]["state"] == "not supported"
    assert any("GPU 1: RESET NEEDED" in p for p in doc["problems"])


def test_error_802_is_not_ready(lib, ps, tmp_path):
    code, doc = verify_probe(lib, ps, tmp_path, TWO, REVERSED + ["fail cuInit 802"])
    assert code == codes.EXIT_UNHEALTHY
    for g in doc["gpus"]:
        assert g["health"]["verdict"] == "not ready" and "CUDA_ERROR_SYSTEM_NOT_READY (802)" in g["probe"]["error"]


def test_a_passing_probe_exits_0_and_is_timed(lib, ps, tmp_path):
    code, doc = verify_probe(lib, ps, tmp_path, TWO, REVERSED, "--probe-mib", "16")
    assert code == 0, doc
    assert [g["probe"]["state"] for g in doc["gpus"]] == ["ok", "ok"]
    assert all(isinstance(g["probe"]["seconds"], float) for g in doc["gpus"]) and doc["probe"]["size_mib"] == 16


def test_a_hung_driver_call_is_bounded_and_reads_reboot(in_process):
    in_process(REVERSED + ["hang cuMemsetD8_v2 0"])
    gpus = [dict(TWO[0], index=0), dict(TWO[1], index=1)]
    res = probe.run(gpus, 8, deadline_s=1.0)
    assert res["gpus"]["0"]["state"] == "ok" and res["gpus"]["1"]["state"] == "hung"
    assert not os.path.exists("/proc/%d" % res["pid"])  # SIGKILLed and reaped: nothing left behind
    _, source = nvml({"gpus": TWO})
    health.assess(gpus, source, probe=res)
    assert gpus[1]["health"]["verdict"] == "reboot needed" and gpus[0]["health"]["verdict"] == "ok"


def test_fabric_not_supported_is_said_and_goes_on():
    gpus = [dict(TWO[0], index=0)]
    _, source = nvml({"gpus": TWO[:1]})
    health.assess(gpus, source)
    assert gpus[0]["fabric"]["state"] == "not supported" and gpus[0]["health"]["verdict"] == "ok"
    assert health.exit_code(0, gpus) == 0
    doc = {"command": "scan", "exit_code": 0, "gpus": gpus, "hostname": "h", "holders": [], "gpu_source": "nvml"}
    assert "not supported on these GPUs" in health_view.fabric(doc)


@pytest.mark.parametrize("fab,words", [([2, 0], "in progress"), ([1, 0], "not started"), ([3, 999], "Unknown Error")])
def test_a_fabric_not_completed_is_not_ready(fab, words):
    gpus = [dict(TWO[0], index=0)]
    _, source = nvml({"gpus": [dict(TWO[0], fabric=fab)]})
    health.assess(gpus, source)
    assert gpus[0]["health"]["verdict"] == "not ready" and words in " ".join(gpus[0]["health"]["reasons"])
    assert health.exit_code(0, gpus) == codes.EXIT_UNHEALTHY


def test_a_fabric_in_progress_blocks_the_pivot(ps, hosts_env, tmp_path, monkeypatch):
    from tests.conftest import invoke
    from tests.ops.test_pivot import local_env, out_text

    marker = tmp_path / "started"
    local_env(ps, hosts_env, {"train": {"CMD": f"touch {marker}; sleep 60"}})
    rec = tmp_path / "rec.json"
    rec.write_text('{"gpus": [%s]}' % __import__("json").dumps(dict(TWO[0], fabric=[2, 0])))
    env = dict(os.environ, PYTHONPATH=str(standin.STANDIN), GPU_PIVOT_NVML_RECORDING=str(rec))
    res = invoke("pivot", "--host", "local", "--to", "train", "--yes", env=env)
    text = out_text(res)
    assert res.returncode == codes.EXIT_UNHEALTHY, text
    assert "in progress" in text and "nothing started" in text
    assert not marker.exists()


def test_the_probes_own_context_is_never_a_holder(in_process, ps, tmp_path):
    dev = ps.glob.replace("*", "0")
    ready, go = tmp_path / "in-alloc", tmp_path / "go"
    in_process(["uuid " + standin.uuid_hex(0), "open " + dev, "pause cuMemAlloc_v2 %s %s" % (ready, go)])
    box = {}
    t = threading.Thread(target=lambda: box.update(res=probe.run([{"index": 0, "uuid": standin.nvml_uuid(0)}], 8)))
    t.start()
    other = subprocess.Popen([sys.executable, "-c", "import sys,time; f=open(sys.argv[1]); open(sys.argv[2],'w')"
                              ".close(); time.sleep(600)", dev, str(tmp_path / "other")])
    try:
        wait_for(ready.exists, "the probe's child in cuMemAlloc, holding the device")
        wait_for((tmp_path / "other").exists, "the other process holding the device")
        child = next(iter(probe.procfs.OWN_PROBES))
        assert os.path.exists("/proc/%d" % child)
        doc = scan.collect(cli.parse(["scan", "--devices=" + ps.glob, "--fake-devices"]).selection)
        pids = {h["pid"] for h in doc["holders"]}
        assert other.pid in pids  # the same device held by any other process is a holder
        assert child not in pids
    finally:
        go.touch()
        t.join()
        other.kill()
        other.wait()
    assert box["res"]["gpus"]["0"]["state"] == "ok" and not probe.procfs.OWN_PROBES


def test_the_pivot_lists_the_probe_step_after_the_teardown():
    from scripts.cli.pivot_words import WORDS
    from scripts.config.hosts import load

    host = load()["sandbox"]
    steps = [name for name, _, _ in Pivot(host, host.phases["train"], PivotOptions(), WORDS, out=lambda _: None).steps]
    assert steps[:3] == ["teardown", "baseline", "probe"]  # the probe sees the GPUs as the baseline set them
    assert steps.index("probe") < steps.index("settings") < steps.index("start")


@pytest.mark.parametrize("value", ["0", "abc", "65537", "-1", "1.5"])
def test_a_bad_probe_size_in_hosts_env_is_one_line_exit_2(hosts_env, value):
    from tests.conftest import invoke

    hosts_env(f"GPU1_SSH=root@192.0.2.1\nGPU1_PROBE_MIB={value}\n")
    res = invoke("verify", "--host", "gpu1", "--probe")
    err = res.stderr.decode()
    assert res.returncode == 2 and f"GPU1_PROBE_MIB='{value}'" in err and len(err.strip().splitlines()) == 1, err


def test_the_probe_size_reaches_the_agent(hosts_env):
    from scripts.agent.wire import requests
    from scripts.config.hosts import load

    hosts_env("GPU1_SSH=root@192.0.2.1\nGPU1_PROBE_MIB=256\n")
    host = load()["gpu1"]
    assert host.probe_mib == 256 and load()["local"].probe_mib == 64
    assert requests.Verify(probe_mib=host.probe_mib).argv()[-3:] == ["--probe", "--probe-mib", 256]
    assert "--probe" not in requests.Verify().argv()
