"""A FUSE mount that stops answering (tests/support/hung_fuse.py serves it): every stat() of its
file then waits for ever, as on a dead NFS server, and a process closing it at exit stays in
its exit. `hung_mount` mounts it and, at the end, kills the server first (that aborts the
connection and frees whatever waits on it), then what the test started on it, then detaches it."""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys

import pytest

from tests.support.paths import SUPPORT
from tests.support.procs import wait_for

# Holds the hung file at fd 3 and a (fake) GPU at fd 4, and declares GPU memory as a sandbox
# worker does: when it exits, the kernel closes fd 3 first and that close waits on the FUSE
# server for ever (a forced FLUSH), so it stays in its exit with the GPU still open.
STUCK_IN_EXIT = r"""
import json, os, sys, time
fuse_file, dev, memdir = sys.argv[1:4]
fd = os.open(fuse_file, os.O_RDONLY)
gpu = os.open(dev, os.O_RDWR)
if memdir != "-":
    with open("/proc/self/stat") as f:
        start = int(f.read().rsplit(")", 1)[1].split()[19])
    with open(os.path.join(memdir, "%d.json" % os.getpid()), "w") as f:
        json.dump({"gpu": 0, "mib": 4096, "start_time": start}, f)
print("holding", fd, gpu, flush=True)
time.sleep(300)
"""


def mounted(server, ready):
    """Wait for the FUSE server's "mounted" (or its exit: no FUSE here, skip)."""
    wait_for(lambda: (ready.exists() and ready.read_text() in ("mounted", "opened")) or server.poll() is not None,
             "the FUSE mount", timeout=20)
    if server.poll() is not None:
        pytest.skip(f"cannot mount FUSE here: {server.stderr.read().strip()[-200:]}")


@contextlib.contextmanager
def hung_mount(tmp_path):
    """Yields (server, mount point, ready file, [processes to end]); skips without root or /dev/fuse."""
    if os.geteuid() != 0 or not os.path.exists("/dev/fuse"):
        pytest.skip("needs root and /dev/fuse to mount a FUSE filesystem")
    mnt, ready = tmp_path / "mnt", tmp_path / "ready"
    mnt.mkdir()
    server = subprocess.Popen([sys.executable, str(SUPPORT / "hung_fuse.py"), str(mnt), str(ready)],
                              stderr=subprocess.PIPE, text=True)
    started: list = [server]
    try:
        mounted(server, ready)
        yield server, mnt, ready, started
    finally:
        for proc in started:
            if proc.poll() is None:
                proc.kill()
            proc.wait(30)
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
