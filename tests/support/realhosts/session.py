"""Session-scoped real hosts for pytest: sweep, boot (or skip/fail with a clear reason), down.

Why here: every kind (plain systemd, docker, Proxmox-like node) follows the same rules. A
crashed earlier run's leftovers are swept first; the host is shared by the whole session
(booting costs about a second); on the way down anything left behind fails the session.
Skipped only where this machine cannot host them (not root); a missing package skips
locally but fails under CI=true, where .ci/run installs it. What the tests of every kind
share: the real CLI on a wide screen, its text, a wait that names what it waited for, and
who holds a host's fake GPU files.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import time

import pytest

from tests.conftest import invoke as invoke_cli
from tests.support.realhosts.systemd_host import sweep


def require(tools=()) -> None:
    """Skip where this machine cannot host a real host (not root); a missing tool skips locally
    and fails under CI=true."""
    if os.geteuid() != 0:
        pytest.skip("real hosts need root (namespaces, mounts, cgroups); this run is not root")
    missing = [t for t in ("unshare", "nsenter", "sshd", *tools) if not shutil.which(t)]
    if missing:
        why = f"real host needs {', '.join(missing)} (apt-get install; .ci/run does)"
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)


@contextlib.contextmanager
def hosted(host, tools=()):
    """For a session fixture: `with hosted(host) as h: ... yield h` boots it, takes it down after."""
    require(tools)
    sweep()
    try:
        host.up()
    except BaseException:
        try:
            host.down()  # whatever the failed boot left
        except Exception as exc:
            print(f"while taking down {host.name} after a failed boot: {exc}")
        raise
    try:
        yield host
    finally:
        host.down()


def invoke(*args):
    """The real CLI, on a screen wide enough that no line of a report is wrapped."""
    res = invoke_cli(*args, env=dict(os.environ, COLUMNS="200"))
    keep = os.environ.get("GPU_PIVOT_REALHOST_REPORTS")  # a file to collect the reports in, for people
    if keep and args[0] in ("teardown", "plan"):
        with open(keep, "a") as f:
            f.write(f"$ invoke {' '.join(args)}   (exit {res.returncode})\n{text(res)}\n")
    return res


def text(res) -> str:
    return res.stdout.decode(errors="replace") + res.stderr.decode(errors="replace")


def wait_for(cond, timeout=60.0, what="condition"):
    """Until cond() is true; the deadline is for a loaded machine, and names what was waited for."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def holders(host) -> list[str]:
    """pids (as the host sees them) holding its fake GPU files."""
    return host.sh("fuser /dev/nvidia0 /dev/nvidia1 2>/dev/null").stdout.split()
