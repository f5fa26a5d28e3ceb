"""Nothing on the host can crash a teardown or forge its output, each case on the
input that broke it.

- a process of any user with an empty or blank argv[0] (`exec -a '' sleep 100`) crashed the
  scan (IndexError in program.names): plan and teardown exited 3, the server kept its GPUs;
- one failing NVML field of one GPU made the scan raise; an unknown value must never read free;
- whatever is left that raises in the agent is a result naming it, which the CLI reports;
- one process whose /proc data no parser understands is "not inspected", never the end of a scan.

Every process is the test's own, ended by PID; every teardown is scoped to the test's temp
dir (fake devices + SCOPE).
"""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from scripts.agent import cli
from scripts.agent.gpu import gpuinfo, nvml
from scripts.agent.policy import program
from scripts.agent.procs import procscan
from scripts.agent.teardown import verify
from scripts.agent.wire import codes, frame, requests
from scripts.config.hostconfig import build_host
from scripts.reach.transport import AgentError, read_document
from tests.conftest import REPO
from tests.support import scenario
from tests.support.agent_inproc import run_agent
from tests.support.gpu_standins import AGENT, H200_MEMORY as H200, STANDIN
from tests.support.procs import alive, wait_for


def host(ps, **keys):
    base = dict(scenario.host_keys(ps), TARGETS=r"sglang\.launch_server")
    base.update(keys)
    return dataclasses.replace(build_host("local", base, "test"), fake_gpus=str(ps.memdir))


def nameless(ps, argv0: str) -> int:
    """`exec -a ARGV0 sleep 100`, as any user could start it; returns its pid once exec'd."""
    p = subprocess.Popen(["bash", "-c", f"exec -a '{argv0}' sleep 100"], start_new_session=True)
    ps.adopt(p.pid)
    want = argv0.encode() + b"\0"
    wait_for(lambda: Path(f"/proc/{p.pid}/cmdline").read_bytes().startswith(want)
             and Path(f"/proc/{p.pid}/comm").read_text().strip() == "sleep", "the nameless sleep")
    return p.pid


# -- one process, one field ---------------------------------------------------------------------

@pytest.mark.parametrize("argv", [[""], [" "], ["", "100"], [" ", "100"], ["\t\n"]])
def test_a_blank_argv0_is_named_by_its_comm(argv):
    names = program.names({"argv": argv, "comm": "sleep"})
    assert ("sleep", "is program sleep") in names
    assert program.names({"argv": argv, "comm": ""}) == []
    assert program.match({"argv": argv, "comm": "sleep"}, [r"sglang\.launch_server"]) is None


@pytest.mark.parametrize("argv0", ["", " "])
def test_a_nameless_process_anywhere_does_not_stop_plan_or_teardown(ps, argv0):
    blank = nameless(ps, argv0)
    server = scenario._server(ps, "--tp", "1")
    planned = run_agent(host(ps), requests.Plan())
    assert planned.code == 0, planned.doc
    assert [t["pid"] for t in planned.doc["plan"]["targets"]][:1] == [server]
    assert blank not in [t["pid"] for t in planned.doc["plan"]["targets"]]
    done = run_agent(host(ps), requests.Teardown(grace=2, timeout=10, settle=0.2))
    assert done.code == 0, done.doc.get("problems")
    assert not alive(server) and alive(blank)


def standin_source(recording: dict):
    """gpuinfo.NvmlSource over the stand-in NVML (tests/support/standin/nvml), loaded in-process."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("standin_pynvml_%d" % id(recording), STANDIN / "pynvml.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.load(recording)
    src = gpuinfo.NvmlSource.__new__(gpuinfo.NvmlSource)
    src.nvml, src._names = nvml.Nvml(mod), {}
    src.handles = src.nvml.handles()
    return src




@pytest.mark.parametrize("call,field", [("nvmlDeviceGetMemoryInfo", "memory"),
                                        ("nvmlDeviceGetComputeRunningProcesses", "compute processes")])
def test_one_failing_nvml_field_of_one_gpu_is_that_field_unread_and_never_free(call, field):
    src = standin_source({"gpus": [H200, dict(H200, uuid="GPU-1", fail=[call])]})
    gpus = src.read()
    assert "unread" not in gpus[0] and gpus[0]["used_mib"] == 0
    assert [u.split(":")[0] for u in gpus[1]["unread"]] == [field]
    assert src.usage()[1] == (None, None) and gpuinfo.reads_free(src, 0) is False
    assert src.nvml._v2  # one GPU's failure does not switch every GPU to the v1 call (reserved counted)
    doc = {"gpus": gpus, "devices": ["/dev/nvidia0"], "devices_glob": "", "holders": []}
    free, problems = verify.evaluate(doc, 0)
    assert not free and problems == [f"GPU 1: {gpus[1]['unread'][0]} could not be read, so it is not called free"]


def test_a_failing_name_or_uuid_is_shown_unknown_and_read_again():
    src = standin_source({"gpus": [dict(H200, fail=["nvmlDeviceGetUUID"])]})
    assert (src.read()[0]["uuid"], src.read()[0]["name"]) == (None, "?")
    src.nvml.lib._rec["gpus"][0]["fail"] = []
    assert src.read()[0]["uuid"] == "GPU-0"


def test_the_agent_with_one_bad_nvml_field_answers_not_free(tmp_path):
    rec = tmp_path / "rec.json"
    rec.write_text(json.dumps({"gpus": [H200, dict(H200, uuid="GPU-1", fail=["nvmlDeviceGetMemoryInfo"])]}))
    env = dict(__import__("os").environ, PYTHONPATH=str(STANDIN), GPU_PIVOT_NVML_RECORDING=str(rec))
    done = subprocess.run([sys.executable, str(AGENT), "verify", "--json", "--devices", str(tmp_path / "none*")],
                          capture_output=True, text=True, env=env, timeout=60, cwd=REPO)
    doc = json.loads(done.stdout)
    assert done.returncode == codes.EXIT_NOT_FREE, doc
    assert doc["gpu_source"] == "nvml" and "Traceback" not in done.stderr
    assert any(p.startswith("GPU 1: memory: NvmlError") for p in doc["problems"]), doc["problems"]


# -- what still raises: a result naming it ------------------------------------------------------

class Broken:
    """A subcommand module whose run raises: stands for any bug left in the agent."""

    @staticmethod
    def add_arguments(parser):
        pass

    @staticmethod
    def run(args):
        return [][0]


def test_an_exception_in_the_agent_is_a_result_naming_it(monkeypatch, capsys):
    monkeypatch.setitem(cli.MODULES, "scan", Broken)
    code = cli.main(["scan", "--json"])
    out = capsys.readouterr()
    doc = json.loads(out.out)
    assert code == codes.EXIT_UNREACHABLE == doc["exit_code"]
    assert doc[codes.AGENT_ERROR].startswith("IndexError: list index out of range (test_hostile_host.py:")
    assert "in run)" in doc[codes.AGENT_ERROR] and "Traceback" in out.err


def test_the_cli_reports_the_agents_own_failure_as_one_line():
    nonce = frame.new_nonce()
    body = json.dumps({codes.AGENT_ERROR: "IndexError: boom (program.py:72 in names)", "command": "scan",
                       "exit_code": 3})
    with pytest.raises(AgentError, match=r"local: the agent failed: IndexError: boom \(program\.py:72 in names\)"):
        read_document("local", frame.frame(nonce, body), nonce, 3, "")


def test_a_process_no_parser_understands_is_not_inspected(monkeypatch, ps):
    server = scenario._server(ps, "--tp", "1")
    real = procscan.basic

    def basic(pid, *rest, **kw):
        if pid == server:
            raise ValueError("a stat line no kernel writes")
        return real(pid, *rest, **kw)

    monkeypatch.setattr(procscan, "basic", basic)
    from scripts.agent.procs import devices

    snap = procscan.snapshot(devices.DeviceSet(ps.glob, fake=True))
    assert server in snap["denied"]
    assert snap["procs"][server]["unreadable"] == "its /proc data could not be understood (ValueError)"


def test_human_output_of_the_agent_is_escaped():
    text = cli.human({"error": "x\n\x1b[2JFREED", "list": ["a\nb"]})
    assert "\x1b" not in text and text.count("\n") == 2 and "x\\x0a\\x1b[2JFREED" in text


# -- state files survive their own corruption ---------------------------------------------------

TORN = '{"time": "2026-11-30T10:48:44+0100", "alias": "gpu1", "signal": "SIGTE'  # a writer killed mid-line


def test_an_append_after_a_torn_line_starts_a_line_of_its_own(tmp_path, monkeypatch):
    from scripts.agent.state.auditlog import Audit
    from scripts.ops import audit_log

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    audit_log.append("gpu1", [{"pid": 1, "signal": "SIGTERM", "result": "sent"}])
    with open(audit_log.audit_path(), "a") as f:
        f.write(TORN)
    audit_log.append("gpu2", [{"pid": 2, "signal": "SIGKILL", "result": "sent"}])
    recs, skipped = audit_log.read_counted()
    assert [(r["alias"], r["signal"]) for r in recs] == [("gpu1", "SIGTERM"), ("gpu2", "SIGKILL")]
    assert skipped == 1
    host_log = tmp_path / "audit.jsonl"  # the host's copy: the agent's Audit appends the same way
    host_log.write_text(TORN)
    host_log.chmod(0o600)
    Audit("op@test", path=str(host_log)).log({"pid": 3, "start_time": 1, "cmdline": "x"}, "SIGTERM", "sent")
    lines = host_log.read_text().splitlines()
    assert lines[0] == TORN and json.loads(lines[1])["pid"] == 3


@pytest.mark.parametrize("bad", ['{"argv": 5, "signal": "SIGTERM", "pid": 7}', '{"pid": "seven", "signal": "x"}',
                                 '{"cmdline": ["a"], "signal": "SIGTERM"}', '[1, 2]', '"text"', TORN, '{"a": ' * 900])
def test_a_record_that_cannot_be_read_is_skipped_and_counted(tmp_path, bad):
    from tests.conftest import invoke

    state = tmp_path / "state"
    (state / "gpu-pivot").mkdir(parents=True, mode=0o700)
    state.chmod(0o700)
    log = state / "gpu-pivot" / "audit.jsonl"
    good = {"time": "2026-11-30T10:48:44+0100", "alias": "gpu1", "operator": "o@h", "signal": "SIGTERM", "pid": 812,
            "result": "sent", "cmdline": "python3 -m sglang.launch_server", "argv": ["python3", "-m", "x"]}
    log.write_text(json.dumps(good) + "\n" + bad + "\n" + json.dumps(dict(good, pid=813)) + "\n")
    log.chmod(0o600)
    env = dict(__import__("os").environ, XDG_STATE_HOME=str(state))
    for args in (["audit"], ["audit", "--json"]):
        out = invoke(*args, env=env)
        assert out.returncode == 0 and b"Traceback" not in out.stderr, (args, out.stderr)
        assert b"1 line(s)" in out.stderr and b"could not be read" in out.stderr
        assert out.stdout.count(b"812") == 1 and out.stdout.count(b"813") == 1


HOSTILE_OPERATOR = "\x1b]0;pwned\x07alice\x1b[2J\x1b[8m\nINJECTED-D local: FREED and verified"


@pytest.mark.parametrize("content", [
    "[1, 2]", "5", "null", '"text"', "{", "\xff\xfe garbage",
    json.dumps({"operator": "bob", "pid": 1, "since": "yesterday"}),
    json.dumps({"operator": "bob", "pid": 1, "since": 1e300}),
    '{"operator": "bob", "since": NaN}', '{"operator": "bob", "since": [1]}',
    json.dumps({"operator": HOSTILE_OPERATOR, "pid": 4242, "host": "h\u202eX", "since": 0}),
])
def test_whatever_a_held_lock_file_says_the_teardown_is_locked(ps, content):
    import fcntl
    import os

    from scripts.agent.teardown import hostlock
    from scripts.views import teardown as teardown_view

    h = dataclasses.replace(host(ps), run_dir=str(ps.base / "run"))
    os.makedirs(h.run_dir, mode=0o700)
    path = os.path.join(h.run_dir, hostlock.LOCK_NAME)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    os.write(fd, content.encode("utf-8", "surrogateescape") if content.isascii() else content.encode("latin-1"))
    fcntl.flock(fd, fcntl.LOCK_EX)  # held by this process: the agent's flock on its own open fails
    try:
        td = run_agent(h, requests.Teardown(grace=1, timeout=1))
    finally:
        os.close(fd)
    assert td.code == codes.EXIT_LOCKED and td.result.locked, td.doc
    line = teardown_view.report("local", td)
    assert line.startswith("== local: LOCKED: host is locked by another teardown: ") and "\n" not in line
    assert not any(c in line for c in "\x1b\x07\u202e")
    if "alice" in content:
        assert "\\x1b]0;pwned\\x07alice\\x1b[2J\\x1b[8m\\x0aINJECTED-D" in line


# -- one escaping point: nothing a host sends reaches a terminal raw -------------------------------

FORGED = b"INJECTED-A local: FREED and verified"
HOLD_AND_WRITE = r"""
import os, sys, time
dev, out, ready = sys.argv[1], os.fsencode(sys.argv[2]), sys.argv[3]
held = open(dev, "rb")
w = os.open(out, os.O_WRONLY | os.O_CREAT, 0o600)
open(ready, "w").close()
time.sleep(600)
"""


def forger(ps):
    """A GPU holder titled with a newline, an escape sequence, a bidi override and bytes that
    are not UTF-8, writing a file whose name holds the same: returns (pid, title, file name)."""
    import os

    title = b"sglang::scheduler_TP0\n" + FORGED + b"\x1b[2J\xe2\x80\xae\xff\xfe"
    name = os.fsencode(ps.base) + b"/ckpt\nINJECTED-B local: FREED\xff\xfe.bin"
    ready = ps.base / "forger-ready"
    p = subprocess.Popen([title, b"-c", HOLD_AND_WRITE.encode(), os.fsencode(ps.devdir / "nvidia0"), name,
                          os.fsencode(ready)], executable=sys.executable, start_new_session=True)
    ps.adopt(p.pid)
    wait_for(ready.exists, "the forger")
    return p.pid, title, name


def assert_nothing_forged(out: bytes):
    text = out.decode()
    lines = text.splitlines()
    assert not [line for line in lines if line.lstrip().startswith("INJECTED")], text
    assert not any(c in text for c in "\x1b\u202e\x07"), text
    assert "\\x0aINJECTED-A" in text, text


@pytest.mark.parametrize("args", [["status"], ["plan"], ["teardown", "--dry-run"], ["verify"]])
def test_a_newline_in_a_holders_argv_forges_no_line(ps, hosts_env, args):
    from tests.conftest import invoke

    pid, _, _ = forger(ps)
    hosts_env(scenario.env_lines(ps))
    out = invoke(*args, "--host", "local", env=dict(__import__("os").environ, COLUMNS="200"))
    assert b"Traceback" not in out.stderr, out.stderr
    assert_nothing_forged(out.stdout + out.stderr)
    assert str(pid).encode() in out.stdout
    if args[0] in ("status", "plan"):
        assert b"ckpt\\x0aINJECTED-B local: FREED\\xff\\xfe.bin" in out.stdout  # "pid N is writing ..."


def test_json_keeps_non_utf8_bytes_losslessly_in_valid_unicode(ps, hosts_env):
    from scripts.agent.procs import textsafe
    from tests.conftest import invoke

    pid, title, name = forger(ps)
    hosts_env(scenario.env_lines(ps))
    out = invoke("status", "--host", "local", "--json")
    text = out.stdout.decode("utf-8")  # strict: valid UTF-8
    assert "\\ud" not in text.lower()  # no surrogate escape: strict parsers accept it
    holder = next(h for h in json.loads(text)["local"]["holders"] if h["pid"] == pid)
    assert textsafe.encode(holder["argv"][0]) == title  # every byte back
    assert [textsafe.encode(f) for f in holder["write_files"]] == [name]
    assert "\uefff\ueffe" in holder["argv"][0]  # 0xFF 0xFE as U+EFFF U+EFFE (README: "--json and bytes")


def test_an_agent_that_dies_with_escape_sequences_on_stderr_is_one_clean_line(tmp_path, hosts_env):
    """The error line quotes the agent's stderr (a host's text): escaped, one line, exit 3."""
    from tests.conftest import invoke

    fake = tmp_path / "python3"
    fake.write_text(f"#!{sys.executable}\nimport sys\nsys.stdin.read()\n"
                    "sys.stderr.write('\\x1b]0;pwned\\x07boom\\x1b[2J\\u202e\\nFORGED local: FREED and verified\\n')\n"
                    "sys.exit(1)\n")
    fake.chmod(0o755)
    hosts_env(f"LOCAL_PYTHON={fake}\n")
    out = invoke("status", "--host", "local")
    err = out.stderr.decode()
    assert out.returncode == codes.EXIT_UNREACHABLE, err
    assert len(err.splitlines()) == 1 and not any(c in err for c in "\x1b\x07\u202e"), err
    assert "\\x1b]0;pwned\\x07boom" in err and "FORGED local: FREED and verified" in err
