"""Shared memory a stopped target leaves behind is removed once FREED (agent/teardown/shm.py).

Real processes, real /dev/shm files and a real System V segment: a server of the test's own
(holding a fake GPU device, so the scoped teardown makes it a target) creates, opens and maps
them, then is torn down. What it created and nobody else holds is removed and reported with
its bytes; what was staged before it started, what a live bystander holds, another user's
file, and everything under --keep-shm stays. Every name carries a token of this test only.
"""
from __future__ import annotations

import ctypes
import json
import os
import secrets
import subprocess
import sys
import time

import pytest

from scripts.agent.wire import requests
from tests.support.agent_inproc import run_agent
from tests.support.procs import wait_for
from tests.support.teardowns import host, teardown

SERVER = """\
import ctypes, json, mmap, os, sys, time
spec = json.load(open(sys.argv[1]))
ready = sys.argv[sys.argv.index("--ready") + 1]
keep = [os.open(spec["device"], os.O_RDWR)]  # a GPU of the test's fake devices: a target
time.sleep(0.2)  # a rank makes its segments after it starts (shm.py: a margin after the start)
for path in spec["create"]:  # created now, open and mapped: a leftover once it is killed
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, b"x" * (1 << 20))
    keep.append((fd, mmap.mmap(fd, 1 << 20)))
    if path in spec.get("chown", {}):
        os.fchown(fd, spec["chown"][path], -1)
for path in spec["open"]:  # there before it: mapped read-only
    fd = os.open(path, os.O_RDONLY)
    keep.append((fd, mmap.mmap(fd, os.fstat(fd).st_size, prot=mmap.PROT_READ)))
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
ids = []
for key in spec["sysv"]:
    shmid = libc.shmget(key, 1 << 16, 0o1600)
    addr = libc.shmat(shmid, None, 0)
    ctypes.memset(addr, 1, 1 << 16)
    ids.append(shmid)
with open(ready + ".tmp", "w") as f:
    json.dump({"pid": os.getpid(), "shmids": ids}, f)
os.rename(ready + ".tmp", ready)
time.sleep(600)
"""


class Shm:
    """Names under /dev/shm and SysV keys of this test only; whatever is left is removed after."""

    def __init__(self, ps):
        self.ps, self.token = ps, "gpvt-test-%s" % secrets.token_hex(6)
        self.shmids: list = []

    def path(self, name):
        return "/dev/shm/%s-%s" % (self.token, name)

    def server(self, create=(), open_=(), sysv=0, chown=None):
        script = self.ps.base / "shmsrv.py"
        script.write_text(SERVER)
        spec = self.ps.base / ("spec-%d.json" % self.ps.n)
        keys = [int.from_bytes(os.urandom(3), "big") | 0x47000000 for _ in range(sysv)]
        spec.write_text(json.dumps({"device": str(self.ps.devdir / "nvidia0"), "create": list(create),
                                    "open": list(open_), "sysv": keys, "chown": chown or {}}))
        ready = self.ps.base / ("ready%d" % (self.ps.n + 1))
        pid = self.ps.start([sys.executable, str(script), str(spec)])
        self.shmids += json.loads(ready.read_text())["shmids"]
        return pid

    def cleanup(self):
        for name in os.listdir("/dev/shm"):
            if name.startswith(self.token):
                os.unlink("/dev/shm/" + name)
        libc = ctypes.CDLL(None, use_errno=True)
        for shmid in self.shmids:
            libc.shmctl(shmid, 0, None)  # IPC_RMID: a no-op for one removed already


@pytest.fixture
def shm(ps):
    made = Shm(ps)
    try:
        yield made
    finally:
        made.cleanup()


def segment_ids():
    with open("/proc/sysvipc/shm") as f:
        return {int(line.split()[1]) for line in f.read().splitlines()[1:]}


def left(doc, what):
    return next(r for r in doc["shm_removed"] if what in (r.get("path"), r.get("shmid")))


def test_a_killed_targets_shm_files_and_segment_are_removed_with_their_bytes_and_the_staged_one_stays(ps, shm):
    staged = shm.path("weights")
    with open(staged, "wb") as f:
        f.write(b"w" * 8192)
    time.sleep(0.1)  # staged before the server starts, as weights are
    leftover = shm.path("nccl-leftover")
    shm.server(create=[leftover], open_=[staged], sysv=1)
    (shmid,) = shm.shmids
    result = teardown(ps)
    doc = result.doc
    assert result.code == 0, (doc["verdict"], doc["problems"])
    assert not os.path.exists(leftover), (doc["shm_removed"], doc.get("problems"), doc.get("warnings"))
    assert shmid not in segment_ids()
    assert os.path.exists(staged)
    assert left(doc, leftover)["removed"] and left(doc, leftover)["bytes"] == 1 << 20
    assert left(doc, shmid)["removed"] and left(doc, shmid)["bytes"] == 1 << 16
    assert not any(r.get("path") == staged for r in doc["shm_removed"])
    assert any(a["signal"].startswith("remove " + leftover) and a["result"] == "removed" for a in doc["actions"])


def test_weights_staged_the_moment_before_the_server_starts_stay(ps, shm):
    """A launch script that copies weights into /dev/shm and starts the server at once: the
    server's start reads in whole clock ticks, so a file written a few ms before it must not
    pass for one it made. Three servers, each started right after its file was written."""
    staged = [shm.path("weights-%d" % i) for i in range(3)]
    for path in staged:
        with open(path, "wb") as f:
            f.write(b"w" * 8192)
        shm.server(open_=[path])
    result = teardown(ps)
    assert result.code == 0, (result.doc["verdict"], result.doc["problems"])
    assert all(os.path.exists(p) for p in staged), result.doc["shm_removed"]
    assert not [r for r in result.doc["shm_removed"] if r.get("path") in staged]


def test_a_target_of_the_early_batch_is_read_before_its_signal(ps, shm):
    """A target a pattern names gets SIGTERM before the plan reads fds (early.py): what it
    holds is read just before that signal, and removed all the same."""
    leftover = shm.path("early")
    shm.server(create=[leftover], sysv=1)
    result = teardown(ps, TARGETS=r"shmsrv\.py")
    assert result.code == 0, result.doc["problems"]
    assert result.doc["timings"]["early_batch"] == 1
    assert not os.path.exists(leftover) and shm.shmids[0] not in segment_ids()
    assert left(result.doc, leftover)["removed"]


def test_plan_lists_the_candidates(ps, shm):
    staged = shm.path("staged")
    with open(staged, "wb") as f:
        f.write(b"w" * 4096)
    time.sleep(0.1)
    leftover = shm.path("nccl-plan")
    shm.server(create=[leftover], open_=[staged], sysv=1)
    listed = run_agent(host(ps), requests.Plan()).doc["plan"]["shm"]
    assert {r.get("path") for r in listed if r["kind"] == "file"} == {leftover}
    assert [r["shmid"] for r in listed if r["kind"] == "sysv"] == shm.shmids
    assert os.path.exists(leftover)


def test_a_file_a_live_bystander_holds_is_kept(ps, shm):
    held, leftover = shm.path("held"), shm.path("gone")
    shm.server(create=[held, leftover])
    ready = ps.base / "bystander-ready"
    by = subprocess.Popen([sys.executable, "-c", "import os, sys, time; fd = os.open(sys.argv[1], os.O_RDONLY); "
                                                 "open(sys.argv[2], 'w').close(); time.sleep(600)", held, str(ready)],
                          start_new_session=True, stdin=subprocess.DEVNULL)
    ps.pids.append(by.pid)
    wait_for(ready.exists, "bystander holds the file")
    doc = teardown(ps).doc
    assert by.poll() is None
    assert os.path.exists(held) and not os.path.exists(leftover)
    assert not left(doc, held)["removed"] and "live process" in left(doc, held)["why"]


def test_another_users_file_is_kept(ps, shm, second_user):
    theirs, leftover = shm.path("theirs"), shm.path("ours")
    shm.server(create=[theirs, leftover], chown={theirs: second_user.uid})
    assert os.stat(theirs).st_uid == second_user.uid
    doc = teardown(ps).doc
    assert os.path.exists(theirs) and not os.path.exists(leftover)
    assert not any(r.get("path") == theirs for r in doc["shm_removed"])


def test_keep_shm_keeps_everything(ps, shm):
    leftover = shm.path("kept")
    shm.server(create=[leftover], sysv=1)
    result = teardown(ps, keep_shm=True)
    assert result.code == 0, result.doc["problems"]
    assert os.path.exists(leftover) and shm.shmids[0] in segment_ids()
    assert result.doc["shm_removed"] == []


def test_a_dataset_staged_before_the_server_and_refreshed_since_by_another_process_stays(ps, shm):
    """Made before the server started, so not its leftover, though a feeder (here, the test,
    not a target) appended to it after the server started and has closed it since: a change
    time is not a creation time."""
    staged = shm.path("dataset")
    with open(staged, "wb") as f:
        f.write(b"d" * 8192)
    time.sleep(0.1)
    shm.server(open_=[staged])
    time.sleep(0.1)
    with open(staged, "ab") as f:  # the feeder's next batch
        f.write(b"d" * 4096)
    result = teardown(ps)
    assert result.code == 0, (result.doc["verdict"], result.doc["problems"])
    assert os.path.exists(staged), result.doc["shm_removed"]
