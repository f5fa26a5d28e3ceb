"""A target "in its exit" (procfs.exiting: every thread of it in the kernel's exit path) is
left to finish, without SIGKILL; these are the cases built to make that wrong.

- A process that runs on as a relay of short-lived threads (each starts the next, then
  returns) behind a leader that called pthread_exit, ignoring SIGTERM: listing its threads
  and then reading each one's flags can catch only threads that are exiting while their
  successor, started in between, was not listed. exiting() lists them again and answers yes
  only for the same threads twice; a teardown still sends it SIGKILL after its grace.
- A GPU mapped (its fd closed, as a CUDA context may leave it) by a live thread of a leader
  that exited first: the leader's own /proc maps read empty, so the scan reads a live
  thread's (they share the mappings) and `verify` does not call the GPU free.
- The same relay hides its command line and its open fds from one listing of its threads
  (each listed thread is gone when read, its successor was not listed):
  the scan lists them again, and after THREAD_LISTINGS tries calls the process not
  inspected, never one outside the scope nor one holding nothing.
Every process is the test's own (its temp dir's fake devices, its dir as the scope).
"""
from __future__ import annotations

import dataclasses
import subprocess
import sys
import time

from scripts.agent.procs import devices, procfs, procscan
from scripts.agent.wire import requests
from scripts.config.hostconfig import build_host
from tests.support import scenario
from tests.support.agent_inproc import run_agent
from tests.support.procs import state, wait_for

# argv: DEVICE READY open|mapped. Holds DEVICE (mapped: only mapped, fd closed), ignores SIGTERM,
# runs on in a relay of threads, and its leader calls pthread_exit (a zombie leader).
RELAY = r"""
import ctypes, mmap, os, signal, sys, threading
dev, ready, how = sys.argv[1:4]
signal.signal(signal.SIGTERM, signal.SIG_IGN)
libc = ctypes.CDLL(None, use_errno=True)
fd = os.open(dev, os.O_RDWR)
if how == "mapped":
    os.ftruncate(fd, 4096)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long)
    assert libc.mmap(None, 4096, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0) not in (None, 2 ** 64 - 1)
    os.close(fd)  # mapped only (mmap.mmap would keep a dup of the fd)
def relay():
    threading.Thread(target=relay).start()
threading.Thread(target=relay).start()
open(ready, "w").close()
libc.pthread_exit(None)
"""


def relay(ps, how="open"):
    ready = ps.base / f"relay-ready-{len(ps.pids)}"
    p = subprocess.Popen([sys.executable, "-c", RELAY, str(ps.devdir / "nvidia0"), str(ready), how,
                          "relay_server"], start_new_session=True)
    ps.adopt(p.pid)
    wait_for(ready.exists, "relay ready")
    wait_for(lambda: state(p.pid) == "Z", "the leader's pthread_exit")
    return p


def host_for(ps, targets):
    keys = dict(scenario.host_keys(ps), TARGETS=targets)
    return dataclasses.replace(build_host("local", keys, "test"), fake_gpus=str(ps.memdir))


def test_a_process_running_on_in_a_relay_of_threads_is_never_in_its_exit(ps):
    p = relay(ps)
    start = procfs.start_time(p.pid)
    wrong = sum(procfs.exiting(p.pid, start) for _ in range(3000))
    assert procfs.same_process(p.pid, start)  # it ran all along
    assert wrong == 0, f"procfs.exiting said True {wrong}/3000 times for a process running its code"


def test_a_relay_that_ignores_sigterm_gets_sigkill_after_its_grace(ps):
    """Under load the relay can evade every listing of one scan: it is then not inspected, so not
    signalled, and that teardown must not say FREED; a next one sees it and kills it."""
    p = relay(ps)
    for _attempt in range(4):
        result = run_agent(host_for(ps, r"relay_server"), requests.Teardown(grace=1, timeout=4, settle=0.3))
        sent = [a["signal"] for a in result.doc["actions"] if a["pid"] == p.pid]
        if sent:
            break
        assert result.code != 0, "FREED while the relay, not inspected, held the GPU"
    assert sent == ["SIGTERM", "SIGKILL"], (sent, result.doc.get("stuck"))
    p.wait(10)
    assert result.code == 0, result.doc.get("problems")  # and then it was gone and the GPU free


def test_a_gpu_mapped_by_a_live_thread_of_an_exited_leader_is_not_free(ps):
    p = relay(ps, "mapped")
    doc = run_agent(host_for(ps, "nothing-here"), requests.Verify()).doc
    assert not doc["free"], f"verify called the GPUs free while pid {p.pid} maps {ps.devdir / 'nvidia0'}"
    assert p.pid in {h["pid"] for h in doc["holders"]} or p.pid in doc.get("denied", []), doc["holders"]


def test_a_zombie_leaders_command_line_is_read_or_said_unreadable_never_lost(ps):
    p = relay(ps)
    full = None
    for _ in range(3000):
        info = procscan.basic(p.pid)
        if info.get("unreadable"):
            continue  # said so: the scan counts it as not inspected
        full = full or info["cmdline"]
        assert info["cmdline"] == full and "relay_server" in full, info["cmdline"]
    assert procfs.same_process(p.pid, procfs.start_time(p.pid))


def test_the_scan_never_misses_a_zombie_leaders_open_device(ps):
    p = relay(ps)
    devset = devices.DeviceSet(ps.glob, fake=True)
    for _ in range(300):
        snap = procscan.snapshot(devset)
        assert p.pid in snap["holders"] or p.pid in snap["denied"], "the scan saw nothing of a process holding it"
    assert procfs.same_process(p.pid, procfs.start_time(p.pid))


def test_a_scoped_relay_target_is_never_called_free_while_it_holds_the_gpu(ps):
    for attempt in range(4):
        p = relay(ps)
        start = procfs.start_time(p.pid)
        result = run_agent(host_for(ps, r"relay_server"), requests.Teardown(grace=1, timeout=3, settle=0.3))
        sent = [a["signal"] for a in result.doc["actions"] if a["pid"] == p.pid]
        alive = procfs.same_process(p.pid, start)
        assert result.code != 0 or (not alive and sent == ["SIGTERM", "SIGKILL"]), (attempt, result.code, sent, alive)
        if alive:
            procfs.signal_if_same(p.pid, start, 9)
        p.wait(10)


def test_ticks_now_splits_what_started_before_from_what_starts_after():
    """A teardown adopts only what starts once it has begun (teardown/run.py): that moment is
    read in /proc's own start_time unit, so an older process reads before it, a newer after."""
    before = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        time.sleep(0.05)  # a few clock ticks apart: the two sides of the line are not the same tick
        now = procfs.ticks_now()
        time.sleep(0.05)
        after = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        try:
            assert procfs.start_time(before.pid) < now <= procfs.start_time(after.pid)
        finally:
            after.kill()
            after.wait()
    finally:
        before.kill()
        before.wait()
