"""Setting GPU settings (issue 44, item 3): the real agent, run as a subprocess, against the
STAND-IN NVML (no GPU here, and the GPU machine's settings must never be changed): the exact
NVML set calls and values, one thread per GPU whose calls overlap in time (the stand-in's set
call sleeps, and logs its start and end), nothing written where the GPU already reads right,
and every change an audit record with its value before and after."""
from __future__ import annotations

import json
import os

from scripts.agent.wire import codes, records
from tests.support.gpu_standins import agent

GPU = {"uuid": "GPU-0", "name": "NVIDIA H200", "bus": "00000000:19:00.0", "used": 0, "total": 150754820096,
       "processes": [], "persistence": 1, "compute_mode": 0, "app_clocks": [1980, 3201], "power_limit_mw": 700000,
       "power_default_mw": 700000, "mig_mode": [0, 0]}


def gpus(n, **changes):
    return [dict(GPU, uuid="GPU-%d" % i, bus="00000000:%02x:00.0" % (0x19 + i), **changes) for i in range(n)]


def calls(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def host_audit():
    path = os.path.join(os.environ["GPU_PIVOT_RUN_DIR"], "audit.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f]


def test_each_gpu_is_set_in_its_own_thread_at_the_same_time(tmp_path):
    log = tmp_path / "calls.jsonl"
    rec = {"gpus": gpus(4, power_limit_mw=500000, compute_mode=3), "calls_log": str(log), "set_delay_s": 0.3}
    want = {"power_limit_w": 700, "compute_mode": "default", "persistence": "on"}
    code, doc = agent("gpu-settings", "--settings", json.dumps(want), recording=rec, tmp=tmp_path)
    assert code == 0, doc
    made = calls(log)
    assert sorted((c["gpu"], c["call"], c["args"]) for c in made) == sorted(
        [(i, "nvmlDeviceSetComputeMode", [0]) for i in range(4)]
        + [(i, "nvmlDeviceSetPowerManagementLimit", [700000]) for i in range(4)])  # persistence already on
    assert len({c["thread"] for c in made}) == 4
    assert all(len({c["thread"] for c in made if c["gpu"] == i}) == 1 for i in range(4))  # a thread per GPU
    first = [min((c for c in made if c["gpu"] == i), key=lambda c: c["start"]) for i in range(4)]
    assert max(c["start"] for c in first) < min(c["end"] for c in first), "the GPUs' first writes did not overlap"
    rows = records.read("gpu-settings", code, doc).rows
    assert {(r["gpu"], r["field"], r["result"], r["before"], r["after"]) for r in rows} == (
        {(i, "power_limit_w", "set", 500, 700) for i in range(4)}
        | {(i, "compute_mode", "set", "exclusive_process", "default") for i in range(4)}
        | {(i, "persistence", "already", "on", "on") for i in range(4)})


def test_a_setting_already_right_is_not_written_and_not_audited(tmp_path):
    log = tmp_path / "calls.jsonl"
    rec = {"gpus": gpus(2), "calls_log": str(log)}
    code, doc = agent("gpu-settings", "--settings", json.dumps({"power_limit_w": 700, "persistence": "on"}),
                      "--operator", "unchanged-check", recording=rec, tmp=tmp_path)
    assert code == 0 and not log.exists(), doc
    assert {r["result"] for r in doc["rows"]} == {"already"}
    assert not [r for r in host_audit() if r.get("operator") == "unchanged-check"]


def test_clocks_are_one_call_and_every_change_is_audited_with_before_and_after(tmp_path):
    log = tmp_path / "calls.jsonl"
    rec = {"gpus": gpus(1, app_clocks=[1410, 2619]), "calls_log": str(log)}
    want = {"graphics_clock_mhz": 1980, "memory_clock_mhz": 3201, "persistence": "off"}
    code, doc = agent("gpu-settings", "--settings", json.dumps(want), "--operator", "alice", recording=rec,
                      tmp=tmp_path)
    assert code == 0, doc
    assert [(c["call"], c["args"]) for c in calls(log)] == [("nvmlDeviceSetPersistenceMode", [0]),
                                                            ("nvmlDeviceSetApplicationsClocks", [3201, 1980])]
    mine = [r for r in host_audit() if r.get("event") == "gpu-setting" and r.get("operator") == "alice"]
    assert {(r["field"], r["before"], r["after"], r["result"]) for r in mine[-3:]} == {
        ("persistence", "on", "off", "set"), ("graphics_clock_mhz", 1410, 1980, "set"),
        ("memory_clock_mhz", 2619, 3201, "set")}


def test_a_failed_write_names_the_gpu_field_and_error_and_exits_1(tmp_path):
    rec = {"gpus": gpus(2, power_limit_mw=500000)}
    rec["gpus"][1]["fail"] = ["nvmlDeviceSetPowerManagementLimit"]
    code, doc = agent("gpu-settings", "--settings", '{"power_limit_w": 700}', recording=rec, tmp=tmp_path)
    assert code == codes.EXIT_FAILED
    failed = [r for r in doc["rows"] if r["result"] == "FAILED"]
    assert [(r["gpu"], r["field"], r["after"]) for r in failed] == [(1, "power_limit_w", 500)]
    assert "nvmlDeviceSetPowerManagementLimit: Unknown Error" in failed[0]["error"]
    assert [r["result"] for r in doc["rows"] if r["gpu"] == 0] == ["set"]  # the other GPU is still set


def test_mig_is_compared_never_set_and_a_bad_value_is_refused_before_any_write(tmp_path):
    log = tmp_path / "calls.jsonl"
    rec = {"gpus": gpus(1), "calls_log": str(log)}
    code, doc = agent("gpu-settings", "--settings", '{"mig": "on"}', recording=rec, tmp=tmp_path)
    assert code == codes.EXIT_FAILED and "needs a GPU reset" in doc["rows"][0]["error"] and not log.exists()
    for bad, word in (('{"power_limit_w": -5}', "power_limit_w"), ('{"compute_mode": "shared"}', "compute_mode"),
                      ('{"fan": 1}', "fan"), ("[1]", "not a JSON object")):
        code, doc = agent("gpu-settings", "--settings", bad, recording=rec, tmp=tmp_path)
        assert code == codes.EXIT_USAGE and word in doc[codes.USAGE_ERROR], doc
    assert not log.exists()


def test_the_stand_ins_set_calls_take_what_nvidia_ml_pys_take():
    """The calls asserted above are the real package's: same names, same arguments in order."""
    import importlib.util
    import inspect

    import pynvml as real

    from tests.support.gpu_standins import STANDIN

    spec = importlib.util.spec_from_file_location("standin_pynvml_signatures", STANDIN / "pynvml.py")
    standin = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(standin)
    assert not getattr(real, "STANDIN", False), "the real nvidia-ml-py is not the one imported here"
    for name in ("nvmlDeviceSetPersistenceMode", "nvmlDeviceSetComputeMode", "nvmlDeviceSetApplicationsClocks",
                 "nvmlDeviceSetPowerManagementLimit"):
        assert len(inspect.signature(getattr(real, name)).parameters) == \
               len(inspect.signature(getattr(standin, name)).parameters), name
    assert list(inspect.signature(real.nvmlDeviceSetApplicationsClocks).parameters)[1:] == \
           ["maxMemClockMHz", "maxGraphicsClockMHz"]  # memory first, as settings_write passes them
    assert real.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS == 3 and real.NVML_FEATURE_ENABLED == 1
