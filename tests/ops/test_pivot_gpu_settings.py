"""A pivot puts the GPU settings back to the host's baseline after its teardown and sets the
next phase's before it starts (issue 44, item 3), only where hosts.env opts in; the real CLI,
a real phase process, the STAND-IN NVML for the GPUs (their settings are never changed on a
real GPU): the exact set calls in order, the audit records, and a failed write starting
nothing."""
from __future__ import annotations

import json
import os

from tests.agent.gpu.test_health import H200
from tests.conftest import invoke
from tests.ops.test_pivot import local_env, out_text
from tests.support.gpu_standins import STANDIN

LEFT = {"persistence": 1, "compute_mode": 3, "app_clocks": [1980, 3201], "power_limit_mw": 450000,
        "power_default_mw": 700000}  # what the last phase left: exclusive process, 450 W
BASELINE = '{"compute_mode": "default", "power_limit_w": 700}'


def setup(ps, hosts_env, tmp_path, apply="yes", fail=()):
    rec = tmp_path / "rec.json"
    gpus = [dict(H200, **LEFT, uuid=f"GPU-{i}", bus=f"00000000:{0x19 + i:02x}:00.0") for i in range(2)]
    gpus[1]["fail"] = list(fail)
    rec.write_text(json.dumps({"gpus": gpus, "calls_log": str(tmp_path / "calls.jsonl"), "write_back": True}))
    marker = tmp_path / "started"
    path = local_env(ps, hosts_env, {"train": {"CMD": f"touch {marker}; exec sleep 60", "READY": "alive",
                                               "GPU_SETTINGS": '{"power_limit_w": 500}'}})
    with open(path, "a") as f:
        f.write(f"LOCAL_GPU_BASELINE='{BASELINE}'\n" + (f"LOCAL_GPU_APPLY_SETTINGS={apply}\n" if apply else ""))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(STANDIN), os.environ.get("PYTHONPATH", "")]),
           "GPU_PIVOT_NVML_RECORDING": str(rec)}
    return env, marker


def calls(tmp_path):
    path = tmp_path / "calls.jsonl"
    return [(c["gpu"], c["call"], c["args"]) for c in map(json.loads, path.read_text().splitlines())] \
        if path.exists() else []


def pivot(env):
    return invoke("pivot", "--host", "local", "--to", "train", "--yes", env=env)


def test_the_baseline_is_put_back_then_the_phases_settings_set_and_each_change_audited(ps, hosts_env, tmp_path):
    env, marker = setup(ps, hosts_env, tmp_path)
    try:
        res = pivot(env)
        text = out_text(res)
        assert res.returncode == 0, text
        made = calls(tmp_path)
        baseline, phase = made[:4], made[4:]
        assert sorted(baseline) == sorted([(g, "nvmlDeviceSetComputeMode", [0]) for g in (0, 1)]
                                          + [(g, "nvmlDeviceSetPowerManagementLimit", [700000]) for g in (0, 1)])
        assert sorted(phase) == [(g, "nvmlDeviceSetPowerManagementLimit", [500000]) for g in (0, 1)]
        assert "baseline: 4 set, 0 already right (2 GPUs)" in text and "settings: 2 set" in text
        assert "GPU 1 power limit: 450 W -> 700 W" in text and "GPU 1 power limit: 700 W -> 500 W" in text
        assert text.index("teardown:") < text.index("baseline:") < text.index("settings:") < text.index("start:")
        audit = json.loads(invoke("audit", "--json", "--lines", "200").stdout)
        changes = [(r["gpu"], r["field"], r["before"], r["after"]) for r in audit if r.get("event") == "gpu-setting"]
        assert changes[-6:-2] and set(changes[-6:]) == {
            (0, "compute_mode", "exclusive_process", "default"), (1, "compute_mode", "exclusive_process", "default"),
            (0, "power_limit_w", 450, 700), (1, "power_limit_w", 450, 700),
            (0, "power_limit_w", 700, 500), (1, "power_limit_w", 700, 500)}
        status = " ".join(invoke("status", "--host", "local", env=env).stdout.decode().split())
        assert "*: differs from LOCAL_GPU_BASELINE and phase train's GPU_SETTINGS (the last pivot's)" in status
        assert "differs from LOCAL_GPU_BASELINE and phase train's GPU_SETTINGS (the last pivot's):" not in status
        rec = json.loads((tmp_path / "rec.json").read_text())
        rec["gpus"][1]["power_limit_mw"] = 700000  # someone set the baseline's limit while the phase runs
        (tmp_path / "rec.json").write_text(json.dumps(rec))
        status = " ".join(invoke("status", "--host", "local", env=env).stdout.decode().split())
        assert "GPU 1 differs from LOCAL_GPU_BASELINE and phase train's GPU_SETTINGS (the last pivot's): power " \
               "limit 700 W (phase train 500 W)" in status
    finally:
        invoke("stop", "--host", "local", "--phase", "train")


def test_a_failed_write_names_gpu_and_field_and_starts_nothing(ps, hosts_env, tmp_path):
    env, marker = setup(ps, hosts_env, tmp_path, fail=["nvmlDeviceSetPowerManagementLimit"])
    res = pivot(env)
    text = out_text(res)
    assert res.returncode == 5, text
    assert "GPU 1 power limit: FAILED (wanted 700 W, reads 450 W): nvmlDeviceSetPowerManagementLimit: Unknown " \
           "Error" in text
    assert "GPU settings (LOCAL_GPU_BASELINE) not set: nothing started" in text
    assert not marker.exists()


def test_without_the_hosts_opt_in_nothing_is_set(ps, hosts_env, tmp_path):
    env, marker = setup(ps, hosts_env, tmp_path, apply=None)
    dry = invoke("pivot", "--host", "local", "--to", "train", "--dry-run", env=env)
    assert "baseline: not set: LOCAL_GPU_APPLY_SETTINGS is not yes" in out_text(dry)
    try:
        res = pivot(env)
        assert res.returncode == 0, out_text(res)
        assert calls(tmp_path) == [] and marker.exists()
    finally:
        invoke("stop", "--host", "local", "--phase", "train")
