"""Session-scoped real hosts for pytest: sweep, boot (or skip/fail with a clear reason), down.

Why here: every kind (plain systemd, docker, Proxmox-like node) follows the same rules. A
crashed earlier run's leftovers are swept first; the host is shared by the whole session
(booting costs about a second); on the way down anything left behind fails the session.
Skipped only where this machine cannot host them (not root); a missing package skips
locally but fails under CI=true, where .ci/run installs it.
"""
from __future__ import annotations

import contextlib
import os
import shutil

import pytest

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
