"""A target in its exit that the GPU's process list no longer names is set aside: FREED.

A server with a large pinned host-memory pool (SGLang's hierarchical cache pins hundreds of
GB) spends seconds in its exit after the GPU reads free: NVML reads 0 MiB and lists no
process for it while it unpins. It runs no code of its own any more, so it cannot take the
GPU again: the verdict is FREED then, naming it "exiting, holds no GPU memory". Where the
GPU source lists no processes (the sandbox's fake GPUs, no NVML), nothing vouches for it and
the verdict still waits for its exit (tests/agent/procs/test_hung_mounts.py).

Here the long exit is made on the CPU: the target holds a file on a FUSE mount whose server
stops answering, so its exit waits in that file's close (state D, every thread exiting,
its fd table detached) until the test ends the FUSE server. The GPU source is the stand-in
NVML (tests/support/standin/nvml) replaying an H200 that reads 0 MiB and lists no process: what the
real NVML says at that moment (the GPU test and bench/exiting_pinned.py measure it on an H200).
The agent runs as its own process (call_agent): the stand-in is the pynvml its PYTHONPATH finds.
"""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

from scripts.agent.procs import procfs
from scripts.agent.wire import requests
from scripts.config.hostconfig import build_host
from scripts.reach.transport import call_agent
from tests.support import scenario
from tests.support.gpu_standins import H200_MEMORY as H200, STANDIN
from tests.support.hung_mounts import STUCK_IN_EXIT


def test_a_target_in_its_exit_that_nvml_lists_nowhere_is_freed_and_named(hung_fuse, ps, tmp_path,
                                                                         monkeypatch):
    server, mnt, ready, started = hung_fuse
    script = ps.base / "stuck_exit_server.py"
    script.write_text(STUCK_IN_EXIT)
    target = subprocess.Popen([sys.executable, str(script), str(mnt / "f"), str(ps.devdir / "nvidia0"), "-"],
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    started.append(target)
    assert target.stdout.readline().split() == ["holding", "3", "4"]
    start = procfs.start_time(target.pid)
    recording = tmp_path / "h200.json"
    recording.write_text(json.dumps({"gpus": [H200]}))
    monkeypatch.setenv("PYTHONPATH", str(STANDIN))
    monkeypatch.setenv("GPU_PIVOT_NVML_RECORDING", str(recording))
    keys = dict(scenario.host_keys(ps), TARGETS=r"stuck_exit_server\.py")
    host = dataclasses.replace(build_host("local", keys, "test"), fake_gpus=None)
    result = call_agent(host, requests.Teardown(grace=20, timeout=30), deadline_s=90)
    doc = result.doc
    assert doc["gpu_source"] == "nvml"
    assert result.code == 0 and doc["verdict"] == "free", (result.code, doc.get("problems"))
    assert [e["pid"] for e in doc["exiting_without_gpu"]] == [target.pid], doc["exiting_without_gpu"]
    assert doc["exiting_without_gpu"][0]["why"] == "exiting, holds no GPU memory"
    # what the verdict stood on: the target still in its exit when it was given
    assert procfs.same_process(target.pid, start) and procfs.exiting(target.pid, start)
    assert [a["signal"] for a in doc["actions"] if a["pid"] == target.pid] == ["SIGTERM"]  # no SIGKILL
    server.kill()  # aborts the FUSE connection: the close returns and the exit ends
    target.wait(30)
