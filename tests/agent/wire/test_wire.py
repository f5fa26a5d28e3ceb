"""The agent <-> local contract (scripts/agent/wire/): both sides really follow it.

The agent's parser is compared with the contract's table of subcommands and flags; the
argv the local side builds is parsed by the agent and recognised by it in /proc; real
results of the agent on this machine are read through the contract's records and rendered.
Teardowns here run on fake device files in a temp dir, scoped to a token and this uid, with
a private run dir: they can match no process the test did not start.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import stat
import sys

import pytest

from scripts.agent import cli
from scripts.agent.options import record
from scripts.agent.policy import rules
from scripts.agent.teardown import hostlock
from scripts.agent.wire import call, codes as wire_codes, frame, records, requests
from scripts.config.hostconfig import build_host
from scripts.ops.fleet import Outcome
from scripts.reach import bundle
from scripts.reach.transport import AgentError, AgentResult, call_agent
from scripts.views import (
    health as health_view,
    phase as phase_view,
    render,
    status as status_view,
    teardown as teardown_view,
)
from tests.support.subcommand_args import FULL, REQUIRED

# What each subcommand needs besides the argv the local side builds.


def subparsers() -> dict:
    parser = cli.build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices


def test_exit_code_table():
    codes = [c for c, _, _ in wire_codes.EXIT_CODES]
    names = [n for _, n, _ in wire_codes.EXIT_CODES]
    assert len(set(codes)) == len(codes) and len(set(names)) == len(names)
    constants = {v for k, v in vars(wire_codes).items() if k.startswith("EXIT_") and isinstance(v, int)}
    assert constants == set(codes)  # every EXIT_ constant has its row, every row its constant
    assert (wire_codes.EXIT_LOCKED, wire_codes.EXIT_UNINSPECTED, wire_codes.EXIT_INTERRUPTED) == (4, 6, 130)
    assert wire_codes.exit_name(4) == "locked" and wire_codes.exit_name(255) == "exit 255"


def test_the_agent_parser_has_exactly_the_contracts_subcommands_and_flags():
    parsers = subparsers()
    assert list(parsers) == list(call.SUBCOMMANDS)
    for name, own in call.SUBCOMMANDS.items():
        flags = {s for a in parsers[name]._actions for s in a.option_strings if s.startswith("--")} - {"--help"}
        want = set(call.COMMON_FLAGS) | set(own) | (set(call.SELECTION_FLAGS) if name in call.SELECTING
                                                           else set())
        assert flags == want, f"{name}: the agent has {sorted(flags - want)} beyond the contract, " \
                              f"lacks {sorted(want - flags)}"


def test_removed_flags_are_gone():
    parsers = subparsers()
    with pytest.raises(SystemExit):
        parsers["teardown"].parse_args(["--dry-run"])
    with pytest.raises(SystemExit):
        parsers["phase-start"].parse_args([*REQUIRED["phase-start"], "--no-systemd"])


def test_each_request_is_one_subcommand_and_the_options_have_a_typed_field_per_flag():
    assert [r.name for r in requests.REQUESTS] == list(call.SUBCOMMANDS) == list(FULL)
    assert set(record.Options.__annotations__) == set(record.FIELDS) | {"settle_auto"}


@pytest.mark.parametrize("subcommand", list(call.SUBCOMMANDS))
def test_argv_built_by_the_local_side_is_parsed_and_recognised_by_the_agent(subcommand):
    nonce = frame.new_nonce()
    request = FULL[subcommand]
    argv = call.agent_argv("python3", request, nonce, "/tmp/x/nvidia*", progress=True, run_dir="/tmp/r",
                           fake_devices=True, targets=("a",), protect=("b",), fake_gpus="/tmp/g", scope="/tmp/x/",
                           scope_uid=1000)
    # the request sends each of its flags and no other (--match: the selection's, for plan and teardown)
    sent = {str(w).split("=", 1)[0] for w in request.argv() if str(w).startswith("--")}
    assert sent - {"--match"} == set(request.flags)
    args = cli.parse(argv[2:])  # every flag a field of the one Options record
    assert args.command == subcommand and args.marker == nonce and args.progress and args.fake_devices
    if subcommand in call.SELECTING:
        assert (args.target, args.protect, args.scope, args.scope_uid) == (["a"], ["b"], "/tmp/x/", 1000)
    else:
        assert "--target" not in argv
    assert call.agent_call(argv) == subcommand
    assert hostlock.is_teardown_agent(argv) == (subcommand == "teardown")
    # the argv as this test's own process would carry it: an agent call protects only a process no user
    # could have started so (rules.trusted_names: root or a system uid, a root-owned program)
    proc = {"pid": os.getpid(), "argv": argv, "cmdline": " ".join(argv), "comm": "python3"}
    assert rules.protect_reason(proc, set()) == ("another gpu-pivot agent" if rules.trusted_names(proc) else None)
    assert os.geteuid() != 0 or rules.trusted_names(proc)


@pytest.mark.parametrize("argv", [
    ["bash", "-c", "python3 - teardown --marker 0a1b"],
    ["python3", "-", "teardown", "--devices", "x", "--marker", "NOT-HEX"],
    ["python3", "-", "teardown", "--devices", "x", "--json"],               # no marker: not from the transport
    ["pythonista", "-", "teardown", "--devices", "x", "--marker", "0a1b"],
    ["python3", "-", "reboot", "--devices", "x", "--marker", "0a1b"],      # not a subcommand
    ["python3", "tool.py", "-", "teardown", "--marker", "0a1b"],
])
def test_lookalikes_are_not_agents(argv):
    assert call.agent_call(argv) is None
    proc = {"pid": 4242, "argv": argv, "cmdline": " ".join(argv), "comm": os.path.basename(argv[0])}
    assert rules.protect_reason(proc, set()) is None


def test_markers_progress_and_spec_round_trip():
    text = "motd\n" + frame.frame("ab12", '{"a": 1}') + "noise\n"
    assert frame.extract(text, "ab12") == '{"a": 1}'
    with pytest.raises(frame.MarkerError, match="no result marker"):
        frame.extract(text, "cd34")
    line = frame.progress_line({"phase": "grace", "alive": [1, 2]})
    assert line.endswith("\n") and frame.parse_progress(line) == {"phase": "grace", "alive": [1, 2]}
    assert frame.parse_progress("plain output\n") is None
    assert frame.parse_progress(frame.PROGRESS_PREFIX + "{not json\n") is None
    assert frame.parse_progress(frame.PROGRESS_PREFIX + "[1, 2]\n") is None
    spec = {"name": "train", "argv": ["sh", "-c", "echo 'a b' $HOME; `x`"], "env": {"K": "v=1"}}
    assert frame.decode_spec(frame.encode_spec(spec)) == spec
    assert requests.Smoke(spec=spec).argv() == ["--spec", frame.encode_spec(spec)]
    assert " " not in frame.encode_spec(spec)


def test_a_result_missing_a_required_key_is_named():
    with pytest.raises(records.ContractError, match="teardown result has no 'plan'"):
        records.read("teardown", 0, {"hostname": "h", "before": [], "after": [], "wall_s": 1.0})
    with pytest.raises(records.ContractError, match="verify result has no 'free'"):
        records.read("verify", 0, {"hostname": "h", "gpus": [], "holders": [], "gpu_source": "none", "problems": []})
    locked = records.read("teardown", 4, {"locked": True, "error": "held by alice", "hostname": "h"})
    assert locked.locked and not locked.ran and locked.plan is None



def test_every_view_reads_a_record_what_carries_it_or_a_document_alike():
    """render.record, the one reader of a view's input: a record, the AgentResult carrying it
    and the agent's document (what --json prints) give the same display copy, every host
    string escaped, the record itself untouched; each kind of view takes all three."""
    gpu = {"index": 0, "name": "H200", "used_mib": 0, "reserved_mib": 0, "total_mib": 100, "processes": [],
           "health": {"verdict": "reset needed", "reasons": ["xid 79"]}}
    scan = {"command": "scan", "exit_code": 0, "hostname": "gpu\x1b[31m1", "gpus": [gpu], "holders": [],
            "gpu_source": "nvml"}
    rec = records.read_document(scan)
    inputs = [rec, AgentResult("h", 0, scan, 0.1, rec), scan]
    seen = [render.record(x) for x in inputs]
    assert seen[0] == seen[1] == seen[2] == render.shown(rec) and isinstance(seen[0], records.ScanResult)
    assert "\x1b" not in seen[0].hostname and rec.hostname == "gpu\x1b[31m1"
    for view in (lambda x: status_view.header("a", x, False), status_view.gpu_table, health_view.health):
        assert view(inputs[0]) == view(inputs[1]) == view(inputs[2]), view
    assert "RESET NEEDED" in health_view.health(scan)
    locked = {"command": "teardown", "exit_code": 4, "locked": True, "error": "held by alice", "hostname": "h"}
    t = records.read_document(locked)
    assert (teardown_view.report("a", locked) == teardown_view.report("a", AgentResult("h", 4, locked, 0.1, t))
            == teardown_view.report("a", t) == "== a: LOCKED: held by alice")
    start = {"command": "phase-start", "exit_code": 0, "started": True,
             "state": {"how": "setsid", "pid": 8, "start_time": 1, "log": "/run/x.log"}}
    r = records.read_document(start)
    assert (phase_view.start_line(start) == phase_view.start_line(r)
            == phase_view.start_line(AgentResult("h", 0, start, 0.1, r))
            == "started via setsid (pid 8, log /run/x.log)")


# -- the real agent on this machine, through the transport ----------------------------------------


@pytest.fixture
def host(tmp_path):
    devdir = tmp_path / "dev"
    devdir.mkdir()
    for i in range(2):
        (devdir / f"nvidia{i}").touch()
    run_dir = tmp_path / "run"
    keys = {"DEVICES": f"{devdir}/nvidia*", "FAKE_DEVICES": "yes", "TARGETS": r"gpvt-no-such-program",
            "SCOPE": f"{devdir}/"}
    return dataclasses.replace(build_host("local", keys, "test"), run_dir=str(run_dir), scope_uid=os.geteuid())


def test_real_results_read_through_the_contract_and_rendered(host):
    ping = call_agent(host, requests.Ping())
    assert isinstance(ping.result, records.PingResult) and ping.result.pid > 0
    assert "python 3." in status_view.ping_line("local", ping.result, ping.wall_s)
    scan = call_agent(host, requests.Scan())
    assert isinstance(scan.result, records.ScanResult) and scan.result.holders == []
    assert "no process" in status_view.holder_table(scan.result)
    assert status_view.holder_table(scan.doc) == status_view.holder_table(scan.result)  # a document reads the same
    verify = call_agent(host, requests.Verify())
    assert isinstance(verify.result, records.VerifyResult)
    assert status_view.verdict(verify.result).startswith("FREE" if verify.result.free else "NOT FREE")
    plan = call_agent(host, requests.Plan())
    assert isinstance(plan.result, records.PlanResult) and plan.result.plan.targets == []
    assert "problems" not in plan.doc  # a plan names none: the Slurm epilog reads none from it
    assert teardown_view.plan_tables(plan.result.plan).startswith("Targets: none")
    assert teardown_view.plan_tables(plan.doc["plan"]) == teardown_view.plan_tables(plan.result)
    seen = []
    td = call_agent(host, requests.Teardown(grace=1, timeout=2, settle=0.2), on_progress=seen.append)
    t = td.result
    assert isinstance(t, records.TeardownResult) and t.ran and t.plan.targets == [] and t.actions == []
    text = teardown_view.report("local", td)
    verdict = "FREED and verified" if td.code == wire_codes.EXIT_OK else "NOT FREE"
    assert f"local: {verdict}" in text
    # no GPU was read here (the fake source holds none): what was freed is unknown, never 0
    assert teardown_view.host_line(Outcome(host, value=td)).startswith(
        "local: freed an unknown amount, 0 target(s) stopped" if td.code == 0 else "local: NOT FREE")


def test_locked_teardown_and_unreachable_host_rendered(host):
    os.makedirs(host.run_dir, mode=0o700)
    fd = hostlock.acquire("alice@ops", path=os.path.join(host.run_dir, hostlock.LOCK_NAME))
    try:
        td = call_agent(host, requests.Teardown(grace=1, timeout=1))
    finally:
        hostlock.release(fd)
    assert td.code == wire_codes.EXIT_LOCKED and td.result.locked and "alice@ops" in td.result.error
    assert teardown_view.report("local", td).startswith("== local: LOCKED: ")
    outcomes = [Outcome(host, value=td), Outcome(dataclasses.replace(host, alias="gpu9"), error=AgentError("gone"))]
    assert teardown_view.host_line(outcomes[0]).startswith("local: LOCKED: ")
    assert teardown_view.host_line(outcomes[1]) == "gpu9: UNREACHABLE: gone"
    rows = teardown_view.summary(outcomes).splitlines()[3:]
    assert rows[0].split()[0] == "local" and rows[0].endswith("locked")
    assert rows[1].split()[0] == "gpu9" and rows[1].endswith("UNREACHABLE: gone") and rows[1].split()[5] == "3"


def test_a_result_the_contract_does_not_know_is_an_agent_error(host, tmp_path):
    """An agent whose result lacks a required key: exit 3 territory (AgentError), naming the key."""
    fake = tmp_path / "python3"
    fake.write_text(f"#!{sys.executable}\n"
                    "import json, sys\n"
                    "sys.stdin.read()\n"
                    "nonce = sys.argv[sys.argv.index('--marker') + 1]\n"
                    "print('=====gpu-pivot-result %s begin=====' % nonce)\n"
                    "print(json.dumps({'command': 'ping', 'exit_code': 0}))\n"
                    "print('=====gpu-pivot-result %s end=====' % nonce)\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    with pytest.raises(AgentError, match="ping result has no 'hostname'"):
        call_agent(dataclasses.replace(host, python=str(fake)), requests.Ping())


def test_the_bundle_carries_exactly_what_the_agent_imports():
    shipped = set(bundle.agent_modules())
    package = {".".join(p.relative_to(bundle.AGENT_DIR).with_suffix("").parts).removesuffix(".__init__")
               for p in bundle.AGENT_DIR.rglob("*.py") if "__pycache__" not in p.parts} - {"__init__"}
    # The rows' TypedDicts are for mypy only (records.py imports them under TYPE_CHECKING, by an
    # absolute import the bundle does not follow): they never ship. The records ship with the
    # subcommands that build their results through them.
    never = package - shipped
    types_only = {"wire.records", "wire.rows", "wire.gpu_rows"}
    assert never <= types_only, f"modules in scripts/agent the agent never imports: {sorted(never)}"
    assert "wire.rows" in never
    sources = bundle.agent_sources()
    assert not any(name in sources for name in ("agent.fuser_parse", "agent.ps_parse", "agent.markers"))
    assert "def table(" not in sources["agent.gpu.smi_parse"]  # the human table's parser is test-only


def test_the_bundle_finds_every_form_of_relative_import():
    """A module the agent imports but the bundle misses breaks on the host only: each form of
    `from . import` counts, with comments inside a parenthesised list, after `;` or `:`, in a
    subpackage (`..`), and the packages above a module ship with it."""
    source = ("from ..procs import (\n    procfs,  # the primitives\n    procscan,\n)\n"
              "if True: from ..gpu import mig\n"
              "x = 1; from . import plan\n"
              "def f():\n    from ..state.lastrun import read  # noqa\n")
    found = bundle.imported_modules("teardown.run", source)
    assert {"procs", "procs.procfs", "procs.procscan", "gpu", "gpu.mig", "teardown.plan", "state",
            "state.lastrun"} <= found
    assert "teardown.read" not in found and "state.lastrun.read" not in found


def test_a_result_is_written_through_its_record():
    """The agent makes the record before the document: a misspelt or missing field fails on the host."""
    doc = records.written(records.TeardownResult, {"timings": {"lock_s": 0.1}, "exit_code": None},
                          code=4, locked=True, error="host is locked", hostname="h")
    assert doc == {"timings": {"lock_s": 0.1}, "exit_code": 4, "locked": True, "error": "host is locked",
                   "hostname": "h"}
    assert records.read("teardown", doc["exit_code"], doc).locked
    with pytest.raises(TypeError, match="no field lockd"):
        records.written(records.TeardownResult, code=4, lockd=True)  # a misspelt field fails in the agent
    with pytest.raises(TypeError, match="'hostname' is required"):
        records.written(records.ScanResult, {"gpus": [], "holders": [], "gpu_source": "nvml"}, code=0)
