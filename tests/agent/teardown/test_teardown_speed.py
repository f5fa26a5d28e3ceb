"""Teardown at the physical floor: the behaviour the speed rests on.

The speed itself is measured by benchmarks (bench/gpu_teardown.py on the GPU machine, `make
bench`), not by timed tests; these tests check what makes it fast and what keeps it honest:
- "free at" (first moment every GPU reads free) is reported apart from "settled at" (free
  at + the settle window), streamed as a progress line at free-at, and the CLI prints
  `free at` then while the verdict still waits for the window: a respawn inside it turns
  the verdict into NOT FREE (exit 1) after the `free at` line, and FREED is the verdict's
  word alone;
- waits for exits wake on pidfds (no sleep-polling), and a zombie (exited, not reaped yet)
  counts as gone;
- `verify --wait` waits for a holder's end, then reads free;
- the agent runs with -S from a zlib stream (call.BOOT), still finds pynvml, and uses
  shipped bytecode only when its Python's magic number matches.
Every process is the test's own (fake device files in its temp dir, its dir as the scope).
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
import threading
import time
import zlib

import pytest

from scripts.agent.procs import procfs
from scripts.agent.teardown import targets
from scripts.agent.wire import call, requests
from scripts.config.hostconfig import build_host
from scripts.reach import bundle
from tests.conftest import REPO
from tests.support import scenario
from tests.support.agent_inproc import run_agent
from tests.support.procs import alive, wait_for

HAS_PIDFD = hasattr(os, "pidfd_open")


def host(ps, **keys):
    base = dict(scenario.host_keys(ps), TARGETS=r"sandbox_roles\.py|sglang\.launch_server")
    base.update(keys)
    return dataclasses.replace(build_host("local", base, "test"), fake_gpus=str(ps.memdir))


def test_free_at_is_streamed_at_free_at_and_reported_apart_from_settled(ps):
    ps.server(tp=2)
    seen = []
    result = run_agent(host(ps), requests.Teardown(grace=2, timeout=10, settle=1), on_progress=seen.append)
    doc = result.doc
    assert result.code == 0, doc["problems"]
    assert doc["free_at_s"] is not None and doc["settled_at_s"] is not None
    assert doc["free_at_s"] <= doc["settled_at_s"]
    assert doc["settled_at_s"] - doc["free_at_s"] >= 1.0  # the whole window was watched
    # streamed once, with the verdict's own free-at (that the CLI shows it while the window still
    # runs: test_cli_prints_freed_at_free_at_and_the_verdict_after_the_window)
    freed = [p for p in seen if p.get("phase") == "free"]
    assert len(freed) == 1 and freed[0]["free_at_s"] == doc["free_at_s"]
    t = doc["timings"]
    assert t["sigterm_s"] <= t["targets_exiting_s"] <= t["targets_gone_s"] <= t["free_at_s"] <= t["settled_at_s"]


def _cli(env, *args):
    """Run the CLI; [(whether it was still running when the line arrived, line)], the exit code."""
    proc = subprocess.Popen([sys.executable, "-m", "invoke", *args], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    assert proc.stdout is not None  # stdout=PIPE
    lines = [(proc.poll() is None, raw.decode("utf-8", "replace").rstrip()) for raw in proc.stdout]
    return lines, proc.wait(120)


def _cli_env(ps, hosts_env, **keys):
    hosts_env("".join(f"LOCAL_{k}='{v}'\n" for k, v in dict(scenario.host_keys(ps), **keys).items()))
    return os.environ.copy()


def test_cli_prints_freed_at_free_at_and_the_verdict_after_the_window(ps, hosts_env):
    ps.server(tp=2)
    env = _cli_env(ps, hosts_env, TARGETS=r"sandbox_roles\.py|sglang\.launch_server")
    lines, code = _cli(env, "teardown", "--host", "local", "--yes", "--settle", "5")
    text = "\n".join(line for _, line in lines)
    assert code == 0, text
    freed = [running for running, line in lines if line.startswith("local: free at ")]
    assert len(freed) == 1, text
    words = " ".join(text.split())  # the screen may wrap long lines
    assert "watching 5 s for a respawn before the verdict" in words
    assert freed[0], text  # printed at free-at, while the 5 s window still ran, not at the end
    assert "local: FREED and verified free at" in words
    # FREED is the verdict's word alone: once, on the verdict line of the report, never before it
    said = [line for _, line in lines]
    freed_at = [i for i, line in enumerate(said) if "FREED" in line]
    assert len(freed_at) == 1 and said[freed_at[0]].startswith("local: FREED and verified"), text
    assert freed_at[0] > next(i for i, line in enumerate(said) if line.startswith("== local")), text


def test_respawn_inside_the_window_turns_an_early_freed_into_not_free(ps, hosts_env):
    """The `free at` line says what was seen then; the exit code is the window's verdict."""
    keepalive = ps.detached_worker(pause=0.6)  # its restart comes after the `free at` line
    time.sleep(0.3)
    env = _cli_env(ps, hosts_env, TARGETS=r"sandbox_roles\.py")
    # a 6 s window: the restart (0.6 s after the exit, then a Python start-up) falls well inside
    # it on a loaded machine, with time left to read who started it
    lines, code = _cli(env, "teardown", "--host", "local", "--yes", "--settle", "6")
    ps.adopt(int((ps.base / "worker.pid").read_text()))
    text = "\n".join(line for _, line in lines)
    assert code == 1, text
    first_freed = next(i for i, (_, line) in enumerate(lines) if line.startswith("local: free at "))
    verdict = next(i for i, (_, line) in enumerate(lines) if line.startswith("local: NOT FREE"))
    assert first_freed < verdict, text
    assert "FREED" not in text  # the verdict is NOT FREE, and nothing before it said FREED
    # the screen wraps at a word: where depends on the lengths of the pid and the paths (a
    # clone's, pytest's temp dir), so "PID" and the number may land on two lines
    assert "left at once" in " ".join(text.split()), text  # related to nothing: only the window sees it
    assert alive(keepalive)  # never signalled: it was not in the plan


@pytest.mark.skipif(not HAS_PIDFD, reason="no os.pidfd_open (Python < 3.9)")
def test_exit_wait_wakes_on_the_pidfd_and_a_zombie_counts_as_gone(monkeypatch):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3)"])
    t = {"pid": child.pid, "start_time": procfs.start_time(child.pid)}
    waiter = targets.ExitWaiter()
    monkeypatch.setattr(targets.time, "sleep", lambda s: pytest.fail("sleep-polled instead of waiting on a pidfd"))
    try:
        t0 = time.monotonic()
        waiter.wait([t], 600)
        woke = time.monotonic() - t0
        # the exit woke it, not its 600 s timeout (and no sleep-poll, patched above to fail)
        assert woke < 300, f"waited {woke:.0f} s: the timeout, not the exit, ended the wait"
        wait_for(lambda: procfs.read_stat(child.pid)["state"] == "Z", "zombie")  # exited, not reaped: kill -0 works
        os.kill(child.pid, 0)
        assert not procfs.same_process(t["pid"], t["start_time"])  # ... and it is gone all the same
    finally:
        waiter.close()
        child.wait()


def test_verify_wait_waits_for_the_holder_to_end_and_then_is_free(ps):
    from scripts.agent import cli
    from scripts.agent.teardown import verify

    holder = ps.role("worker", "--gpu", "0")
    args = cli.parse(["verify", "--fake-devices", "--devices", ps.glob, "--wait", "3"])

    def end_holder_soon():
        time.sleep(0.8)
        procfs.signal_if_same(holder, procfs.start_time(holder), 15)

    threading.Thread(target=end_holder_soon, daemon=True).start()
    free, doc, problems, waited = verify.wait_free(args.selection, args.wait)
    assert free, problems
    assert waited >= 0.7, waited  # it waited for the holder's end (how soon after: make bench)


def _stream_argv(*args):
    return [sys.executable, *call.STREAM_FLAGS, call.STDIN, *args]


def test_agent_runs_without_site_from_the_stream_and_still_finds_pynvml():
    script = subprocess.run([sys.executable, "-", "ping", "--json"], input=bundle.agent_payload(),
                            capture_output=True, timeout=60)
    stream = subprocess.run(_stream_argv("ping", "--json"), input=bundle.agent_stream(), capture_output=True,
                            timeout=60)
    assert script.returncode == 0 and stream.returncode == 0, stream.stderr.decode()[-500:]
    a, b = json.loads(script.stdout), json.loads(stream.stdout)
    assert a["nvml"] == b["nvml"], (a.get("nvml_why"), b.get("nvml_why"))  # -S: site added when pynvml is wanted
    assert call.agent_call(_stream_argv("teardown", "--devices=x", "--marker", "0a1b")) == "teardown"
    assert call.agent_call([sys.executable, "-", "teardown", "--devices=x", "--marker", "0a1b"]) == "teardown"


def test_bytecode_is_used_only_with_the_same_magic():
    script, sources, code = zlib.decompress(bundle.agent_stream(compiled=True)).split(bytes(1), 2)
    magic = f"_CODE_MAGIC = {importlib.util.MAGIC_NUMBER!r}".encode()
    assert magic in script  # the loader carries the magic number the bytecode was made for
    # a source that would fail shows which one runs: the shipped bytecode, or the source compiled there
    broken = json.loads(sources)
    broken["agent.status.ping"] = "raise SystemExit(42)\n"
    broken_json = json.dumps(broken).encode()

    def ping(loader):
        body = bytes(1).join([loader, broken_json, code])
        return subprocess.run(_stream_argv("ping", "--json"), input=zlib.compress(body), capture_output=True,
                              timeout=60).returncode

    assert ping(script) == 0  # same magic: the bytecode ran
    assert ping(script.replace(magic, b"_CODE_MAGIC = b'XXXX'", 1)) == 42  # another Python's: the source
    # the bytecode came from this interpreter's own cache, checked as an import checks it
    assert bundle.cached_code(bundle.AGENT_DIR / "teardown" / "run.py") is not None


def _fake_proc(tmp_path, pid, start, threads):
    """A /proc with one process: `threads` = [(tid, state, flags)], the leader's first."""
    def stat_line(tid, state, flags):
        fields = [state, "1", str(pid), str(pid), "0", "-1", str(flags)] + ["0"] * 10 + [str(len(threads)), "0",
                                                                                      str(start)]
        return "%d (py) %s\n" % (tid, " ".join(fields))
    for tid, st, flags in threads:
        d = tmp_path / str(pid) / "task" / str(tid)
        d.mkdir(parents=True)
        (d / "stat").write_text(stat_line(tid, st, flags))
    leader = threads[0]
    (tmp_path / str(pid) / "stat").write_text(stat_line(pid, leader[1], leader[2]))
    return str(tmp_path)


@pytest.mark.parametrize("threads, in_exit", [
    ([(40, "R", 0), (41, "S", 0)], False),                                           # running
    ([(40, "D", procfs.PF_EXITING), (41, "D", procfs.PF_EXITING)], True),             # killed: every thread exiting
    ([(40, "Z", procfs.PF_EXITING), (41, "R", 0)], False),                           # pthread_exit leader, live thread
    ([(40, "D", procfs.PF_EXITING), (41, "S", 0), (42, "D", procfs.PF_EXITING)], False),  # one thread not yet
])
def test_a_process_is_in_its_exit_only_when_every_thread_is(tmp_path, threads, in_exit):
    proc = _fake_proc(tmp_path, 40, 777, threads)
    assert procfs.exiting(40, 777, proc) is in_exit
    assert procfs.exiting(40, 778, proc) is True  # another start time: the target is gone (pid reused)
    assert procfs.exiting(41, 777, proc) is True  # no such process: gone
