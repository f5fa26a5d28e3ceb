"""`invoke status` shows each GPU's settings as NVML reads them (the STAND-IN NVML here:
tests/support/standin/nvml), "n/a" where NVML does not support one, and marks what differs
from the host's baseline (hosts.env ALIAS_GPU_BASELINE); a bad baseline is one line, exit 2.
At 80 columns, as every screen."""
from __future__ import annotations

import json
import os

from tests.agent.gpu.test_health import H200
from tests.conftest import invoke
from tests.support.gpu_standins import STANDIN
from tests.support.task_help import columns

SET = {"persistence": 1, "compute_mode": 0, "app_clocks": [1980, 3201], "power_limit_mw": 700000,
       "power_default_mw": 700000}
BASELINE = '{"persistence": "on", "compute_mode": "default", "power_limit_w": 700}'


def status(tmp_path, gpus, baseline=None):
    recording = tmp_path / "rec.json"
    recording.write_text(json.dumps({"gpus": gpus}))
    hosts = tmp_path / "hosts.env"
    hosts.write_text(f"LOCAL_GPU_BASELINE='{baseline}'\n" if baseline else "")
    env = dict(columns(80), PYTHONPATH=os.pathsep.join([str(STANDIN), os.environ.get("PYTHONPATH", "")]),
               GPU_PIVOT_NVML_RECORDING=str(recording), GPU_PIVOT_HOSTS_FILE=str(hosts))
    out = invoke("status", "--host", "local", env=env)
    text = out.stdout.decode()
    assert all(len(line) <= 80 for line in text.splitlines()), text
    return out.returncode, text, out.stderr.decode()


def settings_rows(text):
    """{gpu: cells} of the GPU settings table."""
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.split()[:2] == ["gpu", "persist"])
    rows = {}
    for line in lines[at + 2:]:
        cells = line.split()
        if not cells or not cells[0].isdigit():
            break
        rows[cells[0]] = cells[1:]
    return rows


def test_status_shows_each_gpus_settings_and_na_where_not_supported(tmp_path):
    bare = dict(H200, mig_mode="not supported")  # NVML supports none of the settings on it
    code, text, err = status(tmp_path, [dict(H200, **SET), bare])
    assert code == 0, err
    assert "GPU settings" in text
    rows = settings_rows(text)
    assert rows["0"] == ["on", "default", "1980/3201", "700/700", "off"]
    assert rows["1"] == ["n/a", "n/a", "n/a", "n/a", "n/a"]
    assert "differs" not in text and "*" not in "".join(" ".join(r) for r in rows.values())


def test_status_marks_what_differs_from_the_baseline(tmp_path):
    drifted = dict(H200, **dict(SET, persistence=0, compute_mode=3, power_limit_mw=500000))
    code, text, err = status(tmp_path, [dict(H200, **SET), drifted], BASELINE)
    assert code == 0, err
    rows = settings_rows(text)
    assert rows["0"] == ["on", "default", "1980/3201", "700/700", "off"]
    assert rows["1"] == ["off*", "exclusive_process*", "1980/3201", "500*/700", "off"]
    said = " ".join(text.split())
    assert ("GPU 1 differs from LOCAL_GPU_BASELINE: persistence off (baseline on); compute mode exclusive_process "
            "(baseline default); power limit 500 W (baseline 700 W)") in said
    assert "GPU 0 differs" not in said


def test_status_with_every_gpu_as_the_baseline_says_no_drift(tmp_path):
    code, text, err = status(tmp_path, [dict(H200, **SET), dict(H200, **SET)], BASELINE)
    assert code == 0, err
    assert "*: differs from LOCAL_GPU_BASELINE" in " ".join(text.split())
    assert "differs from LOCAL_GPU_BASELINE:" not in " ".join(text.split())
    assert all("*" not in c for r in settings_rows(text).values() for c in r)


def test_a_baseline_setting_nvml_cannot_read_is_not_confirmed(tmp_path):
    code, text, err = status(tmp_path, [dict(H200, persistence=1)], BASELINE)
    assert code == 0, err
    said = " ".join(text.split())
    assert "GPU 0 differs from LOCAL_GPU_BASELINE: compute mode n/a (baseline default: not confirmed)" in said


def test_a_bad_baseline_is_one_line_naming_the_key_exit_2(tmp_path):
    for bad, why in (('{"persistence": "yes"}', 'persistence must be on or off, not "yes"'),
                     ('{"power_limit_w": "700"}', 'power_limit_w must be a positive number (W), not "700"'),
                     ('{"powerlimit": 700}', "unknown setting 'powerlimit'"),
                     ("on", "not a JSON object of GPU settings")):
        code, text, err = status(tmp_path, [dict(H200, **SET)], bad)
        assert code == 2, (bad, err)
        assert err.count("\n") == 1 and err.startswith(f"gpu-pivot: LOCAL_GPU_BASELINE='{bad}': {why}"), err
        assert str(tmp_path / "hosts.env") + ":1" in err
        assert text == ""
