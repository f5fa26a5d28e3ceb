"""A fleet at a glance, and a host that shows no GPU.

`status` and `verify` over several hosts print a summary first, one line per host in the
order given (`HOST  GPUs free/total  holders  exit  verdict`: every row its exit code), then
each host's details; `--brief` prints the summary alone; `--json` is every host's document
as before. The fleet here is real: n1 (a server tree and a protected holder) and n4 (a device glob that matches nothing)
are aliases of this machine, n2 is this machine again through the loopback sshd, n3 is an
ssh destination nobody answers. `run` over a fleet leads each stderr line with its host and
gives an unreachable host a section of its own. `status` on a host that shows no GPU says
"no GPU visible" and exits 1, as verify does; and its screen fits 80 columns.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from tests.conftest import invoke
from tests.support import scenario
from tests.support.fleet_faults import Tarpit
from tests.support.procs import ProcessSet

UNREACHABLE = "N3_SSH=nobody@127.0.0.1\nN3_SSH_OPTS='-p 1 -o ConnectTimeout=3 -o ControlPath=none'\n"
HEADER = ["host", "GPUs free/total", "holders", "exit", "verdict"]


def _keys(alias: str, keys: dict) -> str:
    return "".join(f"{alias.upper()}_{k}='{v}'\n" for k, v in keys.items())


NO_GPU_GLOB = "/proc/gpu-pivot-none/nvidia*"  # /proc: no user can make a file match it


@pytest.fixture
def fleet(sshd, hosts_env):
    # a short private dir (mkdtemp: 0700, ours), so its device paths fit 80 columns whole: a
    # path is one word, never cut, and pytest's own temp paths run past 80 under xdist
    base = Path(tempfile.mkdtemp(prefix="gpf-"))
    busy, idle = ProcessSet(base / "busy"), ProcessSet(base / "idle")
    pids = {"server": busy.server(tp=2)[0], "persistenced": busy.role("hold", title="nvidia-persistenced")}
    tarpit = Tarpit()  # n5: accepts and never speaks; ssh gives up at its ConnectTimeout
    hosts_env(_keys("n1", scenario.host_keys(busy))
              + sshd.hosts_env("n2", extra=scenario.host_keys(idle))
              + UNREACHABLE
              + _keys("n4", {"DEVICES": NO_GPU_GLOB, "FAKE_DEVICES": "yes"})
              + f"N5_SSH={sshd.dest()}\nN5_SSH_OPTS='-p {tarpit.port} -o ConnectTimeout=2 -o ControlPath=none "
                f"-o UserKnownHostsFile={sshd.known_hosts} -o StrictHostKeyChecking=yes'\n")
    yield pids
    tarpit.close()
    busy.kill_all()
    idle.kill_all()
    shutil.rmtree(base, ignore_errors=True)


def _summary(text: str) -> dict:
    """{host: its summary row's cells, the exit code an int} from the table at the top of
    `text` (cells cut where the rule's dashes are; a wrapped verdict's later lines joined to
    its row), in the order printed: a dict keeps it."""
    import re

    lines = text.splitlines()
    assert " ".join(lines[0].split()) == " ".join(HEADER), text
    spans = [(m.start(), m.end()) for m in re.finditer(r"-+", lines[1])]
    spans[-1] = (spans[-1][0], None)  # the verdict runs to the end of its line
    rows: dict = {}
    row: list = []
    for line in lines[2:]:
        if not line.strip() or line.startswith("== "):
            break
        cells = [" ".join(line[a:b].split()) for a, b in spans]
        if cells[0]:
            row = rows[cells[0]] = cells[1:]
        else:
            row[-1] += " " + cells[-1]  # the verdict of the row above, wrapped
    return {h: [c[0], c[1], int(c[2]), c[3]] for h, c in rows.items()}


def test_status_over_a_fleet_puts_one_line_per_host_first(fleet):
    out = invoke("status", "--host", "n[1-5]", env=dict(os.environ, COLUMNS="100"))
    text = out.stdout.decode()
    assert out.returncode == 7, text + out.stderr.decode()  # the highest: n5 timed out (7) over n3 (3), n4 (1)
    rows = _summary(text)
    assert list(rows) == ["n1", "n2", "n3", "n4", "n5"], text
    assert rows["n5"][:3] == ["-", "-", 7] and rows["n5"][3].startswith("TIMED OUT: "), text
    assert rows["n1"] == ["0/2", "3 (+1 protected)", 0, "NOT FREE"], text  # status: not free is no failure
    assert rows["n2"] == ["2/2", "0", 0, "FREE"], text
    assert rows["n3"][:3] == ["-", "-", 3] and rows["n3"][3].startswith("UNREACHABLE: host unreachable"), text
    assert rows["n4"] == ["0/0", "0", 1, "NO GPU VISIBLE"], text
    # then the details, in the same order, after the summary
    headers = [line.split()[1] for line in text.splitlines() if line.startswith("== ")]
    assert headers == ["n1", "n2", "n4"], text
    assert text.index("== n1") > text.index("NO GPU VISIBLE")
    assert str(fleet["server"]) in text.split("== n2")[0].split("== n1")[1]
    assert "gpu-pivot: n3: host unreachable" in out.stderr.decode()


def test_brief_is_the_summary_alone_and_json_is_unchanged(fleet):
    out = invoke("verify", "--host", "n[1-4]", "--brief", "--wait", "1")  # n1 waited on: no progress line shown
    text = out.stdout.decode()
    assert out.returncode == 3, text + out.stderr.decode()
    rows = _summary(text)
    assert list(rows) == ["n1", "n2", "n3", "n4"], text
    assert rows["n1"] == ["0/2", "3 (+1 protected)", 1, "NOT FREE"], text
    assert rows["n2"] == ["2/2", "0", 0, "FREE"], text
    assert "== " not in text and "Still holding" not in text
    out = invoke("verify", "--host", "n[1-4]", "--json")
    doc = json.loads(out.stdout)
    assert out.returncode == 3
    assert sorted(doc) == ["n1", "n2", "n3", "n4"]  # one document per host, no summary mixed in
    assert [doc[h]["exit_code"] for h in ("n1", "n2", "n3", "n4")] == [1, 0, 3, 1]
    assert doc["n2"]["free"] is True and "error" in doc["n3"]
    out = invoke("status", "--host", "n[1-4]", "--brief", "--json")
    assert out.returncode == 2 and out.stderr.decode().strip() == (
        "gpu-pivot: --brief and --json: choose one (--json has every host's whole document)")


def test_one_host_keeps_its_view(fleet):
    out = invoke("status", "--host", "n1")
    text = out.stdout.decode()
    assert out.returncode == 0, text
    assert text.startswith("== n1 ") and "GPUs free/total" not in text
    out = invoke("status", "--host", "n1", "--brief")  # --brief: the one line, under its header
    assert _summary(out.stdout.decode()) == {"n1": ["0/2", "3 (+1 protected)", 0, "NOT FREE"]}


def test_a_host_that_shows_no_gpu_says_so_as_verify_does(fleet):
    out = invoke("status", "--host", "n4")
    text = " ".join(out.stdout.decode().split())
    assert out.returncode == 1, text  # as verify: nothing here is free
    assert f"NO GPU VISIBLE: no device file matches {NO_GPU_GLOB}" in text
    assert "holds a GPU" not in text, text
    assert json.loads(invoke("status", "--host", "n4", "--json").stdout)["n4"]["exit_code"] == 1
    verify = invoke("verify", "--host", "n4")
    assert verify.returncode == 1 and "no GPU visible: no device file matches" in verify.stdout.decode()


def test_run_over_a_fleet_names_the_host_of_every_stderr_line(fleet):
    out = invoke("run", "--host", "n1,n3,n2", "--", "sh", "-c", "echo out; echo err >&2; printf 'no newline' >&2")
    assert out.returncode == 3, out
    stdout, stderr = out.stdout.decode(), out.stderr.decode()
    assert stdout == "===== n1 =====\nout\n===== n3: unreachable (exit 3) =====\n===== n2 =====\nout\n", stdout
    lines = stderr.splitlines()
    assert lines[:2] == ["n1: err", "n1: no newline"], stderr
    assert lines[2].startswith("gpu-pivot: n3: host unreachable"), stderr
    assert lines[3:] == ["n2: err", "n2: no newline"], stderr


def test_status_fits_80_columns(fleet):
    for host in ("n1", "n4", "n[1-4]"):
        out = invoke("status", "--host", host, env=dict(os.environ, COLUMNS="80"))
        text = out.stdout.decode()
        assert text.strip(), out
        assert max(len(line) for line in text.splitlines()) <= 80, text
        if host == "n1":  # the 179-character line of a host without a GPU memory source, wrapped
            assert "GPU memory: no source on this host" in text, text


def _scan(gpus=2, holders=(), **fields):
    from scripts.agent.wire import records

    rows = [{"index": i, "name": "H200", "used_mib": 0, "reserved_mib": 0, "total_mib": 143771, "processes": []}
            for i in range(gpus)]
    base = {"hostname": "h", "gpus": rows, "holders": list(holders), "gpu_source": "nvml",
            "devices": [f"/dev/nvidia{i}" for i in range(gpus)] + ["/dev/nvidiactl"]}
    base.update(fields)
    return records.ScanResult(**base)


def _holder(pid, devices, gpu_mib=None, protected=None):
    return {"pid": pid, "devices": devices, "gpu_mib": gpu_mib or {}, "protected": protected}


def test_a_gpu_counts_free_only_where_nothing_says_otherwise():
    from scripts.views import fleet as fleet_view

    assert fleet_view.gpus_free(_scan()) == "2/2"
    # memory on GPU 1 (its NVML index), whatever device files the holder has open
    assert fleet_view.gpus_free(_scan(holders=[_holder(9, ["/dev/nvidia0"], {"1": 900})])) == "1/2"
    # a device handle alone: on the GPU of its nvidiaN file; on every GPU when it has none of those
    assert fleet_view.gpus_free(_scan(holders=[_holder(9, ["/dev/nvidia1", "/dev/nvidiactl"])])) == "1/2"
    assert fleet_view.gpus_free(_scan(holders=[_holder(9, ["/dev/nvidiactl"])])) == "0/2"
    # a protected holder (a persistence daemon) keeps no GPU from being free
    scan = _scan(holders=[_holder(9, ["/dev/nvidia0"], protected="NVIDIA persistence daemon")])
    assert fleet_view.gpus_free(scan) == "2/2" and fleet_view.holders(scan) == "0 (+1 protected)"
    assert fleet_view.status_verdict(scan) == "FREE"
    # memory that could not be read, or over the threshold, is not free
    unread = _scan()
    unread.gpus[0]["used_mib"] = None
    assert fleet_view.gpus_free(unread) == "1/2" and fleet_view.status_verdict(unread) == "NOT FREE"
    used = _scan()
    used.gpus[1]["used_mib"] = 3
    assert fleet_view.gpus_free(used) == "1/2" and fleet_view.gpus_free(used, max_used_mib=5) == "2/2"
    # a process not inspected may hold any GPU unseen: no count is claimed
    denied = _scan(denied=[4242])
    assert fleet_view.gpus_free(denied) == "?/2" and fleet_view.status_verdict(denied) == "NOT INSPECTED (run as root)"
    # no source: the GPUs are the host's nvidiaN files
    fake = _scan(gpus=0, devices=["/x/nvidia0", "/x/nvidia1", "/x/nvidia-uvm"],
                 holders=[_holder(9, ["/x/nvidia1"])])
    assert fleet_view.gpus_free(fake) == "1/2" and fleet_view.status_verdict(fake) == "NOT FREE"
