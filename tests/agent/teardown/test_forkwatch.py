"""forkwatch against real processes: forks during a teardown, double forks out of the tree.

Why these cases: a target that forks while it handles SIGTERM, or whose child double-forks
(the middle link exits within a millisecond, the grandchild is re-parented to PID 1), is
invisible to a /proc ppid walk; the watch must still name it, with who forked it, and must
never adopt a process the targets did not start. Every process started here is ended by
PID (and start time) at the end.
"""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scripts.agent.procs import procfs
from scripts.agent.teardown.forkwatch import ForkWatch
from tests.support.paths import REPO
from tests.support.procs import wait_for

# The kernel sends fork events only to listeners in the machine's own PID and network namespace:
# these run on the xdist worker left there (tests/support/workers.py), and watch only what they start.
pytestmark = pytest.mark.host_pid_ns


# A root that forks on SIGUSR1. kind "double": a child forks N grandchildren and exits at
# once (each grandchild writes its pid); "plain": a child that stays. The root reaps the
# child and writes its pid, so the test knows the middle link of the double fork.
ROOT = r"""
import os, signal, sys, time
out, kind, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
def write(path, text):
    fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.write(fd, text.encode())
    os.close(fd)
    os.rename(path + ".tmp", path)
def stay(path):
    write(path, str(os.getpid()))
    time.sleep(120)
    os._exit(0)
round = [0]
def on_usr1(*_):
    round[0] += 1
    tag = "%s.%d" % (out, round[0])
    c = os.fork()
    if c == 0:
        if kind == "plain":
            stay(tag + ".c")
        for i in range(n):
            if os.fork() == 0:
                stay("%s.g%d" % (tag, i))
        os._exit(0)
    if kind == "double":
        os.waitpid(c, 0)
        write(tag + ".c", str(c))
signal.signal(signal.SIGUSR1, on_usr1)
if len(sys.argv) > 4:
    c = os.fork()
    if c == 0:
        stay(out + ".pre")
write(out + ".ready", "1")
while True:
    signal.pause()
"""


class Procs:
    """What a test started: Popen objects and (pid, start) pairs, all killed by PID."""

    def __init__(self, base):
        self.base = base
        self.popens = []
        self.others = []
        self.n = 0

    def root(self, kind, n=1, session=False, pre_child=False):
        self.n += 1
        out = str(self.base / ("r%d" % self.n))
        argv = [sys.executable, "-c", ROOT, out, kind, str(n)] + (["pre"] if pre_child else [])
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, start_new_session=session)
        self.popens.append(p)
        wait_for(lambda: os.path.exists(out + ".ready"), "root ready")
        return p.pid, out

    def sleeper(self):
        p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], stdin=subprocess.DEVNULL)
        self.popens.append(p)
        return p.pid

    def read_pid(self, path):
        pid = int(wait_for(lambda: os.path.exists(path) and Path(path).read_text(), path))
        start = procfs.start_time(pid)
        if start is not None:
            self.others.append((pid, start))
        return pid

    def kill_all(self):
        for pid, start in self.others:
            procfs.signal_if_same(pid, start, signal.SIGKILL)
        for p in self.popens:
            p.kill()
            p.wait()


@pytest.fixture
def procs(tmp_path):
    ps = Procs(tmp_path)
    yield ps
    ps.kill_all()


def watch(pids, **kw):
    w = ForkWatch.start([(p, procfs.start_time(p)) for p in pids], **kw)
    return w


def connector_watch(pids, **kw):
    w = watch(pids, **kw)
    if w.mode != "connector":
        w.close()
        pytest.skip("process-events connector unusable here: %s" % w.note)
    return w


def poll_until(w, want, timeout=5.0):
    """Poll like a teardown (every 20 ms) until every pid in `want` was reported."""
    seen = {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for pid, start, parent in w.poll():
            seen[pid] = (start, parent)
        if set(want) <= set(seen):
            break
        time.sleep(0.02)
    return seen


def test_double_fork_grandchild_reported_with_lineage_and_strangers_not(procs):
    root, out = procs.root("double")
    stranger, sout = procs.root("double")  # same program, not a root of the watch
    w = connector_watch([root])
    proc_only = watch([root], connector=False)
    try:
        bystander = procs.sleeper()  # started while the watch runs
        os.kill(root, signal.SIGUSR1)
        os.kill(stranger, signal.SIGUSR1)
        child = procs.read_pid(out + ".1.c")
        grand = procs.read_pid(out + ".1.g0")
        stranger_grand = procs.read_pid(sout + ".1.g0")
        seen = poll_until(w, [grand])

        assert grand in seen, seen
        assert seen[grand] == (procfs.start_time(grand), child)
        assert w.lineage(grand) == [child, root]
        # It really left the tree: the middle link is gone, the grandchild re-parented.
        assert procfs.read_stat(child) is None
        assert procfs.read_stat(grand)["ppid"] not in (root, child)
        # Only descendants: neither the stranger's grandchild nor a bystander, and not the
        # middle link, which was gone before it could be read.
        assert not {stranger, stranger_grand, bystander, child} & set(seen)
        # The bug class: a /proc walk of the same tree cannot see the grandchild.
        assert proc_only.poll() == []
    finally:
        w.close()
        proc_only.close()


def test_ten_forks_in_a_loop_all_reported(procs):
    root, out = procs.root("double", n=10)
    w = connector_watch([root])
    try:
        os.kill(root, signal.SIGUSR1)
        child = procs.read_pid(out + ".1.c")
        grands = [procs.read_pid("%s.1.g%d" % (out, i)) for i in range(10)]
        seen = poll_until(w, grands)
        assert set(grands) <= set(seen), (grands, seen)
        assert all(w.lineage(g) == [child, root] for g in grands)
        assert all(seen[g][1] == child for g in grands)
        assert w.poll() == []  # each is reported once
        assert not w.lost
    finally:
        w.close()


def test_forks_of_a_learned_child_chain_to_the_root(procs):
    """A plain child learned by the watch, then its own fork: both are descendants."""
    root, out = procs.root("plain")
    w = connector_watch([root])
    try:
        os.kill(root, signal.SIGUSR1)
        child = procs.read_pid(out + ".1.c")
        assert set(poll_until(w, [child])) == {child}
        os.kill(root, signal.SIGUSR1)  # a second round: another child
        second = procs.read_pid(out + ".2.c")
        assert set(poll_until(w, [second])) == {second}
        assert w.lineage(second) == [root]
    finally:
        w.close()


def test_overflow_sets_lost_and_a_proc_walk_fills_the_gap(procs):
    root, out = procs.root("plain")
    w = connector_watch([root], rcvbuf=4096)  # a few events fill it
    try:
        def flood():  # processes: a thread's events never reach the socket (ForkWatch._filter)
            for _ in range(300):
                pid = os.fork()
                if pid == 0:
                    os._exit(0)
                os.waitpid(pid, 0)
        flood()
        os.kill(root, signal.SIGUSR1)
        child = procs.read_pid(out + ".1.c")
        flood()
        seen = poll_until(w, [child])
        assert w.lost
        assert child in seen and seen[child][1] == root
    finally:
        w.close()


def test_proc_view_session_rule_pre_existing_child_and_kin(procs):
    """Without the connector: a root that leads its session keeps its double-forked
    grandchild (same session); a child that existed at start comes in the first poll."""
    root, out = procs.root("double", session=True, pre_child=True)
    pre = procs.read_pid(out + ".pre")
    bystander = procs.sleeper()
    w = watch([root], connector=False)
    assert w.mode == "proc" and "not requested" in w.note
    try:
        assert w.poll() == [(pre, procfs.start_time(pre), root)]
        os.kill(root, signal.SIGUSR1)
        procs.read_pid(out + ".1.c")  # written once the middle link is reaped
        grand = procs.read_pid(out + ".1.g0")
        assert procfs.read_stat(grand)["ppid"] != root
        seen = poll_until(w, [grand])
        assert seen.get(grand) == (procfs.start_time(grand), root), seen
        assert w.kin(grand) == "in the session led by %d" % root
        assert w.kin(bystander) is None
    finally:
        w.close()


def test_root_with_reused_pid_is_not_watched(procs):
    root, out = procs.root("plain")
    w = ForkWatch.start([(root, procfs.start_time(root) + 1)], connector=False)
    try:
        assert "ignored" in w.note
        os.kill(root, signal.SIGUSR1)
        child = procs.read_pid(out + ".1.c")
        time.sleep(0.05)
        assert child not in {p for p, _, _ in w.poll()}
        assert w.lineage(child) == []
    finally:
        w.close()


# Runs as PID 1 of a fresh PID namespace: the connector would report host PIDs, so the
# watch must fall back to /proc and still see a plain child and (its root leading its
# session) a double fork; it prints one JSON line and kills what it started by PID.
IN_NAMESPACE = r"""
import json, os, signal, subprocess, sys, time
sys.path.insert(0, sys.argv[1])
from scripts.agent.procs import procfs
from scripts.agent.teardown.forkwatch import ForkWatch
base, root_src = sys.argv[2], sys.argv[3]
started = []
def root(name, kind, session):
    p = subprocess.Popen([sys.executable, "-c", root_src, base + "/" + name, kind, "1"], start_new_session=session)
    started.append(p.pid)
    while not os.path.exists(base + "/" + name + ".ready"):
        time.sleep(0.01)
    return p.pid
def pid_of(path):
    while not os.path.exists(path) or not open(path).read():
        time.sleep(0.01)
    pid = int(open(path).read())
    started.append(pid)
    return pid
try:
    plain, double, stranger = root("p", "plain", False), root("d", "double", True), root("s", "double", True)
    w = ForkWatch.start([(p, procfs.start_time(p)) for p in (plain, double)])
    for p in (plain, double, stranger):
        os.kill(p, signal.SIGUSR1)
    child, grand, sgrand = pid_of(base + "/p.1.c"), pid_of(base + "/d.1.g0"), pid_of(base + "/s.1.g0")
    seen = {}
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not {child, grand} <= set(seen):
        seen.update((p, parent) for p, _, parent in w.poll())
        time.sleep(0.02)
    time.sleep(0.1)
    seen.update((p, parent) for p, _, parent in w.poll())
    print(json.dumps({"mode": w.mode, "note": w.note, "plain": plain, "double": double, "child": child,
                      "grand": grand, "stranger_grand": sgrand, "seen": {str(k): v for k, v in seen.items()},
                      "lineage": w.lineage(child)}))
    w.close()
finally:
    for pid in started:
        start = procfs.start_time(pid)
        if start is not None:
            procfs.signal_if_same(pid, start, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            if os.waitpid(-1, 0)[0] == 0:
                break
        except ChildProcessError:
            break
"""


def _unshare_works():
    try:
        probe = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True)
        return probe.returncode == 0
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not _unshare_works(), reason="needs unshare --pid (root or user namespaces)")
def test_pid_namespace_falls_back_to_proc_and_still_reports(tmp_path):
    res = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", IN_NAMESPACE,
                          str(REPO), str(tmp_path), ROOT], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout.strip().splitlines()[-1])
    assert doc["mode"] == "proc"
    assert "PID namespace" in doc["note"] or "self-test" in doc["note"]
    seen = {int(k): v for k, v in doc["seen"].items()}
    assert seen.get(doc["child"]) == doc["plain"]
    assert doc["lineage"] == [doc["plain"]]
    assert seen.get(doc["grand"]) == doc["double"]  # by its session, the middle link gone
    assert doc["stranger_grand"] not in seen
