"""Property-based tests (hypothesis): whatever bytes a host holds, nothing raises and nothing
reaches a terminal raw.

Random bytes are fed as argv, comm, /proc maps lines, fd link text and state-file contents
(the lock, last.json, the audit log, hosts.env) to the parsers, and random text into every
host field of the records the views render. Checked each time: no exception the code does not
document; every line shown is printable (textsafe.printable leaves it as it is: no control
character, newline inside a field, bidi override or zero-width mark); a value given back as
JSON is valid Unicode and, for bytes, the same bytes. Few examples each and no ssh: this file
runs in seconds. The /proc inputs are fake /proc trees in a temp dir (the readers take `proc=`).
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, example, given, settings, strategies as st

from scripts.agent.policy import program, rules
from scripts.agent.procs import procfs, procscan, textsafe
from scripts.agent.state import lastrun, statedir
from scripts.agent.teardown import hostlock
from scripts.agent.wire import records
from scripts.config.envfile import parse_text
from scripts.config.errors import ConfigError
from scripts.ops import audit_log
from scripts.views import render, status as status_view, teardown as teardown_view

FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
NASTY = "\n\r\t\x00\x07\x08\x0b\x0c\x1b\x7f\x85\x9b\u061c\u200b\u200e\u2028\u2029\u202e\u2066\u2069\ufeff" \
        "\udcff\uef80\ud800"
TEXT = st.text(alphabet=st.one_of(st.sampled_from(NASTY), st.characters()), max_size=30)
FORGED = "\nFORGED local: FREED and verified"
HOSTY = st.one_of(TEXT, TEXT.map(lambda t: t + FORGED))  # a host field, sometimes trying to forge a line
BYTES = st.binary(max_size=40)
PID = 4242


def clean_lines(text: str) -> bool:
    """Every line as printable leaves it, and none is a forged one."""
    return all(textsafe.printable(line) == line and not line.lstrip().startswith("FORGED")
               for line in text.split("\n"))


# -- the escaping rule itself -------------------------------------------------------------------

@given(TEXT)
@FAST
def test_printable_leaves_nothing_to_escape_and_is_idempotent(text):
    shown = textsafe.printable(text)
    assert "\n" not in shown and len(shown.splitlines() or [""]) == 1
    assert textsafe.printable(shown) == shown
    shown.encode("utf-8")  # no lone surrogate left either


@given(BYTES)
@FAST
def test_bytes_decode_to_valid_unicode_and_back(raw):
    assume(not re.search(rb"\xee[\xbe\xbf][\x80-\xbf]", raw))  # U+EF80..U+EFFF itself: the 128 reserved
    text = textsafe.decode(raw)
    text.encode("utf-8")  # strict: valid Unicode
    assert textsafe.encode(text) == raw


@given(st.recursive(st.one_of(TEXT, st.integers(), st.none()),
                    lambda kids: st.one_of(st.lists(kids, max_size=4), st.dictionaries(TEXT, kids, max_size=4)),
                    max_leaves=12))
@FAST
def test_json_out_is_always_valid_unicode(doc):
    text = textsafe.dumps(doc, sort_keys=True)
    json.loads(text)
    for s in _strings(json.loads(text)):
        s.encode("utf-8")  # a strict parser's view: no lone surrogate


def _strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


# -- argv and comm as bytes ------------------------------------------------------------------------

@given(st.lists(BYTES, max_size=6), BYTES)
@FAST
def test_any_argv_and_comm_are_named_matched_and_shown(argv_bytes, comm_bytes):
    argv = [textsafe.decode(a) for a in argv_bytes]
    comm = textsafe.decode(comm_bytes[:15])
    proc = {"pid": PID, "ppid": 1, "comm": comm, "argv": argv, "uid": 0, "state": "S", "start_time": 1,
            "cmdline": procscan.printable(" ".join(argv) if argv else "[%s]" % comm)}
    program.names(proc)
    program.identity(proc)
    rules.target_reason(proc, rules.DEFAULT_TARGETS + (r"sglang::.*", r"vllm serve"))
    rules.protect_reason(proc, set(), [r"keep\.me"])
    if argv:
        program.program_of(argv)
    cmd = render.Command(argv, proc["cmdline"])
    for n in (8, 30, 200):
        assert clean_lines(cmd.fit(n))
    assert clean_lines(str(cmd)) and clean_lines(proc["cmdline"])


def _stat_line(comm: bytes, state=b"S", ppid=1, start=987654) -> bytes:
    fields = [state, str(ppid).encode(), str(PID).encode(), str(PID).encode(), b"0", b"-1", b"4194560"] + \
        [b"0"] * 10 + [b"1", b"0", str(start).encode()] + [b"0"] * 30
    return str(PID).encode() + b" (" + comm + b") " + b" ".join(fields) + b"\n"


@pytest.fixture
def fake_proc(tmp_path):
    proc = tmp_path / "proc"
    (proc / str(PID) / "fd").mkdir(parents=True)
    (proc / str(PID) / "fdinfo").mkdir()
    return proc


@given(comm=st.binary(max_size=15).filter(lambda b: b"\0" not in b),
       argv=st.lists(BYTES.map(lambda b: b.replace(b"\0", b"")), max_size=5))
@FAST
def test_stat_and_cmdline_of_any_bytes_parse_to_what_the_kernel_wrote(fake_proc, comm, argv):
    d = fake_proc / str(PID)
    (d / "stat").write_bytes(_stat_line(comm))
    (d / "cmdline").write_bytes(b"".join(a + b"\0" for a in argv))
    st_ = procfs.read_stat(PID, str(fake_proc))
    assert (st_["comm"], st_["ppid"], st_["start_time"], st_["state"]) == (textsafe.decode(comm), 1, 987654, "S")
    info = procscan.basic(PID, str(fake_proc))
    assert [textsafe.encode(a) for a in info["argv"]] == argv  # every byte back (a NUL ends an argument)
    assert clean_lines(info["cmdline"])


# -- /proc maps lines ----------------------------------------------------------------------------

NEEDLE = (os.makedev(195, 0), 4242)  # a device's (st_dev, st_ino), as DeviceSet.inode_keys gives it
LINE = st.one_of(BYTES.map(lambda b: b.replace(b"\n", b" ")),
                 st.tuples(st.sampled_from([b"00:00 0", b"c3:00 4242", b"c3:00 42421"]),
                           BYTES.map(lambda b: b.replace(b"\n", b" "))).map(
                     lambda t: b"7f00-7f01 rw-s 00000000 " + t[0] + b"  /x/" + t[1]),
                 BYTES.map(lambda b: b"7f00-7f01 r--p 00000000 00:00 0 /tmp/ c3:00 4242 " + b.replace(b"\n", b" ")))


@given(st.lists(LINE, max_size=8))
@FAST
def test_maps_lines_of_any_bytes_count_a_device_by_its_columns_only(fake_proc, lines):
    (fake_proc / str(PID) / "maps").write_bytes(b"\n".join(lines) + (b"\n" if lines else b""))
    needles = {procscan._needle(NEEDLE): "/dev/nvidia0"}
    got = procscan.mapped_by_identity(PID, needles, str(fake_proc))
    want = any(line.split()[3:5] == [b"c3:00", b"4242"] for line in lines if len(line.split()) >= 5
               and line.startswith(b"7f00-7f01 rw-s"))
    assert got == (["/dev/nvidia0"] if want else [])


# -- fd link text --------------------------------------------------------------------------------

LINK = st.binary(min_size=1, max_size=60).filter(lambda b: b"\0" not in b)


@given(st.lists(LINK, min_size=1, max_size=4))
@FAST
def test_fd_links_of_any_bytes_are_listed_losslessly_and_shown_escaped(fake_proc, targets):
    d = fake_proc / str(PID)
    for f in list((d / "fd").iterdir()) + list((d / "fdinfo").iterdir()):
        f.unlink()
    for n, target in enumerate(targets, start=3):
        os.symlink(b"/" + target, os.fsencode(d / "fd" / str(n)))
        (d / "fdinfo" / str(n)).write_text("pos:\t0\nflags:\t0100001\nmnt_id:\t1\n")
    files = procscan.write_files(PID, str(fake_proc))
    for f in files:
        f.encode("utf-8")
        textsafe.encode(f)
    shown = render.note(status_view.writing_line(PID, files))
    assert clean_lines(shown)


# -- state files ---------------------------------------------------------------------------------

@given(BYTES)
@FAST
def test_a_lock_file_of_any_bytes_reads_as_a_holder_or_none_and_is_described_in_one_line(tmp_path, raw):
    path = tmp_path / "gpu-pivot.lock"
    path.write_bytes(raw)
    fd = os.open(path, os.O_RDONLY)
    try:
        holder = hostlock._read(fd)
    finally:
        os.close(fd)
    assert holder is None or isinstance(holder, dict)
    assert clean_lines(hostlock.describe(holder))


JSONISH = st.one_of(BYTES, st.recursive(st.one_of(TEXT, st.integers(), st.floats(), st.booleans(), st.none()),
                                        lambda kids: st.one_of(st.lists(kids, max_size=3),
                                                               st.dictionaries(st.sampled_from(
                                                                   list(lastrun.SUMMARY_KEYS) + ["agent", "x"]),
                                                                   kids, max_size=6)),
                                        max_leaves=10).map(lambda d: json.dumps(d).encode()))


@given(JSONISH)
@FAST
def test_a_last_json_of_any_content_loads_and_renders_in_clean_lines(tmp_path, monkeypatch, raw):
    run = tmp_path / "run"
    run.mkdir(mode=0o700, exist_ok=True)
    monkeypatch.setenv(statedir.RUN_DIR_ENV, str(run))
    path = run / "last.json"
    path.write_bytes(raw)
    path.chmod(0o600)
    summary = lastrun.load_summary()
    scan = records.ScanResult(hostname="h", gpus=[], holders=[], gpu_source="none", last_teardown=summary)
    assert clean_lines(status_view.last_teardown(scan))


@given(st.lists(st.one_of(JSONISH, BYTES), max_size=6))
@FAST
def test_an_audit_log_of_any_lines_is_read_counted_and_shown(tmp_path, monkeypatch, lines):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    d = audit_log.audit_dir()
    d.mkdir(parents=True, mode=0o700, exist_ok=True)
    (tmp_path / "state").chmod(0o700)
    path = audit_log.audit_path()
    path.write_bytes(b"\n".join(line.replace(b"\n", b" ") for line in lines))
    path.chmod(0o600)
    recs, skipped = audit_log.read_counted()
    assert len(recs) + skipped <= len(lines)
    assert all(audit_log.usable(r) for r in recs)
    rows = [[r.get("time", ""), r.get("alias", ""), r.get("operator", ""), r.get("signal") or r.get("event"),
             r.get("pid", r.get("to", "")), r.get("result") or r.get("verdict"),
             render.Command.of(r) if r.get("cmdline") else "-"] for r in recs]
    assert clean_lines(render.table(["time", "host", "operator", "action", "pid", "result", "command"], rows))


@given(TEXT)
@FAST
def test_a_hosts_env_of_any_text_is_values_or_one_clean_error_line(text):
    try:
        values, _ = parse_text(text, "hosts.env")
    except ConfigError as exc:
        assert clean_lines(str(exc)) and "\n" not in str(exc)
        return
    assert all(isinstance(v, str) for v in values.values())


# -- the views: random text in every host field ------------------------------------------------------

def holder(pid, user, unit, argv, files, why, container):
    return {"pid": pid, "ppid": 1, "user": user, "state": "S", "age_s": 3.0, "unit": unit,
            "container": container, "gpu_mib": {"0": 10}, "protected": why, "argv": argv,
            "cmdline": " ".join(argv), "devices": ["/dev/nvidia0"], "write_files": files, "mapped_devices": [],
            "start_time": 5, "comm": user[:15], "pgid": pid, "via": "signal", "reason": why or "a target"}


HOLDER = st.builds(holder, st.integers(2, 10 ** 6), HOSTY, st.one_of(st.none(), HOSTY),
                   st.lists(HOSTY, min_size=1, max_size=4), st.lists(HOSTY, max_size=2), st.one_of(st.none(), HOSTY),
                   st.one_of(st.none(), st.builds(lambda k, i, lab: {"kind": k, "id": i, "label": lab},
                                                  HOSTY, HOSTY, st.one_of(st.none(), HOSTY))))


@given(st.lists(HOLDER, min_size=1, max_size=3), HOSTY, HOSTY)
@FAST
def test_status_and_plan_views_show_every_host_field_in_clean_lines(holders, hostname, source):
    gpus = [{"index": 0, "name": hostname, "used_mib": 10, "reserved_mib": 0, "total_mib": 100,
             "processes": [{"pid": holders[0]["pid"], "used_mib": 10}],
             "health": {"verdict": "ok", "reasons": [source]}}]
    scan = records.ScanResult(hostname=hostname, gpus=gpus, holders=holders, gpu_source=source,
                               gpu_source_tried=[source], devices_glob=source, proc_hidden=source or None)
    for text in (status_view.header("local", scan, False), status_view.gpu_table(scan),
                 status_view.holder_table(scan), status_view.still_holding(
                     records.VerifyResult(scan=scan, free=False, problems=[source],
                                           still_holding=[dict(h, gpu=0, used_mib=1) for h in holders])),
                 status_view.verdict(records.VerifyResult(scan=scan, free=False, problems=[source, hostname]))):
        assert clean_lines(text), text
    plan = records.Plan(targets=holders, protected=holders[:1], left_alone=holders[1:],
                         units=[{"unit": h["user"], "pids": [h["pid"]], "disable": False} for h in holders],
                         writing=[{"pid": h["pid"], "files": h["write_files"]} for h in holders if h["write_files"]],
                         rules=[source])
    assert clean_lines(teardown_view.plan_tables(plan))


@given(HOSTY, st.integers(6, 60))  # 6: one \\uNNNN fits a line
@FAST
@example("0000\x1f\x1f\x1f" + FORGED, 20)  # a table cell cut right after the \x0a: FORGED began a line
@example("\x1f\x1f\x1f" + FORGED, 16)
def test_a_wrapped_host_string_never_starts_a_line_with_what_followed_a_newline(text, width):
    lines = render.wrap(textsafe.printable(text), width)
    assert all(not line.lstrip().startswith("FORGED") for line in lines), lines
    assert not any(re.search(r"\\(x[0-9a-f]?|u[0-9a-f]{0,3})$", line) for line in lines[:-1]), lines  # no escape cut
    assert "".join("".join(lines).split()) == "".join(textsafe.printable(text).split())  # nothing lost but spaces


@given(HOSTY, HOSTY, st.lists(HOLDER, min_size=1, max_size=2))
@FAST
@example("0000\x1f\x1f\x1f" + FORGED, "", [holder(2, "", None, [FORGED, "0000" + FORGED], [], None, None)])
def test_teardown_views_show_every_host_field_in_clean_lines(error, operator, holders):
    locked = records.TeardownResult(code=4, hostname=operator, locked=True, error=error)
    assert clean_lines(teardown_view.report("local", locked))
    actions = [{"signal": "SIGTERM", "pid": h["pid"], "result": error, "cmdline": h["cmdline"], "argv": h["argv"],
                "comes_back": operator} for h in holders]
    doc = {"command": "teardown", "exit_code": 1, "hostname": operator, "gpus": [], "holders": holders,
           "gpu_source": operator, "plan": {"targets": holders, "protected": [], "rules": [error]},
           "before": [], "after": [], "actions": actions, "problems": [error, operator],
           "still_holding": [dict(h, gpu=0, used_mib=1) for h in holders],
           "stuck": [{"pid": h["pid"], "state": "D", "gpu_mib": 1, "why": error} for h in holders],
           "appeared": [dict(h, why=error, include=operator) for h in holders],
           "adopted": [dict(h, reason=error) for h in holders],
           "concurrent_teardowns": [{"pid": 9, "user": operator, "cmdline": error}],
           "record_errors": [error], "signal_failures": [{"pid": 1, "signal": "SIGKILL", "result": error}],
           "freed_mib": 0, "signalled": 1, "wall_s": 1.0}
    try:
        record = records.read_document(doc)
    except records.ContractError as exc:  # the test's document and the contract drifted apart
        pytest.fail(str(exc))
    assert clean_lines(teardown_view.report("local", record))
    assert clean_lines(teardown_view.progress_line("local", {"phase": "verify", "elapsed_s": 1.0,
                                                              "problems": [error], "alive": [1]}))


def test_the_fake_proc_tree_is_read_through_its_own_path(fake_proc):
    """The readers above read the fake tree, never the machine's /proc."""
    (fake_proc / str(PID) / "stat").write_bytes(_stat_line(b"fake"))
    assert procfs.read_stat(PID, str(fake_proc))["comm"] == "fake"
    assert Path(fake_proc).is_dir()


@given(st.binary(max_size=120))
@FAST
def test_a_cgroup_file_of_any_bytes_names_a_unit_or_none(fake_proc, raw):
    """A user with a delegated cgroup subtree may name a cgroup with any bytes: reading it made
    the scan of that user's GPU holder raise UnicodeDecodeError."""
    from scripts.agent.procs import cgroup

    (fake_proc / str(PID) / "cgroup").write_bytes(raw)
    got = cgroup.read(PID, str(fake_proc))
    assert set(got) == {"path", "unit", "container"}
    json.loads(textsafe.dumps(got)) and textsafe.dumps(got).encode("utf-8")


def test_a_holder_in_a_cgroup_named_with_bytes_that_are_not_utf8_is_detailed(fake_proc):
    from scripts.agent.procs import cgroup

    (fake_proc / str(PID) / "stat").write_bytes(_stat_line(b"holder"))
    (fake_proc / str(PID) / "cmdline").write_bytes(b"python3\0-m\0x\0")
    (fake_proc / str(PID) / "cgroup").write_bytes(b"0::/system.slice/\xff\xfe.service\n")
    rec = procscan.detail(procscan.basic(PID, str(fake_proc)), ["/dev/nvidia0"], str(fake_proc))
    unit = cgroup.read(PID, str(fake_proc))["unit"]
    assert textsafe.encode(rec["unit"]) == b"\xff\xfe.service" == textsafe.encode(unit)
