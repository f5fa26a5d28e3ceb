"""A file held open on a hung FUSE or network mount must not hang the holder scan.

A dead NFS server or a FUSE daemon that stopped answering makes every stat() of its files
wait, for ever on a hard mount. The scan stat()s what processes hold open to tell a GPU
device by identity; without that rule (tests/support/hung_fuse.py makes such a mount), one
process with such a file open made `invoke teardown` hang before its first signal until the
CLI's deadline (exit 7, nothing freed). Now a file on a mount whose stat() waits on a server
is stat()-ed from the kernel's cached attributes (statx AT_STATX_DONT_SYNC, agent/procs/fdstat.py),
which never asks the server; and a process that outlives SIGKILL (stuck in such a call) is
named by the CLI instead of waited for. The hung mount is real: a FUSE server speaking the kernel protocol that stops
answering once its file is opened. Root and /dev/fuse are needed; elsewhere these skip.

The same mount makes a process that is stuck in its own exit (its close of the hung file
waits on the server, uninterruptibly, with a fake GPU still open behind it): the teardown
leaves a target in its exit to finish (no SIGKILL, no grace waited out) and still never
calls the GPU free while the source counts its memory.
Teardowns beside a hung mount run the agent as its own process (call_agent, its deadline): an
agent that regressed would sit in D state, and in the test's own process it would hang the
worker; the others run it in-process (tests/support/agent_inproc.py).
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from scripts.agent.procs import devices, fdstat, procfs, procscan
from scripts.agent.wire import requests
from scripts.config.hostconfig import build_host
from scripts.reach import runner
from scripts.reach.route import HostTimedOut
from scripts.reach.transport import call_agent
from tests.support import scenario
from tests.support.agent_inproc import run_agent
from tests.support.hung_mounts import STUCK_IN_EXIT, mounted
from tests.support.paths import REPO, SUPPORT
from tests.support.procs import alive

# os.open, not open(): Python's open() stat()s the file right after opening it, which this mount no longer answers
HOLD = "import os, sys, time; fd = os.open(sys.argv[1], os.O_RDONLY); print('open', flush=True); time.sleep(300)"
# A program that blocks in the kernel on the hung mount (state D: SIGKILL cannot end it until
# the FUSE server goes): what an agent stuck in a driver or NFS call looks like to the CLI.
STUCK = "#!/bin/sh\nexec cat %s\n"


@pytest.fixture
def hung_holder(hung_fuse):
    """A process holding a file open on a FUSE mount that no longer answers; yields its pid.
    Teardown (hung_fuse's): the FUSE server is killed first (that aborts the connection and
    frees anything waiting on it), then the holder, then the mount is detached."""
    _, mnt, ready, started = hung_fuse
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(mnt / "f")], stdout=subprocess.PIPE, text=True)
    started.append(holder)
    assert holder.stdout.readline().strip() == "open"
    assert ready.read_text() == "opened"  # from here on, a stat() of that file never returns
    yield holder.pid, started, mnt


@pytest.fixture
def users_fuse_holder(second_user):
    """A live FUSE mount made for the second user without allow_other (as sshfs, gcsfuse or
    s3fs mount for a user: the kernel refuses everyone else, root included, at getattr) and a
    process of that user holding its file open; yields the holder's pid."""
    if os.geteuid() != 0 or not os.path.exists("/dev/fuse"):
        pytest.skip("needs root and /dev/fuse to mount a FUSE filesystem")
    base = Path(tempfile.mkdtemp(prefix="gp-users-fuse-"))  # reachable by the user (a test's tmp_path is not)
    base.chmod(0o755)
    mnt, ready = base / "mnt", base / "ready"
    mnt.mkdir()
    server = subprocess.Popen([sys.executable, str(SUPPORT / "hung_fuse.py"), str(mnt), str(ready), "--answer",
                               "--owner", str(second_user.uid)], stderr=subprocess.PIPE, text=True)
    try:
        mounted(server, ready)
        holder = second_user.popen([second_user.python, "-c", HOLD, str(mnt / "f")], stdout=subprocess.PIPE,
                                   text=True)
        assert holder.stdout.readline().strip() == "open"
        with pytest.raises(PermissionError):
            os.stat(mnt / "f")  # root is refused by this mount, as the scan would be without care
        yield holder.pid
    finally:
        second_user.end_processes()
        if server.poll() is None:
            server.kill()
        server.wait(30)
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


def test_a_users_fuse_file_that_refuses_root_does_not_make_its_holder_uninspected(users_fuse_holder, tmp_path):
    dev = tmp_path / "nvidia0"
    dev.write_bytes(b"")
    devset = devices.DeviceSet(str(tmp_path / "nvidia*"), fake=True)
    assert procscan.held_devices(users_fuse_holder, devset) == ([], None)  # read, and not a GPU: not "denied"


def test_a_root_teardown_beside_a_users_fuse_file_frees_and_is_not_exit_6(users_fuse_holder, ps):
    parent, workers = ps.server(tp=1)
    keys = dict(scenario.host_keys(ps), TARGETS=r"sandbox_roles\.py|sglang\.launch_server")
    host = dataclasses.replace(build_host("local", keys, "test"), fake_gpus=str(ps.memdir))
    result = run_agent(host, requests.Teardown(grace=5, timeout=10, settle=0.5))
    assert result.code == 0, (result.code, result.doc.get("problems"))  # not 6: every process was inspected
    assert not [p for p in [parent, *workers] if alive(p)] and alive(users_fuse_holder)


def test_the_fd_scan_does_not_stat_a_file_on_a_hung_mount(hung_holder, tmp_path):
    pid, started, _ = hung_holder
    dev = tmp_path / "nvidia0"
    dev.write_bytes(b"")
    probe = ("import sys; sys.path.insert(0, %r); from scripts.agent.procs import devices, procscan; "
             "print(procscan.held_devices(%d, devices.DeviceSet(%r, fake=True)))"
             % (str(REPO), pid, str(tmp_path / "nvidia*")))
    scan = subprocess.Popen([sys.executable, "-c", probe], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    started.append(scan)  # if it hangs, the fixture frees it by killing the FUSE server
    try:
        out, err = scan.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        pytest.fail("the holder scan hung on a file of a FUSE mount that no longer answers")
    assert out.strip() == "([], None)", err[-500:]
    # and the file it holds is seen for what it is, from the kernel's cached attributes
    st = fdstat.stat_open_file(f"/proc/{pid}/fd/{_fd_of(pid, '/f')}")
    assert stat.S_ISREG(st.st_mode) and st.st_ino == 2  # the FUSE server's inode for `f`


def test_a_teardown_beside_a_hung_mount_frees_its_targets_and_does_not_wait(hung_holder, ps):
    pid, _, _ = hung_holder
    parent, workers = ps.server(tp=2)
    keys = dict(scenario.host_keys(ps), TARGETS=r"sandbox_roles\.py|sglang\.launch_server")
    host = dataclasses.replace(build_host("local", keys, "test"), fake_gpus=str(ps.memdir))
    result = call_agent(host, requests.Teardown(grace=5, timeout=10, settle=0.5), deadline_s=40)
    assert result.code == 0, result.doc.get("problems")
    assert not [p for p in [parent, *workers] if alive(p)]
    assert alive(pid)  # the holder of the hung file is not the plan's: left alone


def test_an_agent_that_outlives_sigkill_is_named_and_the_cli_does_not_wait_for_it(hung_holder, ps, tmp_path,
                                                                                   monkeypatch):
    _, started, mnt = hung_holder
    monkeypatch.setattr(runner, "KILL_WAIT_S", 1.0)
    stuck = tmp_path / "stuck-python"
    stuck.write_text(STUCK % (mnt / "f"))
    stuck.chmod(0o755)
    keys = dict(scenario.host_keys(ps), PYTHON=str(stuck))
    host = dataclasses.replace(build_host("local", keys, "test"), fake_gpus=str(ps.memdir))
    with pytest.raises(HostTimedOut) as caught:
        call_agent(host, requests.Ping(), deadline_s=2)
    text = str(caught.value)
    assert "did not stop on SIGKILL" in text and "state D" in text and "\n" not in text
    pid = int(text.split(" pid ")[1].split()[0])
    # it really is stuck in the kernel, as the line says: the call came back while the agent
    # still cannot end, so the CLI gave up on it instead of hanging too
    assert procscan.basic(pid)["state"] == "D"


@pytest.mark.parametrize("memory_counted", [True, False], ids=["memory-counted", "memory-not-counted"])
def test_a_target_stuck_in_its_exit_is_not_sigkilled_nor_waited_for_nor_called_free(hung_fuse, ps, memory_counted):
    """Not counted: what a host without NVML sees (its fds are no longer visible, the device is
    still open): free still waits for the exit itself."""
    server, mnt, ready, started = hung_fuse
    script = ps.base / "stuck_exit_server.py"
    script.write_text(STUCK_IN_EXIT)
    target = subprocess.Popen([sys.executable, str(script), str(mnt / "f"), str(ps.devdir / "nvidia0"),
                               str(ps.memdir) if memory_counted else "-"], stdout=subprocess.PIPE, text=True)
    started.append(target)
    assert target.stdout.readline().split() == ["holding", "3", "4"]
    assert ready.read_text() == "opened"
    start = procfs.start_time(target.pid)
    keys = dict(scenario.host_keys(ps), TARGETS=r"stuck_exit_server\.py")
    host = dataclasses.replace(build_host("local", keys, "test"), fake_gpus=str(ps.memdir))
    result = call_agent(host, requests.Teardown(grace=20, timeout=2, settle=0.5), deadline_s=60)
    doc = result.doc
    assert result.code != 0 and doc["verdict"] == "not free", (result.code, doc.get("problems"))
    assert [a["signal"] for a in doc["actions"] if a["pid"] == target.pid] == ["SIGTERM"]  # no SIGKILL
    # the 20 s grace was not waited out for a process already in its exit: the agent's own clock
    # says when it saw every target in its exit, and that was inside the grace
    assert doc["timings"]["targets_exiting_s"] is not None and doc["timings"]["targets_exiting_s"] < 20, doc["timings"]
    stuck = [s for s in doc["stuck"] if s["pid"] == target.pid]
    assert stuck and stuck[0]["state"] == "D" and stuck[0]["in_exit"], doc["stuck"]  # named, with why
    assert "in its exit" in stuck[0]["why"] and "SIGKILL" not in stuck[0]["why"]
    # the kernel's view behind those words: alive, in its exit, its fd table already detached
    assert procfs.same_process(target.pid, start) and procfs.exiting(target.pid, start)
    assert os.listdir(f"/proc/{target.pid}/fd") == []
    server.kill()  # aborts the connection: the close returns and the exit ends
    target.wait(30)
    assert not procfs.same_process(target.pid, start)


def _fd_of(pid, suffix):
    for name in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{name}").endswith(suffix):
                return name
        except OSError:
            continue
    raise AssertionError(f"pid {pid} holds no file ending in {suffix}")
