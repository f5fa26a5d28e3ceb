"""The teardown's first SIGTERM batch (scripts/agent/teardown/early.py): what a target pattern names goes
out as soon as every process's record is read, before the fd tables and maps are; the rest of
the plan (holders no pattern names) follows once the scan is complete, and the plan states both.
Every process is started here and scoped by the test's temp dir (fake devices + --scope)."""
from __future__ import annotations

import dataclasses
import errno
import json
import os
import signal
import subprocess
import sys

import pytest

from scripts.agent import cli
from scripts.agent.gpu import gpuinfo
from scripts.agent.holders import scan
from scripts.agent.policy import rules
from scripts.agent.procs import cgroup, procscan
from scripts.agent.teardown import early, plan, run as teardown
from scripts.agent.wire import requests
from scripts.config.hostconfig import build_host
from tests.conftest import REPO
from tests.support import scenario
from tests.support.agent_inproc import run_agent
from tests.support.procs import alive, children, wait_for

TARGETS = r"sandbox_roles\.py|sglang\.launch_server"


def _teardown(ps, approved=None):
    keys = dict(scenario.host_keys(ps), TARGETS=r"sglang\.launch_server")  # the orphan's sandbox_roles.py: not named
    host = dataclasses.replace(build_host("local", keys, "test"), fake_gpus=str(ps.memdir))
    return run_agent(host, requests.Teardown(grace=2, timeout=10, settle=0.5, approved=approved))


def test_pattern_targets_go_first_and_the_orphan_holder_with_the_plan(ps):
    ready = ps.base / f"ready{ps.n + 1}"
    server = scenario._server(ps, "--tp", "2", "--memdir", str(ps.memdir))
    workers = [int(p) for p in ready.read_text().split()]  # its tree: named by nothing but their parent
    orphan = scenario._orphan(ps)  # holds GPU 0, named by no pattern: found by the fd scan only
    res = _teardown(ps)
    doc = res.doc
    assert res.code == 0, doc["problems"]
    assert doc["timings"]["early_batch"] == 3, doc["timings"]  # the server and its two workers
    assert doc["timings"]["sigterm_s"] <= doc["timings"]["plan_sigterm_s"]
    # the GPU source opens right after the first batch, while the scan goes on: not after the plan
    assert doc["timings"]["sigterm_s"] <= doc["timings"]["source_start_s"] <= doc["timings"]["planned_s"]
    sigterms = [a["pid"] for a in doc["actions"] if a["signal"] == "SIGTERM"]
    assert sorted(sigterms[:3]) == sorted([server, *workers]) and orphan in sigterms[3:], doc["actions"]
    reasons = {t["pid"]: t["reason"] for t in doc["plan"]["targets"]}
    assert "target pattern" in reasons[server] and reasons[orphan].startswith("holds a GPU")
    assert not alive(server) and not alive(orphan)


def test_the_early_batch_signals_only_what_the_operator_approved(ps):
    server = scenario._server(ps, "--tp", "1", "--memdir", str(ps.memdir))
    orphan = scenario._orphan(ps)
    start = procscan.basic(orphan)["start_time"]
    res = _teardown(ps, approved=f"{orphan}:{start}")
    assert "early_batch" not in res.doc["timings"], res.doc["timings"]
    assert [a["pid"] for a in res.doc["actions"] if a["signal"].startswith("SIG")] == [orphan]
    assert alive(server)  # in the plan, not approved: never signalled
    assert any(u["pid"] == server for u in res.doc["unapproved"])


def _args(ps, *extra):
    return cli.parse(["teardown", "--devices", ps.glob, "--fake-devices", "--target", TARGETS,
                      "--scope", str(ps.base), *extra])


def _marked(args, pids):
    mark = scan._target_mark(args.selection)
    out = []
    for pid in pids:
        info = procscan.basic(pid)
        info["mark"] = mark(info)
        out.append(info)
    return out


def test_a_process_in_a_service_unit_or_a_container_is_left_to_the_full_plan(ps, monkeypatch):
    """Its manager may have to stop it (a direct SIGTERM races the stop: Restart=always)."""
    plain, in_unit, in_container = (ps.role("worker", "--gpu", str(i % 2)) for i in range(3))
    args = _args(ps)
    real = cgroup.read

    def read(pid, proc="/proc"):
        cg = dict(real(pid, proc))
        if pid == in_unit:
            cg["unit"] = "vllm.service"
        if pid == in_container:
            cg["container"] = {"kind": "docker", "id": "a" * 64}
        return cg

    monkeypatch.setattr(cgroup, "read", read)
    rows = early.pick(_marked(args, [plain, in_unit, in_container]), args.selection, None)
    assert [r["pid"] for r in rows] == [plain]
    assert rows[0]["via"] == "signal"


def test_the_early_batch_takes_what_the_plan_takes_by_pattern_and_nothing_else(ps):
    """Out of scope, protected, this agent's own chain or not named: never in it."""
    named = ps.role("worker", "--gpu", "0")
    protected = ps.role("hold", title="nvidia-persistenced")
    args = _args(ps)
    records = _marked(args, [named, protected, os.getpid()])
    records[2]["mark"] = "pretend a pattern named the agent's own chain"
    rows = early.pick(records, args.selection, None)
    assert [r["pid"] for r in rows] == [named]
    out_of_scope = _args(ps, "--scope", "no-such-scope-text")
    assert early.pick(_marked(out_of_scope, [named]), out_of_scope.selection, None) == []


def test_the_plan_states_every_early_target_even_one_gone_before_the_full_scan(ps):
    args = _args(ps)
    worker = ps.role("worker", "--gpu", "0")
    rows = early.pick(_marked(args, [worker]), args.selection, None)
    merged = early.merge({"targets": []}, rows)
    assert [t["pid"] for t in merged["targets"]] == [worker]
    again = early.merge({"targets": list(rows)}, rows)
    assert len(again["targets"]) == 1
    assert early.as_plan(rows, args.selection)["rules"] == list(plan.RULES)


STANDIN = REPO / "tests" / "support" / "standin" / "nvml"  # NVML stand-in replaying a recording (no GPU here)
H200 = {"uuid": "GPU-0", "name": "NVIDIA H200", "bus": "00000000:19:00.0", "used": 0, "reserved": 645922816,
        "total": 150754820096, "processes": []}


def test_before_is_read_from_the_gpu_source_after_the_signals(ps, tmp_path):
    """With a driver to read (not the sandbox's fake source), "before" is NVML's read right
    after the signals, and freed_mib comes from it (it once said [] and -8192)."""
    rec = tmp_path / "rec.json"
    rec.write_text(json.dumps({"gpus": [dict(H200, used=8 << 30)]}))
    worker = ps.role("worker", "--gpu", "0")
    env = dict(os.environ, PYTHONPATH=str(STANDIN), GPU_PIVOT_NVML_RECORDING=str(rec))
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "gpuagent.py"), "teardown", "--json", "--devices",
                           ps.glob, "--fake-devices", "--target", TARGETS, "--scope", str(ps.base), "--grace", "2",
                           "--timeout", "3", "--settle", "0", "--run-dir", str(tmp_path / "run")],
                          capture_output=True, text=True, env=env, timeout=60, cwd=REPO)
    doc = json.loads(done.stdout)
    assert not alive(worker) and doc["gpu_source"] == "nvml" and len(doc["after"]) == 1, doc
    assert len(doc["before"]) == 1 and doc["freed_mib"] >= 0, (doc["before"], doc["freed_mib"])


def test_a_failure_after_the_early_batch_is_seen_through_and_recorded(ps, tmp_path, monkeypatch):
    """The manager's stop cannot be started (EAGAIN at a process limit) after the early batch
    went out: the early targets are still seen through and the plan is recorded (exit 3),
    instead of an agent error with SIGTERMs sent and nothing written."""
    plain = ps.role("worker", "--gpu", "0")  # the early batch
    in_unit = ps.role("worker", "--gpu", "1")  # left to `systemctl stop`
    real = cgroup.read

    def read(pid, proc="/proc"):
        cg = dict(real(pid, proc))
        if pid == in_unit:
            cg["unit"] = "gpv-test-fake.service"
        return cg

    def no_fork(*_a, **_k):
        raise OSError(errno.EAGAIN, "Resource temporarily unavailable")

    monkeypatch.setattr(cgroup, "read", read)
    monkeypatch.setattr(plan, "systemd_running", lambda: True)
    monkeypatch.setattr(subprocess, "Popen", no_fork)
    monkeypatch.setenv("GPU_PIVOT_RUN_DIR", str(tmp_path / "run"))
    saved = {s: signal.getsignal(s) for s in (signal.SIGHUP, signal.SIGINT, signal.SIGPIPE)}
    args = _args(ps, "--fake-gpus", str(ps.memdir), "--grace", "1", "--timeout", "3", "--settle", "0")
    rules.trust_own_names(True)
    try:
        code, doc = teardown.run(args)
    finally:
        rules.trust_own_names(False)
        for s, h in saved.items():
            signal.signal(s, h)
    assert code == 3 and doc["verdict"] == "not verified", doc
    assert "Resource temporarily unavailable" in doc["error"]
    assert {t["pid"] for t in doc["plan"]["targets"]} >= {plain, in_unit}
    assert any(a["pid"] == plain and a["signal"] == "SIGTERM" for a in doc["actions"])
    assert not alive(plain)


def test_with_an_early_batch_the_gpus_are_read_before_it_goes_out(ps):
    """The sandbox's GPU memory is what its live processes declare: read after the early batch,
    the targets would be releasing it and "before" (freed_mib) came out short (CI saw 1024 of
    41984 MiB). The callback here ends the server's whole tree before returning."""
    ready = ps.base / f"ready{ps.n + 1}"
    server = scenario._server(ps, "--tp", "2", "--memdir", str(ps.memdir))
    tree = [server, *(int(p) for p in ready.read_text().split())]
    args = _args(ps, "--fake-gpus", str(ps.memdir))
    source = gpuinfo.SandboxSource(str(ps.memdir), ps.glob)
    held = sum(g["used_mib"] for g in source.read())
    assert held > 0

    def end_the_tree(records, table=()):
        for pid in tree:
            os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not any(alive(p) for p in tree), "the tree gone")

    doc = scan.collect(args.selection, source, early=end_the_tree)
    assert sum(g["used_mib"] for g in doc["gpus"]) == held


def _detached(ps, *argv):
    """A process reparented away from this test (its parent shell exits): (pid, start_time)."""
    out = subprocess.run(["sh", "-c", '"$@" >/dev/null 2>&1 </dev/null & echo $!', "sh", *argv],
                         capture_output=True, text=True, check=True, timeout=30)
    pid = int(out.stdout)  # ended by the test, by PID
    wait_for(lambda: procscan.basic(pid)["ppid"] != os.getpid(), "the process away from its shell")
    return pid, procscan.basic(pid)["start_time"]


def test_a_reused_pid_never_hands_over_a_tree(ps):
    """A bystander's parent died and the bystander went to PID 1; the dead parent's pid went to
    a new target. A parent table read before that (the scan's first stage) still lists the
    bystander under that pid: neither its start (before the target's) nor its parent now (not
    the target) lets it into the target's tree, in the early batch or the full plan."""
    args = _args(ps)
    older, older_start = _detached(ps, "sleep", "120")  # the bystander: started first
    target = ps.role("worker", "--gpu", "0")  # the named target, started after it
    target_start = procscan.basic(target)["start_time"]
    assert older_start <= target_start
    try:
        table = [(target, 1, target_start), (older, target, older_start)]  # the stale row
        rows = early.pick(_marked(args, [target]), args.selection, None, table)
        assert [r["pid"] for r in rows] == [target], rows
        procs = {p: procscan.basic(p) for p in (target, older)}
        procs[older]["ppid"] = target  # as a torn full scan would read it
        picked = plan._Picked(procs, set(), args.selection)
        picked.add(target, "target pattern")
        picked.trees([target], {target: [older]})
        if older_start < target_start:  # the same clock tick: only the parent check above can tell
            assert older not in picked.reasons, picked.reasons
    finally:
        os.kill(older, signal.SIGKILL)


def test_a_child_that_moved_to_another_parent_is_not_in_the_tree(ps):
    """The same stale row with a bystander started after the target (its start cannot tell):
    the early batch re-reads it and finds another parent."""
    args = _args(ps)
    target = ps.role("worker", "--gpu", "0")
    target_start = procscan.basic(target)["start_time"]
    later, later_start = _detached(ps, "sleep", "120")
    try:
        table = [(target, 1, target_start), (later, target, later_start)]
        rows = early.pick(_marked(args, [target]), args.selection, None, table)
        assert [r["pid"] for r in rows] == [target], rows
    finally:
        os.kill(later, signal.SIGKILL)


def test_the_agents_own_scan_workers_are_never_targets(ps, monkeypatch):
    """The scan's workers run the agent's own program (a pattern such as `gpuagent` names them):
    while this agent is their parent they are protected; a pid of one that is reaped and
    reused by anything else is not."""
    from scripts.agent.procs import procfs

    args = _args(ps)
    worker = ps.role("worker", "--gpu", "0")
    records = _marked(args, [worker])
    assert records[0]["mark"], records  # a pattern names it
    records[0]["ppid"] = os.getpid()  # as the agent's own fork reads
    assert [r["pid"] for r in early.pick(records, args.selection, None)] == [worker]  # a child of ours, no worker
    monkeypatch.setattr(procfs, "OWN_WORKERS", {worker})
    assert rules.protect_reason(records[0], set()) == "this gpu-pivot agent's scan worker"
    assert early.pick(records, args.selection, None) == []
    records[0]["ppid"] = 1  # the same pid under another parent: a reused pid, anyone's
    assert rules.protect_reason(records[0], set()) is None


def test_a_scan_records_its_workers(tmp_path, monkeypatch):
    from scripts.agent.procs import devices, fanout, procfs

    monkeypatch.setattr(procfs, "OWN_WORKERS", set())
    monkeypatch.setattr(fanout, "workers_for", lambda n: 2)
    (tmp_path / "nvidia0").touch()
    snap = procscan.snapshot(devices.DeviceSet(str(tmp_path / "nvidia*"), fake=True))
    assert snap["workers"] == 2 and len(procfs.OWN_WORKERS) == 2, snap["workers"]


LAUNCHER = "import subprocess, sys\nwhile True:\n    subprocess.run([sys.argv[1], '2'])\n"


def _xcrash(ps):
    """A program of the test's own named xcrash (a copy of sleep): what another job runs."""
    crash = ps.base / "xcrash"
    crash.write_bytes(open("/bin/sleep", "rb").read())
    crash.chmod(0o755)
    return crash


def _in_process_teardown(args, monkeypatch):
    """teardown.run in this process, as an agent started now: only what starts from here on
    counts as started during the teardown (a real agent's own start time; this one's is the
    test run's)."""
    class StartedNow(teardown.Targets):
        def __init__(self, *a, **k):
            super().__init__(*a, **dict(k, since_ticks=int(scan.procfs_now_ticks())))

    monkeypatch.setattr(teardown, "Targets", StartedNow)
    saved = {s: signal.getsignal(s) for s in (signal.SIGHUP, signal.SIGINT, signal.SIGPIPE)}
    rules.trust_own_names(True)
    try:
        return teardown.run(args)
    finally:
        rules.trust_own_names(False)
        for s, h in saved.items():
            signal.signal(s, h)


@pytest.mark.parametrize("how", ["caught gone at plan time", "run by a shell loop"])
def test_what_starts_a_target_the_operator_did_not_approve_is_not_watched(ps, tmp_path, monkeypatch, how):
    """This teardown (--approved: the Slurm epilog's way) is for the worker only. Another job's
    launcher runs a target program (2 s a run): a Python loop whose run the plan caught gone
    (made certain here: the plan keeps such targets in `gone` and watches what started them),
    or a shell loop (a supervisor of it, by the plan). Neither is this teardown's to watch: the
    launcher's next run, in the settle window, is not our respawn (seen: NOT FREE and the
    node drained, 10 in 11, for the gone one; the shell loop's, older, the same way)."""
    crash = _xcrash(ps)
    argv = ([sys.executable, "-c", LAUNCHER, str(crash)] if how.startswith("caught")
            else ["bash", "-c", f"while :; do {crash} 2; done"])
    launcher = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
    ps.adopt(launcher.pid)

    def run_now():  # the launcher's current run of xcrash, once its exec is done
        kids = [procscan.basic(p) for p in children(launcher.pid)]
        return next((k["pid"] for k in kids if k and k["comm"] == "xcrash"), None)

    worker = ps.role("worker", "--gpu", "0")
    first = wait_for(run_now, "the launcher's first run")
    wait_for(lambda: run_now() not in (None, first), "the launcher's next run")  # ~2 s left: the plan sees it
    real = procscan.detail
    caught: list = []

    def caught_gone(info, held, *a, **k):  # the launcher's run exits between the scan and its details
        out = real(info, held, *a, **k)
        if info["comm"] == "xcrash":
            out["gone"] = True
            caught.append(info["pid"])
        return out

    if how.startswith("caught"):
        monkeypatch.setattr(procscan, "detail", caught_gone)
    monkeypatch.setenv("GPU_PIVOT_RUN_DIR", str(tmp_path / "run"))
    approved = f"{worker}:{procscan.basic(worker)['start_time']}"
    args = _args(ps, "--target", "xcrash", "--fake-gpus", str(ps.memdir), "--grace", "1", "--timeout", "10",
                 "--settle", "4", "--approved", approved)
    code, doc = _in_process_teardown(args, monkeypatch)
    assert caught or not how.startswith("caught"), "the launcher's run was never among the plan's details"
    assert code == 0, (doc.get("problems"), doc.get("respawned"))
    assert not alive(worker) and launcher.poll() is None and run_now() != first  # it ran again meanwhile


def test_what_the_early_batch_signalled_is_never_listed_as_gone(ps, tmp_path):
    """The early batch's targets that exited before the plan read their details are merged into
    the plan's targets (they were signalled): its `gone` (not signalled) must not list them."""
    ps.role("worker", "--gpu", "0")
    ps.role("worker", "--gpu", "1")
    result = _teardown(ps)
    sent = {(a["pid"], a.get("start_time")) for a in result.doc["actions"] if a["signal"] == "SIGTERM"}
    sent_pids = {pid for pid, _ in sent}
    assert result.code == 0, result.doc.get("problems")
    assert [g["pid"] for g in result.doc["plan"].get("gone", []) if g["pid"] in sent_pids] == []
    rows = [{"pid": 7, "start_time": 70}]
    merged = early.merge({"targets": [], "gone": [dict(rows[0], comm="x")]}, rows)
    assert merged["gone"] == [] and [t["pid"] for t in merged["targets"]] == [7]


SESSION_LAUNCHER = "import subprocess, sys\nsubprocess.run([sys.executable, sys.argv[1]])\n"


def test_a_supervisor_above_an_approved_target_is_watched_past_a_session_leader(ps, tmp_path, monkeypatch):
    """A shell loop runs `setsid python launcher.py` (a target, not approved: a session leader,
    no wrapper), which runs the approved worker. The loop wraps only the launcher, and the
    ancestry walk ends at a session leader; still the loop is above the approved target and
    starts it again: a respawn, NOT FREE (seen: the --approved supervisor filter dropped
    the loop, and the restarted worker was 'an unrelated job': FREED)."""
    (ps.base / "lnchrt.py").write_text(SESSION_LAUNCHER)
    (ps.base / "wrkrt.py").write_text("import time\ntime.sleep(1000)\n")
    loop = subprocess.Popen(["bash", "-c", f"while :; do setsid {sys.executable} {ps.base}/lnchrt.py "
                                           f"{ps.base}/wrkrt.py; sleep 0.3; done"], stdin=subprocess.DEVNULL)
    ps.adopt(loop.pid)

    def now():  # (launcher, worker) as the loop runs them
        kids = [k for k in children(loop.pid) if "lnchrt" in (procscan.basic(k) or {}).get("cmdline", "")]
        w = [w for w in children(kids[0]) if "wrkrt" in (procscan.basic(w) or {}).get("cmdline", "")] if kids else []
        return (kids[0], w[0]) if w else None

    _, worker = wait_for(now, "the launcher and its worker")
    monkeypatch.setenv("GPU_PIVOT_RUN_DIR", str(tmp_path / "run"))
    args = _args(ps, "--target", "lnchrt|wrkrt", "--fake-gpus", str(ps.memdir), "--grace", "1", "--timeout", "10",
                 "--settle", "3", "--approved", f"{worker}:{procscan.basic(worker)['start_time']}")
    code, doc = _in_process_teardown(args, monkeypatch)
    assert not alive(worker)
    again = wait_for(now, "the loop's next worker")
    assert again[1] != worker
    assert code != 0 and doc.get("appeared"), (code, doc["plan"]["starters"], doc.get("ignored"))


# opens the job's GPU after a delay (a model load), then runs
JOB_SERVER = ("import os, sys, time\ntime.sleep(float(sys.argv[2]))\nfd = os.open(sys.argv[1], os.O_RDONLY)\n"
              "time.sleep(600)\n")


def test_a_jobs_watchdog_restarting_its_server_by_double_fork_is_counted_against_the_job(ps, tmp_path, monkeypatch):
    """The Slurm epilog's agent (no pattern: targets are the holders; --approved the job's). The
    job's watchdog (a double-forked loop that outlived the job) restarts its server with
    `( python3 server.py & )`, and a restart opens the job's GPU only seconds later (a model
    load). The restart appears in the settle window, reparented to PID 1, holding nothing yet:
    it counts against the job (the epilog drains), never excused for holding nothing yet (red
    team: such an excuse let the epilog exit 0 with the restart about to hold the GPU)."""
    import types

    from scripts.engines import slurm_job

    server, pidfile, dev = ps.base / "jobsrv.py", ps.base / "srv.pid", ps.devdir / "nvidia0"
    server.write_text(JOB_SERVER)
    stop = ps.base / "stop"
    loop = (f"d=0; while [ ! -e {stop} ]; do if ! kill -0 $(cat {pidfile} 2>/dev/null) 2>/dev/null; then "
            f"( {sys.executable} {server} {dev} $d & echo $! > {pidfile} ); d=4; fi; sleep 0.2; done")
    watchdog = subprocess.Popen(["setsid", "bash", "-c", loop], stdin=subprocess.DEVNULL,
                                env=dict(os.environ, SLURM_JOB_ID="12"))
    ps.adopt(watchdog.pid)

    def current():
        text = pidfile.read_text().strip() if pidfile.exists() else ""
        return int(text) if text else None

    first = wait_for(current, "the first server")
    ps.adopt(first)
    wait_for(lambda: str(dev) in [os.path.realpath(f"/proc/{first}/fd/{f}") for f in os.listdir(f"/proc/{first}/fd")],
             "the server holds nvidia0")
    monkeypatch.setenv("GPU_PIVOT_RUN_DIR", str(tmp_path / "run"))
    args = cli.parse([
        "teardown", "--devices", ps.glob, "--fake-devices", "--target", "\x00", "--scope", str(ps.base),
        "--scope-uid", str(os.getuid()), "--fake-gpus", str(ps.memdir), "--grace", "1", "--timeout", "3",
        "--settle", "3", "--approved", f"{first}:{procscan.basic(first)['start_time']}"])
    try:
        code, doc = _in_process_teardown(args, monkeypatch)
    finally:
        stop.touch()  # the watchdog ends its loop; its last restart is ended by pid
        wait_for(lambda: watchdog.poll() is not None, "the watchdog's end")
        if current() not in (None, first):
            ps.adopt(current())
    appeared = doc.get("appeared") or []
    assert not alive(first) and code == 1 and appeared, (code, doc.get("problems"))
    job = slurm_job.Job(id="12", uid=os.getuid(), gpus=(0,), node=None)
    assert slurm_job._appeared(types.SimpleNamespace(appeared=appeared), job) == appeared
