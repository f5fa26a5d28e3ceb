"""A pivot's hold on the host lock (agent teardown/hold.py), with real processes: a teardown
asked to hold leaves a detached holder owning the flock; another teardown gets exit 4 and the
hold's text; `release` with the hold's token ends it (another token does not); the holder's
own deadline ends it; a SIGKILLed holder frees the lock; the emergency teardown is never
blocked by it; a lock file that is a link is refused before anything runs."""
from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess

import pytest

from scripts.agent.procs import procscan
from scripts.agent.teardown import hold, hostlock
from scripts.agent.wire import call, codes, frame, requests
from scripts.config.errors import ConfigError
from scripts.emergency import shell_teardown
from scripts.reach.transport import agent_argv, read_document
from tests.conftest import invoke
from tests.support.agent_inproc import run_agent, run_words
from tests.support.parsers import oneliner_report
from tests.support.procs import alive, wait_for
from tests.support.teardowns import env_file, host

TOKEN = "00112233aabbccdd"


def _teardown(ps, seconds=60.0, token=TOKEN):
    return run_agent(host(ps), requests.Teardown(grace=1, timeout=10, hold=(seconds, "train", token)))


def _held(ps):
    """A teardown that FREED (nothing to stop here) and left its holder: the holder's pid."""
    r = _teardown(ps)
    assert r.code == 0 and r.result.hold, r.doc
    pid = r.result.hold["pid"]
    assert alive(pid)
    # its argv reads empty for a moment on a loaded machine (/proc while the new process settles)
    wait_for(lambda: hold.is_holder((procscan.basic(pid) or {}).get("argv") or []), "the holder's argv")
    return pid


def _lock_free():
    fd = hostlock.open_lock()
    try:
        return hostlock.try_flock(fd)
    finally:
        os.close(fd)


def _gone(pid):
    """The holder ended: it is no longer running (a zombie left to a reaper counts as ended)."""
    info = procscan.basic(pid)
    return info is None or info["state"] in ("Z", "X")


def test_the_holder_keeps_the_lock_across_calls_and_release_ends_it(ps):
    holder = _held(ps)
    second = _teardown(ps)
    assert second.code == 4 and second.result.locked
    text = second.result.error or ""
    assert "pivot waiting for ready since" in text and "target phase train" in text and f"pid {holder}" in text
    assert not _lock_free()
    wrong = run_agent(host(ps), requests.Release(token='ffffffffffffffff'))
    assert wrong.code == 4 and not wrong.result.released and alive(holder)  # not this pivot's hold
    done = run_agent(host(ps), requests.Release(token=TOKEN))
    assert done.code == 0 and done.result.released, done.doc
    wait_for(lambda: _gone(holder), "the holder's end")
    assert _lock_free()
    with open(hostlock.lock_path()) as f:
        assert f.read() == ""  # no stale "pivot waiting" text for `status` or the next teardown
    again = _teardown(ps)
    assert again.code == 0 and not again.result.locked
    run_agent(host(ps), requests.Release(token=TOKEN))


def test_status_shows_the_holds_text_while_it_is_held(ps, hosts_env):
    env_file(ps, hosts_env)
    _held(ps)
    shown = " ".join(invoke("status", "--host", "local").stdout.decode().split())
    assert "Host lock: held by pivot waiting for ready since" in shown and "target phase train" in shown
    assert run_agent(host(ps), requests.Release(token=TOKEN)).result.released
    assert "Host lock" not in invoke("status", "--host", "local").stdout.decode()


def test_the_holders_own_deadline_ends_it(ps):
    r = _teardown(ps, seconds=0.5)
    holder = r.result.hold["pid"]
    wait_for(lambda: _gone(holder), "the holder's deadline")
    assert _lock_free()
    assert _teardown(ps).code == 0
    run_agent(host(ps), requests.Release(token=TOKEN))


def test_a_sigkilled_holder_frees_the_lock(ps):
    holder = _held(ps)
    os.kill(holder, signal.SIGKILL)  # the holder this test's teardown started
    wait_for(lambda: _gone(holder), "the holder's end")
    assert _lock_free()
    r = run_agent(host(ps), requests.Release(token=TOKEN))
    assert r.code == 0 and not r.result.released and "not held" in (r.result.note or "")
    assert _teardown(ps).code == 0
    run_agent(host(ps), requests.Release(token=TOKEN))


def test_the_emergency_teardown_runs_while_a_pivot_holds_the_lock(ps):
    holder = _held(ps)
    job = ps.role("worker", "--gpu", "0")  # an orphan worker holding GPU 0
    params = shell_teardown.positional(ps.glob, 0, 0, scope=str(ps.base))
    ran = subprocess.run(["sh", "-c", shell_teardown.script_text(), shell_teardown.NAME, *params[:-2], "1", "1"],
                         capture_output=True, text=True, timeout=120)
    report = oneliner_report.parse_report(ran.stdout)
    assert ran.returncode == 0 and report["verdict"] == "free", ran.stdout + ran.stderr
    assert not alive(job) and alive(holder)  # the emergency path went through; the hold stands
    assert run_agent(host(ps), requests.Release(token=TOKEN)).result.released


def test_hold_values_are_checked_before_anything_runs(ps):
    h = host(ps)
    for bad, words in (((0, "x", TOKEN), "--hold-s 0.0"), ((5, "x", "NOT-HEX"), "--hold-token 'NOT-HEX'")):
        with pytest.raises(ConfigError, match=re.escape(words)):
            run_agent(h, requests.Teardown(grace=1, timeout=10, hold=bad))
    assert _lock_free()


def test_hold_flags_come_together(ps):
    """--hold-s alone, as a person may type it on the host: requests.Teardown.hold is all three
    or none, so this argv is sent to the agent's entry point (cli.main) as it is."""
    nonce = frame.new_nonce()
    argv = agent_argv(host(ps), requests.Teardown(grace=1, timeout=10), nonce, False)
    code, out = run_words(argv[argv.index(call.STDIN) + 1:] + ["--hold-s", "5"])
    assert code == codes.EXIT_USAGE
    with pytest.raises(ConfigError, match="go together"):
        read_document("local", out, nonce, code)
    assert _lock_free()


def test_a_lock_file_that_is_a_link_is_refused_by_release(ps, tmp_path):
    victim = tmp_path / "victim"
    victim.write_text(json.dumps({"hold": "pivot", "token": TOKEN, "pid": os.getpid(), "start_time": 0}))
    run_dir = os.environ["GPU_PIVOT_RUN_DIR"]
    os.makedirs(run_dir, mode=0o700, exist_ok=True)
    os.symlink(victim, os.path.join(run_dir, hostlock.LOCK_NAME))
    r = run_agent(dataclasses.replace(host(ps)), requests.Release(token=TOKEN))
    assert r.code == 3 and not r.result.released and "symlink" in (r.result.error or "")
    assert victim.read_text().startswith("{")  # neither truncated nor followed
