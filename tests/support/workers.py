"""How `make test` spreads the suite over pytest-xdist workers (a pytest plugin; conftest.py
registers it when pytest-xdist is installed).

- Every worker but gw0 runs in namespaces of its own (tests/support/pidns.py: its own /proc, ports,
  /run), where no process of the machine can change a test's result. That needs root; without
  it every worker runs as a plain process (the tests that need root skip anyway).
- gw0 stays in the machine's namespaces and runs only the tests marked `host_pid_ns`: the
  kernel sends fork events (forkwatch) to listeners in the first PID and network namespace
  only. Those tests watch only processes they started. With one worker (-n 1) gw0 runs all.
- Tests that share an expensive module- or session-scoped fixture (a real systemd, docker or
  Proxmox-like host, the Slurm cluster, an Ansible pair of hosts, a sandbox) form one xdist
  group, so the fixture is set up once, on one worker (`--dist loadgroup`).
"""
from __future__ import annotations

import json
import shlex
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
from xdist.scheduler import LoadGroupScheduling

from tests.support import durations, pidns

HOST_GROUP = "host-pid-ns"
HOST_WORKER = "gw0"
_why_not = None


def sandboxed_python() -> str:
    return " ".join(shlex.quote(p) for p in (sys.executable, str(Path(pidns.__file__)), "--", sys.executable))


@pytest.hookimpl
def pytest_xdist_setupnodes(config, specs):
    global _why_not
    if len(specs) < 2:
        return
    _why_not = pidns.usable()
    if _why_not:
        return
    for spec in specs:
        if spec.id != HOST_WORKER and spec.popen and not spec.python:
            spec.python = sandboxed_python()


@pytest.hookimpl
def pytest_report_header(config):
    if getattr(config.option, "numprocesses", None) and _why_not:
        return f"xdist workers: not in namespaces of their own ({_why_not})"
    return None


def _group(item) -> str | None:
    """HOST_GROUP for `host_pid_ns` tests; else the module- or session-scoped fixtures defined in
    test modules that the test uses (the light ones of conftest.py, like sshd, are per worker)."""
    if item.get_closest_marker("host_pid_ns"):
        return HOST_GROUP
    info = getattr(item, "_fixtureinfo", None)
    shared = set()
    for name in info.names_closure if info else ():
        defs = info.name2fixturedefs.get(name)
        if defs and defs[-1].scope in ("session", "package", "module") and ".py" in (defs[-1].baseid or ""):
            shared.add(f"{defs[-1].baseid}::{name}")
    return "+".join(sorted(shared)) or None


# Groups travel from the workers (which collect) to the controller (which schedules) in files:
# pytest 9 ignores the nodeid suffix pytest-xdist's own loadgroup sets.
_groups_dir: str | None = None


@pytest.hookimpl
def pytest_configure(config):
    global _groups_dir
    if not hasattr(config, "workerinput") and config.getoption("dist", "no") != "no":
        _groups_dir = tempfile.mkdtemp(prefix="gpu-pivot-groups-")


@pytest.hookimpl
def pytest_unconfigure(config):
    if _groups_dir:
        shutil.rmtree(_groups_dir, ignore_errors=True)


@pytest.hookimpl
def pytest_configure_node(node):
    node.workerinput["gpu_pivot_groups"] = _groups_dir


@pytest.hookimpl(tryfirst=True)
def pytest_collection_finish(session):
    where = getattr(session.config, "workerinput", {}).get("gpu_pivot_groups")
    if where:
        groups = {item.nodeid: g for item in session.items if (g := _group(item))}
        path = Path(where) / f"{session.config.workerinput['workerid']}.json"
        path.with_suffix(".tmp").write_text(json.dumps(groups))
        path.with_suffix(".tmp").rename(path)


def _groups() -> dict:
    out: dict = {}
    for path in sorted(Path(_groups_dir).glob("*.json")) if _groups_dir else ():
        out.update(json.loads(path.read_text()))
    return out


class HostPinnedScheduling(LoadGroupScheduling):
    """loadgroup, where the group HOST_GROUP goes only to the worker left in the machine's
    namespaces (gw0), and that worker gets nothing else. Without sandboxed workers (not root),
    or without gw0, or with one worker, any worker takes any group."""

    def _split_scope(self, nodeid: str) -> str:
        if not hasattr(self, "_group_of"):
            self._group_of = _groups()
        return self._group_of.get(nodeid, nodeid)

    def _fits(self, node, scope: str) -> bool:
        if _why_not is not None or len(self.nodes) < 2 or not any(n.gateway.id == HOST_WORKER for n in self.nodes):
            return True
        return (scope == HOST_GROUP) == (node.gateway.id == HOST_WORKER)

    def _assign_work_unit(self, node) -> None:
        scope = next((s for s in self.workqueue if self._fits(node, s)), None)
        if scope is None:
            return
        work_unit = self.workqueue.pop(scope)
        self.assigned_work.setdefault(node, {})[scope] = work_unit
        collection = self.registered_collections[node]
        node.send_runtest_some([collection.index(nodeid) for nodeid, done in work_unit.items() if not done])

    def _reschedule(self, node) -> None:
        if node.shutting_down:
            return
        if not any(self._fits(node, s) for s in self.workqueue):
            node.shutdown()  # nothing left that this worker may run: it ends what it has, then stops
            return
        if self._pending_of(self.assigned_work[node]) > 2:
            return
        self._assign_work_unit(node)

    def schedule(self) -> None:
        assert self.collection_is_completed
        if self.collection is not None:
            for node in self.nodes:
                self._reschedule(node)
            return
        if not self._check_nodes_have_same_collection():
            self.log("**Different tests collected, aborting run**")
            return
        self.collection = list(next(iter(self.registered_collections.values())))
        if not self.collection:
            return
        units: dict[str, dict[str, bool]] = {}
        for nodeid in self.collection:
            units.setdefault(self._split_scope(nodeid), {})[nodeid] = False
        seconds = durations.known()
        cost = {scope: sum(seconds.get(n, durations.DEFAULT_S) for n in nodeids) for scope, nodeids in units.items()}
        for scope, nodeids in sorted(units.items(), key=lambda item: -cost[item[0]]):
            self.workqueue[scope] = nodeids  # the longest work first (durations.py): it sets the wall time
        for _ in range(2):  # a worker runs a test once it knows the next one (or is told to stop)
            for node in self.nodes:
                self._reschedule(node)


@pytest.hookimpl
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") == "loadgroup":
        return HostPinnedScheduling(config, log)
    return None
