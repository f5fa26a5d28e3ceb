"""A file held open on a hung FUSE or network mount must not hang the holder scan.

A dead NFS server or a FUSE daemon that stopped answering makes every stat() of its files
wait, for ever on a hard mount. The scan stat()s what processes hold open to tell a GPU
device by identity; before this was found (by a red team with tests/hung_fuse.py), one
process with such a file open made `invoke teardown` hang before its first signal until the
CLI's deadline (exit 7, nothing freed). Now a file on a mount whose stat() waits on a server
is stat()-ed from the kernel's cached attributes (statx AT_STATX_DONT_SYNC, agent/fdstat.py),
which never asks the server; and a process that outlives SIGKILL (stuck in such a call) is
named by the CLI instead of waited for. The hung mount is real: a FUSE server speaking the kernel protocol that stops
answering once its file is opened. Root and /dev/fuse are needed; elsewhere these skip.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from scripts import transport
from scripts.agent import devices, fdstat, procscan
from scripts.hostconfig import build_host
from scripts.route import HostTimedOut
from scripts.transport import call_agent
from tests import scenario
from tests.procs import alive, wait_for

HERE = Path(__file__).resolve().parent
# os.open, not open(): Python's open() stat()s the file right after opening it, which this mount no longer answers
HOLD = "import os, sys, time; fd = os.open(sys.argv[1], os.O_RDONLY); print('open', flush=True); time.sleep(300)"
# A program that blocks in the kernel on the hung mount (state D: SIGKILL cannot end it until
# the FUSE server goes): what an agent stuck in a driver or NFS call looks like to the CLI.
STUCK = "#!/bin/sh\nexec cat %s\n"


@pytest.fixture
def hung_holder(tmp_path):
    """A process holding a file open on a FUSE mount that no longer answers; yields its pid.
    Teardown: the FUSE server is killed first (that aborts the connection and frees anything
    waiting on it), then the holder, then the mount is detached."""
    if os.geteuid() != 0 or not os.path.exists("/dev/fuse"):
        pytest.skip("needs root and /dev/fuse to mount a FUSE filesystem")
    mnt, ready = tmp_path / "mnt", tmp_path / "ready"
    mnt.mkdir()
    server = subprocess.Popen([sys.executable, str(HERE / "hung_fuse.py"), str(mnt), str(ready)],
                              stderr=subprocess.PIPE, text=True)
    started: list = [server]
    try:
        _mounted(server, ready)
        holder = subprocess.Popen([sys.executable, "-c", HOLD, str(mnt / "f")], stdout=subprocess.PIPE, text=True)
        started.append(holder)
        assert holder.stdout.readline().strip() == "open"
        assert ready.read_text() == "opened"  # from here on, a stat() of that file never returns
        yield holder.pid, started, mnt
    finally:
        for proc in started:
            if proc.poll() is None:
                proc.kill()
            proc.wait(30)
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def _mounted(server, ready):
    """Wait for the FUSE server's "mounted" (or its exit: no FUSE here, skip)."""
    wait_for(lambda: (ready.exists() and ready.read_text() in ("mounted", "opened")) or server.poll() is not None,
             "the FUSE mount", timeout=20)
    if server.poll() is not None:
        pytest.skip(f"cannot mount FUSE here: {server.stderr.read().strip()[-200:]}")


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
    server = subprocess.Popen([sys.executable, str(HERE / "hung_fuse.py"), str(mnt), str(ready), "--answer",
                               "--owner", str(second_user.uid)], stderr=subprocess.PIPE, text=True)
    try:
        _mounted(server, ready)
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
    result = call_agent(host, "teardown", ["--grace", "5", "--timeout", "10", "--settle", "0.5"], deadline_s=40)
    assert result.code == 0, (result.code, result.doc.get("problems"))  # not 6: every process was inspected
    assert not [p for p in [parent, *workers] if alive(p)] and alive(users_fuse_holder)


def test_the_fd_scan_does_not_stat_a_file_on_a_hung_mount(hung_holder, tmp_path):
    pid, started, _ = hung_holder
    dev = tmp_path / "nvidia0"
    dev.write_bytes(b"")
    probe = ("import sys; sys.path.insert(0, %r); from scripts.agent import procscan, devices; "
             "print(procscan.held_devices(%d, devices.DeviceSet(%r, fake=True)))"
             % (str(HERE.parent), pid, str(tmp_path / "nvidia*")))
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
    result = call_agent(host, "teardown", ["--grace", "5", "--timeout", "10", "--settle", "0.5"], deadline_s=40)
    assert result.code == 0, result.doc.get("problems")
    assert not [p for p in [parent, *workers] if alive(p)]
    assert alive(pid)  # the holder of the hung file is not the plan's: left alone


def test_an_agent_that_outlives_sigkill_is_named_and_the_cli_does_not_wait_for_it(hung_holder, ps, tmp_path,
                                                                                   monkeypatch):
    _, started, mnt = hung_holder
    monkeypatch.setattr(transport, "KILL_WAIT_S", 1.0)
    stuck = tmp_path / "stuck-python"
    stuck.write_text(STUCK % (mnt / "f"))
    stuck.chmod(0o755)
    keys = dict(scenario.host_keys(ps), PYTHON=str(stuck))
    host = dataclasses.replace(build_host("local", keys, "test"), fake_gpus=str(ps.memdir))
    t0 = time.monotonic()
    with pytest.raises(HostTimedOut) as caught:
        call_agent(host, "ping", [], deadline_s=2)
    waited = time.monotonic() - t0
    text = str(caught.value)
    assert "did not stop on SIGKILL" in text and "state D" in text and "\n" not in text
    pid = int(text.split(" pid ")[1].split()[0])
    assert procscan.basic(pid)["state"] == "D"  # it really is stuck in the kernel, as the line says
    assert waited < 2 + transport.KILL_WAIT_S + 3  # the CLI gave up on it instead of hanging too


def _fd_of(pid, suffix):
    for name in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{name}").endswith(suffix):
                return name
        except OSError:
            continue
    raise AssertionError(f"pid {pid} holds no file ending in {suffix}")
