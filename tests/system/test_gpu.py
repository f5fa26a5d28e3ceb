"""GPU tests: real torch trees on real NVIDIA GPUs. `pytest -m gpu` on the GPU machine;
skipped cleanly (with the reason) wherever NVML sees no GPU, as in CI."""
import json
import os

import pytest

from scripts.agent.wire import requests
from scripts.config.hostconfig import build_host
from scripts.reach.transport import call_agent
from tests.conftest import invoke
from tests.support.gpu_support import GpuTree, Monitor, gpu_count, nvml_used_mib
from tests.support.paths import SUPPORT

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(gpu_count() == 0, reason="no NVIDIA GPU visible through NVML")]


def local_host(token):
    """Targets name the program (gpu_tree.py); the scope (a token only this test uses, in the
    parent's command line) keeps the teardown to the test's own tree."""
    import sys
    return build_host("local", {"PYTHON": sys.executable, "TARGETS": r"gpu_tree\.py", "SCOPE": token}, "test")


def test_scan_and_verify_tell_the_truth(tmp_path):
    token = f"gpupivot-test-{os.getpid()}-scan"
    tree = GpuTree(tmp_path, token, children=3, gib=2)
    try:
        host = local_host(token)
        doc = call_agent(host, requests.Scan()).doc
        assert doc["gpu_source"] == "nvml"
        by_pid = {h["pid"]: h for h in doc["holders"]}
        for pid in tree.pids:
            assert pid in by_pid, f"pid {pid} not found"
            mib = by_pid[pid]["gpu_mib"]
            assert set(mib) == {str(i) for i in range(gpu_count())}
            assert all(v >= 2048 for v in mib.values())
            assert by_pid[pid]["mapped_devices"], "a CUDA process maps the device files"
            assert any(d.startswith("/dev/nvidia") for d in by_pid[pid]["devices"]), by_pid[pid]["devices"]
        assert doc["denied"] == [], "root inspects every process"
        agent_pids = {h["pid"] for h in doc["holders"] if "gpu-pivot agent" in (h["protected"] or "")}
        assert not agent_pids  # the agent's own NVML handle never counts as a holder
        result = call_agent(host, requests.Verify())
        assert result.code == 1 and not result.doc["free"]
    finally:
        tree.kill()
    result = call_agent(host, requests.Verify(wait=10))
    assert result.code == 0, result.doc["problems"]
    assert [g["used_mib"] for g in result.doc["gpus"]] == [0] * gpu_count()
    assert all(g["memory_call"] == "v2" for g in result.doc["gpus"])


def test_teardown_frees_all_memory_and_keeps_the_monitor(tmp_path, hosts_env):
    import sys
    token = f"gpupivot-test-{os.getpid()}-teardown"
    monitor = Monitor(tmp_path)
    tree = GpuTree(tmp_path, token, children=3, gib=2)
    try:
        hosts_env(f"LOCAL_PYTHON={sys.executable}\nLOCAL_TARGETS='gpu_tree\\.py'\nLOCAL_SCOPE={token}\n")
        plan = json.loads(invoke("plan", "--host", "local", "--json").stdout)["local"]["plan"]
        targets = {t["pid"]: t["reason"] for t in plan["targets"]}
        assert set(tree.pids) <= set(targets)  # plus multiprocessing's resource tracker, also in the tree
        assert all(pid == tree.pids[0] or f"started by target {tree.pids[0]}" in why for pid, why in targets.items())
        assert monitor.proc.pid in {p["pid"] for p in plan["protected"]}
        out = invoke("teardown", "--host", "local", "--yes", "--json")
        doc = json.loads(out.stdout)["local"]
        assert out.returncode == 0, doc.get("problems")
        assert tree.alive() == []
        assert monitor.alive()
        assert nvml_used_mib() == [0] * gpu_count()
        print(f"teardown wall {doc['wall_s']:.3f}s (agent), freed {doc['freed_mib']} MiB")
    finally:
        tree.kill()
        monitor.stop()


def test_emergency_memory_line_parses_and_reads_free():
    """The emergency doc's memory one-liner, run here without its ssh hop, read by our CSV parser."""
    import subprocess

    from scripts.agent.gpu import smi_parse
    from scripts.emergency import runbook as emergency_doc
    out = subprocess.run(emergency_doc.MEMORY, capture_output=True, text=True, check=True)
    gpus = smi_parse.query_gpu(out.stdout)
    assert len(gpus) == gpu_count()
    assert all(g["used_mib"] == 0 and g["reserved_mib"] > 0 for g in gpus)


def test_real_device_found_by_identity_under_another_name(tmp_path):
    """A node made with mknod on /dev/nvidia0's numbers, outside /dev, opened by a process:
    the scan names it /dev/nvidia0 (by major:minor, not by path text). It maps nothing and
    has no context, so it is an NVML-style handle: reported, protected, and it does not
    keep the GPU from reading free."""
    import stat
    import subprocess
    import sys
    import time

    st = os.stat("/dev/nvidia0")
    alias = tmp_path / "not-a-gpu-name"
    os.mknod(alias, 0o600 | stat.S_IFCHR, st.st_rdev)
    ready = tmp_path / "ready"
    proc = subprocess.Popen([sys.executable, "-c", "import os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR); "
                             "open(sys.argv[2], 'w').close(); time.sleep(600)", str(alias), str(ready)])
    try:
        deadline = time.monotonic() + 10
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        doc = call_agent(local_host("no-such-scope"), requests.Scan()).doc
        held = {h["pid"]: h for h in doc["holders"]}
        assert proc.pid in held, "a GPU node under another name is a holder"
        assert held[proc.pid]["devices"] == ["/dev/nvidia0"]
        assert "no CUDA context" in (held[proc.pid]["protected"] or "")
    finally:
        proc.kill()
        proc.wait()


def test_devices_glob_of_other_files_is_refused_on_a_real_host(hosts_env):
    import sys
    hosts_env(f"LOCAL_PYTHON={sys.executable}\nLOCAL_DEVICES='/dev/nul[l]'\n")
    out = invoke("status", "--host", "local")
    assert out.returncode == 2
    assert b"is not an NVIDIA character device" in out.stderr


def test_a_server_unpinning_a_large_host_pool_is_freed_when_the_gpu_reads_free(tmp_path):
    """A torch server with GPU memory and a 32 GiB pinned host pool: its exit unpins for seconds
    after NVML reads 0 MiB and lists no process for it. The verdict is FREED then, naming it
    "exiting, holds no GPU memory", not after the exit (bench/exiting_pinned.py measures it)."""
    import subprocess
    import sys
    import time

    from scripts.agent.procs import procfs

    token = f"gpupivot-test-{os.getpid()}-pinned"
    ready = tmp_path / "pinned.ready"
    proc = subprocess.Popen([sys.executable, str(SUPPORT / "gpu_pinned_server.py"), "--token", token,
                             "--gpu-gib", "8", "--pinned-gib", "48", "--ready", str(ready)], start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not ready.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "the pinned server did not start"
            time.sleep(0.1)
        start = procfs.start_time(proc.pid)
        host = build_host("local", {"PYTHON": sys.executable, "TARGETS": r"gpu_pinned_server\.py", "SCOPE": token},
                          "test")
        result = call_agent(host, requests.Teardown(grace=10, timeout=60), deadline_s=180)
        still_exiting = procfs.same_process(proc.pid, start)
        assert result.code == 0, result.doc["problems"]
        named = [e["pid"] for e in result.doc["exiting_without_gpu"]]
        # FREED with the server still in its exit only when it is named so; when its exit ended
        # first (the driver unpinned faster than the GPU read free), there is nothing to name
        assert named == ([proc.pid] if still_exiting else []) or named == [proc.pid], (named, still_exiting)
        assert [g["used_mib"] for g in result.doc["after"]] == [0] * gpu_count()
    finally:
        proc.kill()
        proc.wait(120)
