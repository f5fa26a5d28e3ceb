"""fuser's output as the emergency one-liners read it, on the real H200 captures in
tests/fixtures/h200-driver580: PIDs only on stdout with no final newline, names on stderr, and
glued outputs that need an end marker to be read at all."""
import pytest

from tests.conftest import FIXTURES
from tests.support.parsers import fuser as fuser_parse


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
