"""Each GPU's settings (persistence, compute mode, application clocks, power limit and its
default, MIG mode), read through the STAND-IN NVML (tests/support/standin/nvml): the values a
GPU gives, and None (never 0) for a field NVML does not support or whose call fails.

The healthy values are an H200's as NVML gives them (persistence on, compute mode default,
power limit 700 W of a 700 W default, MIG off); the clocks, the lowered limit and the other
modes are chosen by each test.
"""
from __future__ import annotations

from scripts.agent.gpu import checkup, settings
from tests.agent.gpu.test_health import H200, nvml
from tests.support.gpu_standins import agent

SET = {"persistence": 1, "compute_mode": 0, "app_clocks": [1980, 3201], "power_limit_mw": 700000,
       "power_default_mw": 700000}


def test_the_settings_nvml_gives_are_read():
    _, source = nvml({"gpus": [dict(H200, **SET), dict(H200, **dict(SET, persistence=0, compute_mode=3,
                                                                   power_limit_mw=450500, mig_mode=[1, 1]))]})
    read = settings.read_all(source)
    assert read[0] == {"persistence": "on", "compute_mode": "default", "graphics_clock_mhz": 1980,
                       "memory_clock_mhz": 3201, "power_limit_w": 700, "power_default_w": 700, "mig": "off",
                       "not_supported": [], "unread": {}}
    assert (read[1]["persistence"], read[1]["compute_mode"], read[1]["power_limit_w"], read[1]["mig"]) == (
        "off", "exclusive_process", 450.5, "on")


def test_a_setting_nvml_does_not_support_is_none_and_named_never_zero():
    gpu = dict(H200, persistence=1, mig_mode="not supported")  # no clocks, no power readings recorded
    _, source = nvml({"gpus": [gpu]})
    st = settings.read_all(source)[0]
    assert st["persistence"] == "on"
    for field in ("compute_mode", "graphics_clock_mhz", "memory_clock_mhz", "power_limit_w", "power_default_w", "mig"):
        assert st[field] is None, field
    assert st["not_supported"] == ["compute_mode", "graphics_clock_mhz", "memory_clock_mhz", "power_limit_w",
                                   "power_default_w", "mig"]
    assert st["unread"] == {}


def test_a_failing_call_is_unread_for_that_gpu_and_field_only():
    bad = dict(H200, **SET, fail=["nvmlDeviceGetPowerManagementLimit"])
    _, source = nvml({"gpus": [bad, dict(H200, **SET)]})
    read = settings.read_all(source)
    assert read[0]["power_limit_w"] is None and "power_limit_w" in read[0]["unread"]
    assert read[0]["power_default_w"] == 700 and read[0]["persistence"] == "on"
    assert read[1]["power_limit_w"] == 700 and read[1]["unread"] == {}


def test_no_nvml_no_settings():
    doc = {"gpus": [{"index": 0}]}
    checkup.annotate_settings(doc, type("Fake", (), {"name": "sandbox (fake GPUs)"})())
    assert "settings" not in doc["gpus"][0]


def test_the_scan_document_carries_each_gpus_settings(tmp_path):
    """`scan --json` (what `invoke status` reads): the settings in each GPU's row."""
    code, doc = agent("scan", "--devices", str(tmp_path / "nvidia*"), "--fake-devices",
                      recording={"gpus": [dict(H200, **SET), H200]}, tmp=tmp_path)
    assert doc["gpu_source"] == "nvml"
    assert doc["gpus"][0]["settings"]["power_limit_w"] == 700
    assert doc["gpus"][0]["settings"]["compute_mode"] == "default"
    assert doc["gpus"][1]["settings"]["power_limit_w"] is None
    assert "power_limit_w" in doc["gpus"][1]["settings"]["not_supported"]
