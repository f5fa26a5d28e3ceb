"""Pivots end to end on the sandbox and on test phases: a fake server answering /health and
/metrics on loopback, a job phase, a failing gate, a readiness timeout, a deploy rolled
back, datagen prep jobs reported; launch lint; the setsid path; systemd-run by argv."""
import json
import os
import re
import urllib.request
from pathlib import Path

import pytest

from scripts.agent.phases import run as agent_phase
from scripts.config.sandbox import ROLES
from tests.conftest import invoke
from tests.support.loopback_sshd import free_port
from tests.support.pivots import broken_deploy
from tests.support.procs import alive


def out_text(res):
    """stdout and stderr, each line's words joined by one space: a pivot's line is wrapped to
    the screen between words, and the words are what a test reads."""
    return " ".join((res.stdout.decode() + "\n" + res.stderr.decode()).split())


@pytest.fixture
def sandbox():
    assert invoke("sandbox", "up").returncode == 0
    yield
    invoke("sandbox", "down")


def test_sandbox_three_pivots_end_to_end(sandbox):
    up = json.loads(invoke("sandbox", "status", "--json").stdout)
    res = invoke("pivot", "--host", "sandbox", "--to", "datagen", "--yes")
    text = out_text(res)
    assert res.returncode == 0, text
    assert "drain: drained in" in text
    assert "3/3 preparation job(s) exited 0" in text
    assert not alive(up["processes"]["server"]["pid"])  # the EAGLE3 server was torn down
    _shm_left_removed_staged_kept(text)
    assert "GPU 0 power limit: 450 W -> 700 W" in text and "baseline: 4 set" in text  # the last job's drift undone
    assert alive(up["processes"]["persistenced"]["pid"]) and alive(up["processes"]["monitor"]["pid"])
    with urllib.request.urlopen(f"http://127.0.0.1:{up['ports']['datagen']}/health", timeout=5) as r:
        assert r.status == 200
    res = invoke("pivot", "--host", "sandbox", "--to", "train", "--yes")
    text = out_text(res)
    assert res.returncode == 0, text
    assert "at least 8 files match" in text and "ready after" in text
    assert "GPU 1 compute mode: default -> exclusive_process" in text and "settings: 4 set" in text  # the phase's
    res = invoke("pivot", "--host", "sandbox", "--to", "deploy", "--yes")
    text = out_text(res)
    assert res.returncode == 0, text
    assert "smoke: HTTP 200" in text
    assert "GPU 0 power limit: 600 W -> 700 W" in text  # training's settings put back to the baseline
    config = Path(os.environ["GPU_PIVOT_SANDBOX_DIR"]) / "server-code" / "server_config.json"
    assert '"dynamic_spec": true' in config.read_text()
    audit = json.loads(invoke("audit", "--json", "--lines", "200").stdout)
    assert [r["to"] for r in audit if r.get("event") == "pivot"][-3:] == ["datagen", "train", "deploy"]


def _shm_left_removed_staged_kept(text):
    """Each worker's NCCL-like /dev/shm segment is REMOVED once FREED, with its size; the
    weights staged in /dev/shm before the server started, and mapped by it, stay."""
    from scripts.ops import sandbox_shm

    tag = sandbox_shm.tag(Path(os.environ["GPU_PIVOT_SANDBOX_DIR"]))
    removed = re.findall(r"REMOVED /dev/shm/%s-nccl-\d+ \(1\.0 MiB, of pid \d+\)" % tag, text)
    assert len(removed) == 2, text
    assert os.path.getsize(f"/dev/shm/{tag}-weights") == sandbox_shm.STAGED_BYTES
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(tag + "-nccl-")]


def test_sandbox_down_removes_its_shared_memory_only(sandbox, tmp_path):
    """`sandbox down` unlinks this sandbox's tagged files, never another name or a link."""
    from scripts.ops import sandbox_shm

    tag = sandbox_shm.tag(Path(os.environ["GPU_PIVOT_SANDBOX_DIR"]))
    other = Path("/dev/shm") / f"{tag}x-not-ours"
    other.write_bytes(b"x")
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    link = Path("/dev/shm") / f"{tag}-link"
    link.symlink_to(victim)
    try:
        assert os.path.exists(f"/dev/shm/{tag}-weights")
        assert invoke("sandbox", "down").returncode == 0
        assert not [n for n in os.listdir("/dev/shm") if n.startswith(tag + "-") and n != link.name]
        assert other.read_bytes() == b"x" and victim.read_bytes() == b"keep" and link.is_symlink()
    finally:
        other.unlink()
        link.unlink()


def test_dry_run_runs_nothing(sandbox):
    before = json.loads(invoke("sandbox", "status", "--json").stdout)
    res = invoke("pivot", "--host", "sandbox", "--to", "deploy", "--dry-run")
    assert res.returncode == 0
    assert b"--dry-run: nothing was run" in res.stdout and b"[8/8] smoke" in res.stdout and b"[3/8] probe" in res.stdout
    assert b"[2/8] baseline" in res.stdout  # the sandbox opts in to GPU settings: its baseline comes back first
    after = json.loads(invoke("sandbox", "status", "--json").stdout)
    assert before["alive"] == after["alive"]




def server_argv(ps, port, *extra):
    return ["python3", str(ROLES), "server", "--devdir", str(ps.devdir), "--tp", "1", "--http-port", str(port), *extra]


def local_env(ps, hosts_env, phases: dict):
    lines = [f"LOCAL_DEVICES='{ps.glob}'", f"LOCAL_TARGETS='{re.escape(ROLES.name)}'", "LOCAL_FAKE_DEVICES=yes",
             f"LOCAL_SCOPE='{ps.base}'"]
    for name, keys in phases.items():
        for k, v in keys.items():
            lines.append(f"LOCAL_PHASE_{name.upper()}_{k}='{v}'")
    return hosts_env("\n".join(lines) + "\n")


def test_failing_gate_starts_nothing(ps, hosts_env, tmp_path):
    marker = tmp_path / "started"
    local_env(ps, hosts_env, {"train": {"CMD": f"touch {marker}; sleep 60",
                                        "GATES": json.dumps([{"glob": str(tmp_path / "*.pt"), "min": 3}, "true"])}})
    res = invoke("pivot", "--host", "local", "--to", "train", "--yes")
    assert res.returncode == 5, out_text(res)
    assert "FAIL at least 3 files match" in out_text(res) and "nothing started" in out_text(res)
    assert not marker.exists()


def test_readiness_timeout_shows_log_tail(ps, hosts_env):
    port = free_port()
    local_env(ps, hosts_env, {"serve": {"ARGV": json.dumps(["sh", "-c", "echo loading model shard 7 of 9; sleep 60"]),
                                        "READY": f"http://127.0.0.1:{port}/health", "READY_TIMEOUT": "1.5",
                                        "LINT": "off"}})
    res = invoke("pivot", "--host", "local", "--to", "serve", "--yes")
    text = out_text(res)
    assert res.returncode == 1, text
    assert "NOT READY after" in text and "loading model shard 7 of 9" in text
    invoke("stop", "--host", "local", "--phase", "serve")


def test_deploy_unhealthy_is_rolled_back(ps, hosts_env, tmp_path):
    code, patch = broken_deploy(tmp_path)
    port = free_port()
    local_env(ps, hosts_env, {"deploy": {
        "ARGV": json.dumps(server_argv(ps, port, "--code-dir", str(code), "--load-s", "0.3")),
        "DIR": str(code), "PATCH": str(patch), "READY": f"http://127.0.0.1:{port}/health", "READY_TIMEOUT": "3",
        "SMOKE_URL": f"http://127.0.0.1:{port}/generate", "LINT": "off"}})
    res = invoke("pivot", "--host", "local", "--to", "deploy", "--yes")
    text = out_text(res)
    assert res.returncode == 1, text
    assert "rolled back (the new server did not become ready); old server healthy again" in text
    assert (code / "server_config.json").read_text() == '{"healthy": true}\n'
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
        assert r.status == 200
    assert invoke("stop", "--host", "local", "--phase", "deploy").returncode == 0


def test_setsid_start_logs_stop(ps, hosts_env):
    local_env(ps, hosts_env, {"job": {"ARGV": json.dumps(["python3", str(ROLES), "job", "--devdir", str(ps.devdir),
                                                          "--gpus", "1"]), "ENV": "HELLO=world", "GPUS": "0"}})
    res = invoke("start", "--host", "local", "--phase", "job")
    assert res.returncode == 0, out_text(res)
    assert b"started via setsid" in res.stdout
    state = agent_phase.load_state("job")
    assert alive(state["pid"])
    with open(f"/proc/{state['pid']}/environ", "rb") as f:
        env = f.read().split(b"\0")
    assert b"HELLO=world" in env and b"CUDA_VISIBLE_DEVICES=0" in env
    assert invoke("logs", "--host", "local", "--phase", "job").returncode == 0
    res = invoke("stop", "--host", "local", "--phase", "job")
    assert res.returncode == 0, out_text(res)
    assert not alive(state["pid"])
    assert invoke("start", "--host", "local", "--phase", "nope").returncode == 2


@pytest.mark.parametrize("key,value,msg", [
    ("ARGV", "python3 train.py", "not valid JSON"), ("READY", "localhost:8000", "http(s) URL"),
    ("GATES", '[{"glob": "/x/*"}]', "neither a command"), ("ENV", "NOTPAIR", "is not NAME=VALUE"),
    ("GPUS", "all", "GPU indexes"), ("READY_TIMEOUT", "soon", "positive number")])
def test_bad_phase_config_is_one_line_exit2(hosts_env, key, value, msg):
    extra = "" if key == "ARGV" else "LOCAL_PHASE_X_CMD='true'\n"
    hosts_env(extra + f"LOCAL_PHASE_X_{key}='{value}'\n")
    res = invoke("pivot", "--host", "local", "--to", "x", "--yes")
    assert res.returncode == 2
    lines = res.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and f"LOCAL_PHASE_X_{key}" in lines[0] and msg in lines[0]
