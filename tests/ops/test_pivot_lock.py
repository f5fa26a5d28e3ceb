"""A pivot keeps the host's lock from its teardown until its next phase is ready, and names a
process outside that phase which opened a GPU in between (exit 13). Real pivots through the
real CLI on a local host scoped to the test's fake GPUs; the gate (run between the teardown
and the start) is where the test looks at the lock and where an intruder comes in."""
from __future__ import annotations

import json
import os
import re
import shlex
import sys

from scripts.agent.teardown import hostlock
from tests.conftest import invoke
from tests.ops.test_pivot import local_env, out_text
from tests.support.procs import alive, wait_for

# argv: DEVICE [PIDFILE]: holds DEVICE open, writes its pid to PIDFILE once it does
HOLDER = """import os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR)
if len(sys.argv) > 2:
    with open(sys.argv[2] + ".new", "w") as f:
        f.write(str(os.getpid()))
    os.rename(sys.argv[2] + ".new", sys.argv[2])
time.sleep(600)
"""


def _holder(ps, *args: str) -> str:
    script = ps.base / "holder.py"
    script.write_text(HOLDER)
    return shlex.join([sys.executable, str(script), *args])


def _phase(ps, gate: str) -> dict:
    """A job phase whose own child holds GPU 0 (ready: 'holding'), behind `gate`."""
    runner = ps.base / "phase.sh"
    runner.write_text(f"{_holder(ps, str(ps.devdir / 'nvidia0'))} &\nwait\n")
    gates = ps.base / "gate.sh"
    gates.write_text(gate + "\n")
    return {"ARGV": json.dumps(["sh", str(runner)]), "READY": "holding", "READY_TIMEOUT": "20",
            "GATES": json.dumps([f"sh {gates}"])}


def _lock_free() -> bool:
    fd = hostlock.open_lock()
    try:
        return hostlock.try_flock(fd)
    finally:
        os.close(fd)


def test_the_lock_is_held_from_the_teardown_until_ready_and_the_phases_child_is_no_intruder(ps, hosts_env):
    lock = os.path.join(os.environ["GPU_PIVOT_RUN_DIR"], hostlock.LOCK_NAME)
    seen = ps.base / "lock-text"
    # passes only while someone holds the flock (util-linux flock -n fails on a held lock), and keeps its text
    gate = f"cat {shlex.quote(lock)} > {shlex.quote(str(seen))}; ! flock -n {shlex.quote(lock)} true"
    local_env(ps, hosts_env, {"job": _phase(ps, gate)})
    res = invoke("pivot", "--host", "local", "--to", "job", "--yes")
    text = out_text(res)
    try:
        assert res.returncode == 0, text
        assert "gates: passed" in text and "lock: kept for phase job until it is ready" in text
        assert "lock: released" in text and "INTRUDER" not in text
        held = json.loads(seen.read_text())
        assert held["hold"] == "pivot" and held["phase"] == "job" and alive(held["pid"]) is False
        assert _lock_free()
    finally:
        invoke("stop", "--host", "local", "--phase", "job")


def test_a_process_outside_the_phase_that_opens_a_gpu_before_ready_is_named_exit_13(ps, hosts_env):
    pidfile = ps.base / "intruder.pid"
    intruder = _holder(ps, str(ps.devdir / "nvidia1"), str(pidfile))
    gate = (f"setsid {intruder} </dev/null >/dev/null 2>&1 &\n"
            f"while [ ! -s {shlex.quote(str(pidfile))} ]; do sleep 0.05; done")
    local_env(ps, hosts_env, {"job": _phase(ps, gate)})
    res = invoke("pivot", "--host", "local", "--to", "job", "--yes")
    text = out_text(res)
    pid = int(wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), "the intruder's pid"))
    ps.adopt(pid)  # the test's gate started it: ended by the test, by pid
    try:
        assert res.returncode == 13, text
        assert f"INTRUDER pid {pid}" in text and "nvidia1" in text and "nvidia0" not in text.split("INTRUDER")[1]
        assert "a process outside the phase opened a GPU" in text and "lock: released" in text
        assert alive(pid)  # named, never signalled
        assert _lock_free()
    finally:
        invoke("stop", "--host", "local", "--phase", "job")


def test_pivot_help_lists_exit_13():
    res = invoke("pivot", "--help")
    assert re.search(r"\n +13 +a process outside the new phase opened a GPU", res.stdout.decode())


def test_a_teardown_call_cut_off_after_its_holder_started_is_still_released(monkeypatch):
    """The answer never came (ssh dropped, the deadline passed) but the agent may have handed
    the lock to its holder already: the pivot still sends `release` with its token, so the
    host is not locked until the holder's own deadline."""
    from types import SimpleNamespace

    from scripts.cli.pivot_words import WORDS
    from scripts.config.phases import build_phase
    from scripts.ops import pivot as pivot_ops, teardown as teardown_op
    from scripts.reach.route import HostTimedOut

    calls: list = []

    def agent(host, request, **_kw):
        calls.append((request.name, request.hold[2] if request.name == "teardown" else request.argv()))
        raise HostTimedOut("gpu9: no answer within 30s")

    monkeypatch.setattr(pivot_ops, "call_agent", agent)
    monkeypatch.setattr(teardown_op, "call_agent", agent)  # the pivot's step runs the operation
    host = SimpleNamespace(alias="gpu9", probe_mib=64, apply_settings=False, gpu_baseline={})
    phase = build_phase("gpu9", "train", {"CMD": "true"})
    lines: list = []
    code = pivot_ops.Pivot(host, phase, pivot_ops.PivotOptions(), WORDS, out=lines.append).run()
    token = calls[0][1]
    assert code == 7 and ("release", ["--token", token]) in calls, (code, calls)
    assert any("lock: NOT released" in line for line in lines), lines
