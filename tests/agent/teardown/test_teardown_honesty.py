"""FREED means free: the verdict cases that used to say FREED while a GPU was held.

- a user who cannot read other users' fds: never FREE, exit 6, "run as root";
- a target the user may not signal: the failed signal is not counted, exit 1;
- a supervisor that restarts the server 0.1 s after it exits: caught in the settle window,
  reported with the process that started it and the flag that would include it;
- a target that forks on SIGTERM (child, or a double fork out of the tree): the new process
  is signalled, as the plan says;
- a stopped (state T) target: SIGCONT follows SIGTERM, so it exits within the grace period.
Every process is started here and scoped by the test's temp dir (fake devices + --scope).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scripts.agent.wire import requests
from scripts.reach.bundle import agent_payload
from tests.support import scenario, teardowns
from tests.support.agent_inproc import run_agent
from tests.support.procs import alive, children, state, wait_for
from tests.support.teardowns import host


def teardown(ps, **keys):
    return teardowns.teardown(ps, settle=1, **keys)


# -- another user -------------------------------------------------------------------------

def agent_as(user, *argv):
    """Run the agent bundle as `user` (python3 - SUBCOMMAND ...) and return (code, doc)."""
    out = user.run([user.python, "-", *argv, "--json"], input=agent_payload())
    assert out.stdout, out.stderr
    return out.returncode, json.loads(out.stdout.decode().strip().splitlines()[-1])


def test_unprivileged_verify_never_says_free(shared_ps, second_user):
    holder = shared_ps.role("worker", "--gpu", "0")  # root's process holds the device
    code, doc = agent_as(second_user, "verify", "--fake-devices", "--devices", shared_ps.glob)
    assert code == 6, doc["problems"]
    assert not doc["free"] and doc["uninspected"] > 0
    assert any("could not be inspected" in p and "run as root" in p for p in doc["problems"])
    assert alive(holder)


def test_failed_signal_is_not_counted_and_not_freed(shared_ps, second_user):
    server = scenario._server(shared_ps, "--tp", "1")  # root's server, visible to everyone by its cmdline
    code, doc = agent_as(second_user, "teardown", "--fake-devices", "--devices", shared_ps.glob, "--target",
                         r"sglang\.launch_server", "--scope", str(shared_ps.base), "--grace", "0.5", "--timeout", "1",
                         "--settle", "0.2")
    assert code != 0, doc
    assert doc.get("verdict") == "not free", doc
    assert doc["signalled"] == 0
    assert any(f["pid"] == server and f["result"] == "permission denied" for f in doc["signal_failures"])
    assert any("could not signal pid %d" % server in p for p in doc["problems"])
    assert alive(server)


# -- respawn, forks, stopped targets --------------------------------------------------------

def test_a_loop_above_a_holder_no_pattern_names_ends_with_it(ps, tmp_path):
    """`bash supervise.sh` restarts a GPU worker 0.1 s after each exit; no pattern names either.
    The worker is a target as a holder, and the loop above it is its job's own: frozen before
    the worker's SIGTERM and ended after, so nothing appears and the verdict is FREED."""
    supervisor, sup = ps.supervised_worker(pause=0.1)
    time.sleep(0.3)
    for pid in children(supervisor):
        ps.adopt(pid)
    result = teardown(ps, TARGETS="nothing-here")
    assert result.code == 0, result.doc["problems"]
    assert result.doc["appeared"] == []
    assert not alive(supervisor)
    assert [s["pid"] for s in result.doc["plan"]["starters"] if s["fate"] == "stop"] == [supervisor]


FORKER = r"""
import os, signal, sys, time
devdir, kind, out = sys.argv[1], sys.argv[2], sys.argv[3]
held = [open(devdir + "/nvidia0", "rb")]
def hold_forever(tag):
    with open(out + "." + tag, "w") as f:
        f.write(str(os.getpid()))
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    time.sleep(600)
    os._exit(0)
def on_term(*_):
    pid = os.fork()
    if pid == 0:
        if kind == "double":
            os.setsid()
            if os.fork():
                os._exit(0)
        hold_forever("child")
    if kind == "double":
        os.waitpid(pid, 0)
    os._exit(0)
signal.signal(signal.SIGTERM, on_term)
open(out, "w").close()
time.sleep(600)
"""


@pytest.mark.host_pid_ns  # the kernel's fork events, as on a host (tests/support/workers.py)
@pytest.mark.parametrize("kind", ["child", "double"])
def test_processes_forked_during_sigterm_are_signalled(ps, tmp_path, kind):
    out = tmp_path / "forker"
    p = subprocess.Popen([sys.executable, "-c", FORKER, str(ps.devdir), kind, str(out), "--tag", str(ps.base)],
                         start_new_session=True)
    ps.adopt(p.pid)
    wait_for(out.exists, "forker ready")
    result = teardown(ps, TARGETS="nothing-here")
    child = int(wait_for(lambda: Path(f"{out}.child").exists() and Path(f"{out}.child").read_text(), "child pid"))
    ps.adopt(child)
    if kind == "double" and result.doc["fork_watch"] != "connector":
        # without kernel fork events a setsid double fork cannot be tied to the target:
        # it must then be reported, never blessed
        assert result.code == 1 and any(a["pid"] == child for a in result.doc["appeared"]), (
            result.doc.get("fork_watch_note"), result.doc["appeared"], result.doc["ignored"])
        return
    assert result.code == 0, result.doc["problems"]
    assert any(t["pid"] == child for t in result.doc["adopted"])
    assert not alive(child)
    assert "processes a target forks during the teardown (its new descendants) are signalled too" in \
        result.doc["plan"]["rules"]


def test_stopped_target_gets_sigcont_and_exits_within_grace(ps):
    server, workers = ps.server(tp=1)
    os.kill(server, signal.SIGSTOP)
    wait_for(lambda: state(server) == "T", "stopped")
    result = run_agent(host(ps), requests.Teardown(grace=8, timeout=10, settle=0.2))
    assert result.code == 0, result.doc["problems"]
    sigs = {(a["pid"], a["signal"]) for a in result.doc["actions"] if a["result"] == "sent"}
    assert (server, "SIGCONT") in sigs and (server, "SIGKILL") not in sigs
    assert not alive(server)
