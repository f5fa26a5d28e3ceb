"""Memory no one could read is "unknown", never 0: without a GPU reader (no NVML, the fake
devices' files only) a plan said "will free about 0 MiB" and a teardown "freed 0 MiB", which
read as "nothing there to free" on a host whose GPUs were full."""
from __future__ import annotations

import dataclasses
import subprocess
import sys

from scripts.agent.wire import requests
from scripts.views import teardown as teardown_view
from tests.support.agent_inproc import run_agent
from tests.support.teardowns import host, ready_pid, server_pkg

TARGETS = r"xsrv\.launch_server"


def _no_reader(ps):
    return dataclasses.replace(host(ps, TARGETS=TARGETS), fake_gpus=None)


def test_a_plan_and_a_teardown_without_a_gpu_reader_say_unknown_not_0(ps):
    ready = ps.base / "srv.ready"
    proc = subprocess.Popen(
        [sys.executable, "-m", "xsrv.launch_server", "--ready", str(ready), "--hold", str(ps.devdir / "nvidia0")],
        start_new_session=True,
        env={"PYTHONPATH": str(server_pkg(ps)), "PATH": "/usr/bin:/bin"})
    ps.adopt(proc.pid)
    ready_pid(ready)
    planned = run_agent(_no_reader(ps), requests.Plan())
    assert planned.doc["plan"]["targets"], planned.doc
    assert planned.doc["plan"]["will_free_mib"] is None, planned.doc["plan"]["targets"]
    shown = teardown_view.plan_tables(planned.doc)
    assert "will free an unknown amount of GPU memory" in shown and "0 MiB" not in shown, shown
    done = run_agent(_no_reader(ps), requests.Teardown(grace=2, timeout=5))
    assert done.doc["freed_mib"] is None, done.doc
    assert "freed 0 MiB" not in "\n".join(teardown_view.verdict_lines("local", done.doc))
