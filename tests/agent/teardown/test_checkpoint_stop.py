"""A phase's checkpoint stop (agent/teardown/checkpoint.py): its signal, a wait for a checkpoint
or idle, then the usual TERM -> KILL.

Real processes: a training job of the test's own (a small python script holding a fake GPU
device, so the scoped teardown makes it a target) started as a phase through the agent's
phase-start, so the phase's state on the host names it. On its signal it checkpoints in the
way each case needs: slowly (the file open for writing until the test lets it close), never,
into a file it keeps open, as another uid's file, through a link. What ends a wait that is
not a checkpoint is the phase's idle condition (a marker the job writes once done), so no
case depends on how long anything takes. Every path and scope is the test's own temp dir.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

import pytest

from scripts.agent.phases import run as agent_phase
from scripts.agent.wire import requests
from scripts.config.errors import ConfigError
from scripts.config.phases import build_phase
from scripts.ops import phase as phase_ops
from scripts.views import phase as phase_view, teardown as teardown_view
from tests.support.agent_inproc import run_agent
from tests.support.ckpt_job import JOB
from tests.support.procs import alive, wait_for
from tests.support.teardowns import host as scoped_host


class Job:
    """The test's training job as phase `train` of a host scoped to the ProcessSet."""

    def __init__(self, ps, mode, deadline="60", idle=True, uid=None, to=None, child=False):
        self.ps = ps
        self.ckdir = ps.base / "ckpt"
        self.ckdir.mkdir(exist_ok=True)
        self.log, self.done, self.go = ps.base / "job.log", ps.base / "done", ps.base / "go"
        self.ckpt = self.ckdir / "step-1.pt"
        script = ps.base / "ckjob.py"
        script.write_text(JOB)
        spec = ps.base / "ckjob.json"
        spec.write_text(json.dumps({"log": str(self.log), "device": str(ps.devdir / "nvidia0"), "mode": mode,
                                    "ready": str(ps.base / "ckjob.ready"), "ckpt": str(self.ckpt),
                                    "done": str(self.done), "go": str(self.go), "uid": uid,
                                    "elsewhere": str(ps.base / "elsewhere.pt"),
                                    "child": str(ps.base / "ckjob.child") if child else None}))
        keys = {"ARGV": json.dumps([sys.executable, str(script), str(spec)]), "READY": "alive",
                "STOP_SIGNAL": "USR1", "STOP_CHECKPOINT": f"{self.ckdir}/step-*.pt", "STOP_DEADLINE": deadline}
        if idle:
            keys["STOP_IDLE"] = f"test -e {self.done}"
        if to:
            keys["STOP_SIGNAL_TO"] = to
        self.phase = build_phase("local", "train", keys)
        self.host = dataclasses.replace(scoped_host(ps, TARGETS=r"ckjob\.py"), phases={"train": self.phase})

    def start(self):
        r = phase_ops.start(self.host, self.phase)
        assert r.code == 0, r.doc
        self.wrapper = agent_phase.load_state("train")["pid"]
        self.ps.adopt(self.wrapper)
        self.pid = int(wait_for(lambda: (self.ps.base / "ckjob.ready").exists()
                                and (self.ps.base / "ckjob.ready").read_text(), "the job is ready"))
        self.ps.adopt(self.pid)
        child = self.ps.base / "ckjob.child"
        if json.loads((self.ps.base / "ckjob.json").read_text())["child"]:
            self.child = int(wait_for(lambda: child.exists() and child.read_text(), "the job's worker"))
            self.ps.adopt(self.child)
        return self

    def teardown(self, on_progress=None):
        return run_agent(self.host, requests.Teardown(grace=1, timeout=10), on_progress=on_progress)

    def lines(self):
        return self.log.read_text().splitlines() if self.log.exists() else []


def _stop(r):
    (stop,) = r.result.checkpoint_stops
    return stop


def _signals(r, pid):
    return [a["signal"] for a in r.result.actions if a["pid"] == pid]


def test_teardown_waits_until_the_checkpoint_is_closed_then_stops_the_job(ps):
    job = Job(ps, "slow").start()
    seen = []

    def progress(p):  # the job closes its checkpoint only once the agent has seen it open
        if p.get("phase") == "checkpoint" and any("still open for writing" in n for n in p.get("problems") or []):
            seen.append(p["problems"][0])
            job.go.touch()

    r = job.teardown(on_progress=progress)
    assert r.code == 0, r.doc
    stop = _stop(r)
    assert stop["outcome"] == "checkpoint" and stop["arrived"] and stop["checkpoint"] == str(job.ckpt)
    assert seen and f"pid {job.pid}" in seen[0]
    assert job.lines() == ["usr1", "open", "closed", "term"]  # SIGTERM only once the file was closed
    assert not alive(job.pid)
    assert _signals(r, job.pid)[:2] == ["SIGUSR1", "SIGTERM"]
    assert "SIGUSR1" not in _signals(r, job.wrapper)  # gpu-pivot's own wrapper is not the job's
    (rec,) = [a for a in r.result.actions if a["signal"] == "checkpoint stop"]
    assert rec["arrived"] is True and rec["checkpoint"] == str(job.ckpt) and rec["waited_s"] == stop["waited_s"]
    assert "checkpoint arrived: %s" % job.ckpt in rec["result"]
    audit = Path(os.environ["GPU_PIVOT_RUN_DIR"]) / "audit.jsonl"  # the host's audit log (the test's own)
    (logged,) = [a for a in map(json.loads, audit.read_text().splitlines()) if a["signal"] == "checkpoint stop"]
    assert logged["checkpoint"] == str(job.ckpt) and logged["arrived"] is True
    assert f"checkpoint {job.ckpt} arrived after" in teardown_view.brief(r)


def test_a_job_that_never_checkpoints_gets_term_then_kill_after_the_deadline(ps):
    old = ps.base / "ckpt"
    old.mkdir()
    (old / "step-0.pt").write_bytes(b"an old checkpoint")  # there before the signal: not the one asked for
    job = Job(ps, "stubborn", deadline="0.5", idle=False).start()
    r = job.teardown()
    stop = _stop(r)
    assert stop["outcome"] == "deadline" and not stop["arrived"] and stop["checkpoint"] is None
    assert _signals(r, job.pid)[:3] == ["SIGUSR1", "SIGTERM", "SIGKILL"]
    assert not alive(job.pid) and r.code == 0, r.doc
    (rec,) = [a for a in r.result.actions if a["signal"] == "checkpoint stop"]
    assert rec["arrived"] is False and "no checkpoint" in rec["result"]
    assert any("no checkpoint (deadline" in line for line in teardown_view.verdict_lines("local", r))


def test_the_idle_condition_ends_the_wait(ps):
    job = Job(ps, "idle").start()
    r = job.teardown()
    stop = _stop(r)
    assert stop["outcome"] == "idle" and stop["checkpoint"] is None, stop
    assert job.lines() == ["usr1", "term"] and r.code == 0


def test_an_old_checkpoint_does_not_count(ps):
    (ps.base / "ckpt").mkdir()
    (ps.base / "ckpt" / "step-0.pt").write_bytes(b"an old checkpoint")
    job = Job(ps, "idle").start()
    stop = _stop(job.teardown())
    assert stop["outcome"] == "idle" and not stop["arrived"] and stop["checkpoint"] is None, stop


def test_a_checkpoint_still_open_for_writing_does_not_count(ps):
    job = Job(ps, "hold").start()
    r = job.teardown()
    stop = _stop(r)
    assert stop["outcome"] == "idle" and not stop["arrived"], stop
    assert stop["note"] == f"{job.ckpt} still open for writing by pid {job.pid}"
    assert job.lines() == ["usr1", "open", "term while open"]


def test_another_uids_file_and_a_link_do_not_count(ps, second_user):
    job = Job(ps, "foreign", uid=second_user.uid).start()
    stop = _stop(job.teardown())
    assert stop["outcome"] == "idle" and not stop["arrived"], stop
    assert stop["note"] == f"{job.ckpt} is owned by uid {second_user.uid}, not the job's: not counted"
    for name in ("done", "job.log", "ckjob.ready"):
        (ps.base / name).unlink()
    job.ckpt.unlink()
    job = Job(ps, "link").start()
    stop = _stop(job.teardown())
    assert stop["outcome"] == "idle" and not stop["arrived"], stop
    assert os.path.islink(job.ckpt)


def test_plan_shows_the_stop_and_phase_stop_runs_it(ps):
    job = Job(ps, "quick").start()
    plan = run_agent(job.host, requests.Plan()).result.plan
    (row,) = plan.checkpoint_stops
    assert row["pids"] == [job.pid] and row["signal"] == "USR1" and row["deadline_s"] == 60
    text = " ".join(teardown_view.plan_tables(plan).split())
    assert f"CHECKPOINT STOP phase train: SIGUSR1 to pid {job.pid} first, then wait up to 60s for a new closed " \
           f"{job.ckdir}/step-*.pt or idle" in text
    assert job.lines() == []  # the plan signals nothing
    r = phase_ops.stop(job.host, job.phase, "test")
    assert r.code == 0 and _stop(r)["checkpoint"] == str(job.ckpt), r.doc
    assert job.lines() == ["usr1", "open", "closed", "term"]
    assert f"checkpoint {job.ckpt} arrived after" in phase_view.stop_line(r)


def test_a_bad_stop_is_refused_before_anything(ps):
    job = Job(ps, "quick").start()
    bad = {"phase": "train", "signal": "KILL", "checkpoint": "/x/*", "deadline_s": 5}
    with pytest.raises(ConfigError, match="signal 'KILL': not a signal a job can catch"):
        run_agent(job.host, requests.Teardown(checkpoint_stops=(bad,)))
    assert job.lines() == [] and alive(job.pid)


@pytest.mark.parametrize("to", [None, "all"])
def test_the_signal_goes_to_what_the_launch_command_started_unless_all_is_declared(ps, to):
    """A worker with no handler for SIGUSR1 (a DataLoader worker) dies of it and takes the
    step down before the checkpoint: by default only the job's top process gets the signal,
    and its worker the usual SIGTERM after; STOP_SIGNAL_TO=all signals every process."""
    job = Job(ps, "quick", to=to, child=True).start()
    r = job.teardown()
    assert r.code == 0, r.doc
    assert _stop(r)["arrived"] and _signals(r, job.pid)[0] == "SIGUSR1"
    assert ("SIGUSR1" in _signals(r, job.child)) == (to == "all"), _signals(r, job.child)
    assert not alive(job.child)
