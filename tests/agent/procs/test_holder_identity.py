"""Holders are found by device identity, in every fd table, never by the text of a path.

Each case is a real process that holds a (test) GPU device in a way /proc/PID/fd link text
does not show as the device path: through a hard link, through a bind mount, on a node
deleted and recreated, from a thread with its own fd table, from the live thread of an
exited (zombie) leader. Each must be seen by `verify` (NOT FREE) and freed by a teardown.
Character devices are made with mknod on /dev/zero's numbers (1:5), a driver every machine
has; the holder maps it, as a CUDA context maps /dev/nvidia* (a holder that only opened the
node is an NVML-style handle and protected). `--fake-devices` lets the scan accept that major.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import stat
import subprocess
import sys

import pytest

from scripts.agent.holders import scan
from scripts.agent.procs import procfs
from scripts.agent.procs.devices import DeviceError, DeviceSet
from scripts.agent.wire import requests
from scripts.config.hostconfig import build_host
from tests.support.agent_inproc import run_agent
from tests.support.procs import alive, state, wait_for

HOLD = r"""
import ctypes, os, sys, threading, time
how, path, ready = sys.argv[1], sys.argv[2], sys.argv[3]
libc = ctypes.CDLL(None, use_errno=True)
CLONE_FILES = 0x400
held = []
def hold(own_table):
    import mmap, stat
    if own_table:
        assert libc.unshare(CLONE_FILES) == 0, ctypes.get_errno()
    fd = os.open(path, os.O_RDONLY)
    held.append(fd)
    if how == "mapped":
        held.append(mmap.mmap(fd, 4096, prot=mmap.PROT_READ))
    open(ready, "w").close()
    time.sleep(600)
if how in ("plain", "mapped"):
    hold(False)
elif how == "thread-own-table":
    threading.Thread(target=hold, args=(True,), daemon=True).start()
    time.sleep(600)
elif how == "zombie-leader":
    threading.Thread(target=hold, args=(False,)).start()
    while not os.path.exists(ready):
        time.sleep(0.01)
    libc.pthread_exit(None)
"""




def holder(ps, how, path):
    ready = ps.base / f"ready-{how}-{len(ps.pids)}"
    p = subprocess.Popen([sys.executable, "-c", HOLD, how, str(path), str(ready)], start_new_session=True)
    ps.adopt(p.pid)
    wait_for(ready.exists, f"{how} holder ready")
    return p.pid


def char_device(path):
    if os.path.lexists(path):
        os.unlink(path)
    os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 5))


def host_for(ps):
    keys = {"DEVICES": ps.glob, "FAKE_DEVICES": "yes", "SCOPE": str(ps.base), "TARGETS": "nothing-here"}
    return dataclasses.replace(build_host("local", keys, "test"), fake_gpus=str(ps.memdir))


def assert_seen_then_freed(ps, pid, expect_device):
    host = host_for(ps)
    doc = run_agent(host, requests.Verify()).doc
    held = {h["pid"]: h for h in doc["holders"]}
    assert not doc["free"] and pid in held, doc["problems"]
    assert held[pid]["devices"] == [expect_device]
    result = run_agent(host, requests.Teardown(grace=2, timeout=10, settle=0.3))
    assert result.code == 0, result.doc["problems"]
    assert not alive(pid)


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mknod and bind mounts need root")


def test_hard_link_of_a_device_file_is_the_device(ps):
    alias = ps.base / "elsewhere" / "renamed-node"
    alias.parent.mkdir()
    os.link(ps.devdir / "nvidia0", alias)
    pid = holder(ps, "plain", alias)
    assert_seen_then_freed(ps, pid, str(ps.devdir / "nvidia0"))


@needs_root
def test_character_device_deleted_and_recreated_is_still_the_device(ps):
    node = ps.devdir / "nvidia0"
    char_device(node)
    pid = holder(ps, "mapped", node)
    char_device(node)  # the holder's fd now reads "... (deleted)"
    assert os.readlink(f"/proc/{pid}/fd/3").endswith("(deleted)")
    assert_seen_then_freed(ps, pid, str(node))


@needs_root
@pytest.mark.skipif(not shutil.which("unshare"), reason="needs unshare (util-linux)")
def test_bind_mounted_device_is_the_device(ps):
    """A plain fake device file bind-mounted elsewhere: same (st_dev, st_ino), other name."""
    node = ps.devdir / "nvidia0"
    target = ps.base / "bind-target"
    target.touch()
    ready = ps.base / "ready-bind"
    code = (f"import os, time; fd = os.open({str(target)!r}, os.O_RDONLY); open({str(ready)!r}, 'w').close(); "
            "time.sleep(600)")
    p = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                          f"mount --bind {node} {target} && exec {sys.executable} -c \"$0\"", code],
                         start_new_session=True)
    ps.adopt(p.pid)
    wait_for(ready.exists, "bind-mount holder")
    assert os.readlink(f"/proc/{p.pid}/fd/3") == str(target)
    assert_seen_then_freed(ps, p.pid, str(node))


def test_thread_with_its_own_fd_table(ps):
    pid = holder(ps, "thread-own-table", ps.devdir / "nvidia1")
    assert not any(os.readlink(f"/proc/{pid}/fd/{fd}").startswith(str(ps.devdir))
                   for fd in os.listdir(f"/proc/{pid}/fd"))
    assert_seen_then_freed(ps, pid, str(ps.devdir / "nvidia1"))


def test_live_thread_of_a_zombie_leader(ps):
    pid = holder(ps, "zombie-leader", ps.devdir / "nvidia0")
    wait_for(lambda: state(pid) == "Z", "leader to exit")
    start = procfs.start_time(pid)
    assert procfs.read_stat(pid)["flags"] & procfs.PF_EXITING  # the leader is in its exit ...
    assert not procfs.exiting(pid, start)  # ... but its live thread runs: a teardown still waits for it
    assert_seen_then_freed(ps, pid, str(ps.devdir / "nvidia0"))


def test_real_hosts_refuse_a_glob_naming_other_files(tmp_path):
    (tmp_path / "loop0").touch()
    with pytest.raises(DeviceError, match="loop0 is not an NVIDIA character device"):
        DeviceSet(f"{tmp_path}/*")
    if os.path.exists("/dev/null"):
        with pytest.raises(DeviceError, match="null is not an NVIDIA character device"):
            DeviceSet("/dev/nul[l]")


def test_reader_of_an_unrelated_device_is_not_a_holder(ps):
    """`/dev/*`-style globs used to make a reader of /dev/loop0 a target; a device of
    another driver is never a GPU holder, even inside the glob's directory."""
    reader = holder(ps, "plain", "/dev/null")
    args = scan_args(ps)
    doc = scan.collect(args.selection)
    assert reader not in {h["pid"] for h in doc["holders"]}


def scan_args(ps):
    from scripts.agent.options.record import Options
    return Options(devices=ps.glob, fake_devices=True, scope=None, scope_uid=None, protect=[], target=[],
                              match=[], fake_gpus=str(ps.memdir), max_used_mib=0)
