"""The incidents' one-liners vs gpu-pivot on the same scenario, only inside a throwaway PID namespace."""
import json
import subprocess

import pytest

from tests.support import scenario
from tests.support.incident_replay import namespace_command, sequences


def _unshare_works():
    try:
        return subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"],
                              capture_output=True).returncode == 0
    except FileNotFoundError:
        return False


pytestmark = pytest.mark.skipif(not _unshare_works(), reason="needs unshare --pid (root or user namespaces); "
                                                              "the one-liners are never replayed outside one")


def replay(tmp_path, name):
    workdir = tmp_path / name.split()[0]
    workdir.mkdir()
    seq = sequences(workdir)[name]
    out = subprocess.run(namespace_command(workdir, seq), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_gpu_pivot_kills_targets_only(tmp_path):
    res = replay(tmp_path, "gpu-pivot")
    assert not any(res["alive"][r] for r in scenario.TARGET_ROLES)
    assert all(res["alive"][r] for r in scenario.BYSTANDER_ROLES)
    roles = json.loads((tmp_path / "gpu-pivot" / "roles.json").read_text())
    assert res["gpu_holders_left"] == sorted(p for r, p in roles.items() if r in ("persistenced", "monitor"))


def test_datagen_oneliner_from_a_script_kills_bystanders_and_leaves_helpers(tmp_path):
    res = replay(tmp_path, "datagen one-liner from a script file")
    assert not any(res["alive"][r] for r in scenario.BYSTANDER_ROLES)  # persistenced, monitor, unrelated: all killed
    assert res["alive"]["tokenizer"] and res["alive"]["group_helper"]  # no trees: non-GPU children live on
    assert res["wall_s"] >= 5.0  # the fixed sleeps
    assert res["gpu_holders_left"] == []


def test_datagen_oneliner_over_ssh_kills_its_own_shell_first(tmp_path):
    res = replay(tmp_path, "datagen one-liner as ssh sends it (bash -c)")
    # pkill -f "sglang.launch_server" matches the bash -c running the sequence and ends it at step 1:
    # killed by SIGTERM (128 + 15), before its sleeps, its kill -9 and its last echo
    assert res["rc"] == 143 and res["said"] != "Server killed", res
    assert res["alive"]["stubborn"] and res["alive"]["worker0"] and res["alive"]["orphan"] and res["alive"]["renamed"]
    assert len(res["gpu_holders_left"]) >= 5
