"""The podman fixture runs its containers with a runtime that works on this host, and skips,
naming each runtime's error, where none does.

Why: crun refuses a cgroup-v1 or hybrid host ("cgroups in hybrid mode not supported") where
runc works, so a fixed runtime fails the podman tests on one kind of host or the other. The
refusing runtime here is a script that answers as crun does on such a host (crun itself may be
missing); podman, conmon and the runtime after it are real.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import need_tools
from tests.support.managers_fixtures import NoRuntime, Podman, runtime_candidates

HYBRID = "cgroups in hybrid mode not supported"


def _refusing(tmp_path: Path, name: str) -> str:
    path = tmp_path / name
    path.write_text(f"#!/bin/sh\necho '{name}: {HYBRID}' >&2\nexit 1\n")
    os.chmod(path, 0o755)
    return str(path)


def test_runc_is_tried_first_unless_the_host_is_cgroup_v2_only():
    assert runtime_candidates("cgroup2fs") == ("crun", "runc")
    assert runtime_candidates("tmpfs") == ("runc", "crun")


def test_a_runtime_that_refuses_the_host_is_passed_over_for_one_that_runs(tmp_path):
    need_tools("podman", "conmon", why="a real podman container")
    refusing = _refusing(tmp_path, "crun-refusing")
    pm = Podman(tmp_path, runtimes=(refusing, *runtime_candidates()))
    try:
        assert pm.runtime in runtime_candidates()
        pm.run("gpu-pivot-rt", ["/bin/sleep", "30"], tmp_path)
        pm.main_pid("gpu-pivot-rt")
        assert pm.state("gpu-pivot-rt") == "running"
    finally:
        pm.down()


def test_where_no_runtime_runs_a_container_the_reason_names_each(tmp_path):
    need_tools("podman", "conmon", why="a real podman container")
    runtimes = (_refusing(tmp_path, "rt-one"), _refusing(tmp_path, "rt-two"))
    with pytest.raises(NoRuntime) as caught:
        Podman(tmp_path, runtimes=runtimes)
    said = str(caught.value)
    assert said.startswith("no OCI runtime runs a container here")
    for runtime in runtimes:
        assert f"{runtime}: " in said
    assert HYBRID in said
