"""Parsers on the real H200 captures in tests/fixtures/h200-driver580, exact values."""

import pytest

from scripts.agent.gpu import smi_parse
from tests.conftest import FIXTURES
from tests.support.parsers import fuser as fuser_parse, ps_parse, smi_table


def fx(name):
    return (FIXTURES / name).read_text()


UVM, GPU0, CTL = "/dev/nvidia-uvm", "/dev/nvidia0", "/dev/nvidiactl"


def test_fuser_plain_pids_files_and_map():
    out = fuser_parse.plain(fx("fuser.stdout"), fx("fuser.stderr"))
    assert not fx("fuser.stdout").endswith("\n")  # the trap: no final newline
    assert out["pids"] == [780, 782, 803]
    assert out["files"] == [(UVM, "mm"), (GPU0, "mm"), (CTL, "mm")]
    assert out["holders"] == {780: [UVM, GPU0, CTL], 782: [UVM, GPU0, CTL], 803: [UVM, GPU0, CTL]}


def test_fuser_glued_text_needs_end_marker():
    text = fx("fuser-v.stdout")
    assert text.endswith("803rc=0\n")
    with pytest.raises(fuser_parse.FuserParseError, match="'803rc=0'"):
        fuser_parse.pids(text)
    assert fuser_parse.pids(text, end="rc=") == [780, 782, 803]
    with pytest.raises(fuser_parse.FuserParseError, match="not found"):
        fuser_parse.pids(text, end="@@END@@")


def test_deploy_oneliner_glued_outputs():
    assert fuser_parse.pids(" 164975" * 9 + " 1649750", end=None) == [164975, 1649750]  # why a marker is needed
    assert fuser_parse.pids(" 3653" * 10 + "done", end="done") == [3653]


def test_fuser_verbose_rows_and_map():
    out = fuser_parse.verbose(fx("fuser-v.stdout"), fx("fuser-v.stderr"), end="rc=")
    assert out["pids"] == [780, 782, 803]
    assert len(out["rows"]) == 9
    assert out["rows"][0] == {"file": UVM, "user": "root", "pid": 780, "access": "F....", "command": "python3"}
    assert out["rows"][4] == {"file": GPU0, "user": "root", "pid": 782, "access": "F...m", "command": "python3"}
    assert out["holders"] == {780: [UVM, GPU0, CTL], 782: [UVM, GPU0, CTL], 803: [UVM, GPU0, CTL]}
    assert [r["access"] for r in out["rows"] if r["pid"] == 780] == ["F...."] * 3  # the NVML-only monitor


def test_fuser_verbose_row_count_mismatch_is_an_error():
    with pytest.raises(fuser_parse.FuserParseError, match="do not match"):
        fuser_parse.verbose(" 780 782", fx("fuser-v.stderr"))


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


def test_release_floor_fixture():
    from scripts.ops.floor import release_floor

    floor = release_floor(FIXTURES / "release-floor.json")
    assert floor == {"min_s": 0.2595, "max_s": 0.3661, "median_s": 0.33050000000000002, "runs": 4}
