"""nvidia-smi's table and CSV queries and a loaded host's `ps --forest`, read from the real H200
captures in tests/fixtures/h200-driver580: exact values."""

import pytest

from scripts.agent.gpu import smi_parse
from tests.conftest import FIXTURES
from tests.support.parsers import ps_parse, smi_table


def fx(name):
    return (FIXTURES / name).read_text()


UVM, GPU0, CTL = "/dev/nvidia-uvm", "/dev/nvidia0", "/dev/nvidiactl"


def test_smi_table_loaded_reads_zero_free():
    text = fx("nvidia-smi-loaded.txt")
    assert sum("0MiB" in line for line in text.splitlines()) == 4  # the deploy one-liner's grep | wc -l
    out = smi_table.table(text)
    assert out["free"] == []
    assert out["gpus"] == [{"index": 0, "name": "NVIDIA H200", "used_mib": 84386, "total_mib": 143771}]
    assert [(p["pid"], p["used_mib"], p["name"]) for p in out["processes"]] == [
        (419, 21090, "python3"), (437, 21090, "/opt/torch/.venv/bin/python3"),
        (438, 21090, "/opt/torch/.venv/bin/python3"), (439, 21090, "/opt/torch/.venv/bin/python3")]


def test_smi_table_idle_reads_one_free():
    out = smi_table.table(fx("nvidia-smi-idle.txt"))
    assert out["free"] == [0]
    assert out["processes"] == []
    assert out["gpus"][0]["used_mib"] == 0


@pytest.mark.parametrize("name,uuid,used", [
    ("query-gpu-idle.csv", "GPU-32206981-f0dd-2764-a681-7945b197c5bd", 0),
    ("query-gpu-loaded.csv", "GPU-7085372d-ee78-27b3-9f7f-46c8153115b5", 84386)])
def test_query_gpu_csv(name, uuid, used):
    assert smi_parse.query_gpu(fx(name)) == [{"index": 0, "uuid": uuid, "name": "NVIDIA H200", "used_mib": used,
                                              "total_mib": 143771, "reserved_mib": 616}]


@pytest.mark.parametrize("name", ["query-compute-apps-loaded.csv", "query-compute-apps-loaded-header.csv"])
def test_query_compute_apps_csv(name):
    apps = smi_parse.query_compute_apps(fx(name))
    uuid = "GPU-7085372d-ee78-27b3-9f7f-46c8153115b5"
    assert apps == [
        {"gpu_uuid": uuid, "pid": 419, "name": "python3", "used_mib": 21090},
        {"gpu_uuid": uuid, "pid": 439, "name": "/opt/torch/.venv/bin/python3", "used_mib": 21090},
        {"gpu_uuid": uuid, "pid": 437, "name": "/opt/torch/.venv/bin/python3", "used_mib": 21090},
        {"gpu_uuid": uuid, "pid": 438, "name": "/opt/torch/.venv/bin/python3", "used_mib": 21090},
    ]


def test_query_csv_not_available_and_bad_rows():
    assert smi_parse.query_gpu("0, GPU-x, NVIDIA H200, [N/A], 143771, [N/A]\n")[0]["used_mib"] is None
    with pytest.raises(ValueError, match="expected 6"):
        smi_parse.query_gpu("0, GPU-x\n")


def test_ps_forest_tree():
    rows = ps_parse.parse(fx("ps-tree-loaded.txt"))
    assert len(rows) == 191
    by_pid = {r["pid"]: r for r in rows}
    assert ps_parse.children(rows, 419) == [436, 437, 438, 439]
    assert {by_pid[p]["pgid"] for p in (419, 436, 437, 438, 439)} == {419}
    assert by_pid[419]["args"] == "python3 /tmp/holder.py 20 3"
    assert by_pid[419]["stat"] == "Ssl" and by_pid[419]["state"] == "S"
    assert by_pid[437]["args"].startswith("/opt/torch/.venv/bin/python3 -B -c from multiprocessing.spawn import")
    assert by_pid[1]["comm"] == "process_api"
