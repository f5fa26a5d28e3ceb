"""/proc listed in shards, each worker its own (scripts/agent/procs/pidrange.py, fanout.map_shards):
together the shards are every pid once, a dense band of pids is spread over every worker, a
kernel that seeks otherwise is never trusted, and a worker that fails costs only speed."""
from __future__ import annotations

import fcntl
import os
import signal

import pytest

from scripts.agent.procs import devices, fanout, pidrange, procfs, procscan
from tests.support.procs import Bystanders, children, wait_for


def _listed():
    return {int(n) for n in os.listdir("/proc") if n.isdigit()}


def _argv0(pid):
    """The program a process runs now, as its command line's first word; None when it is gone
    (a bystander's shell forks it, and it runs `sleep` only once it has exec'd)."""
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read().split(b"\0")[0]
    except OSError:
        return None


def _identities():
    """(pid, start time) of every process now: a pid another test's process left may be reused."""
    return {(pid, st["start_time"]) for pid, st in ((p, procfs.read_stat(p)) for p in _listed()) if st}


@pytest.fixture
def fresh_offsets(monkeypatch):
    """pidrange learns the offset once per agent: each test learns it again."""
    monkeypatch.setattr(pidrange, "_OFFSETS", {})


def test_the_shards_are_every_pid_once_and_spread_a_band_over_every_shard(fresh_offsets):
    with Bystanders(3000) as band:
        mine = set(children(band.shell.pid))
        lister = pidrange.open_lister()
        assert lister is not None and lister.offset > 0
        try:
            for shards in (1, 2, 3, 16, 128):
                before = _identities()
                shares = [pidrange.shard_list(lister, k, shards, procscan.listing) for k in range(shards)]
                stable = {pid for pid, _ in before & _identities()}
                together = [p for share in shares for p in share]
                assert len(together) == len(set(together))  # no pid in two shards
                assert stable <= set(together)  # every process there throughout is listed
                assert all(share == sorted(share) for share in shares)
                if shards in (2, 3):  # the band's 3,000 pids: ~47 chunks, dealt round
                    counts = [len(mine & set(share)) for share in shares]
                    assert min(counts) >= len(mine) / shards / 2, counts
        finally:
            lister.close()


def test_the_estimate_is_of_the_right_size():
    """Right to a factor of 3 (it only picks how many workers a scan forks), under other tests'
    processes coming and going: at least this band's, at most all there were."""
    with Bystanders(3000) as band:
        lister = pidrange.open_lister()
        try:
            before = _listed()
            estimate = pidrange.estimate(lister)
            most = max(len(before), len(_listed()))
            mine = len(children(band.shell.pid))
            assert mine / 3 <= estimate <= most * 3
            assert pidrange.threads_on_host() >= mine  # threads too: at least the processes
        finally:
            lister.close()


def test_a_kernel_that_seeks_otherwise_is_not_trusted_and_the_scan_misses_nothing(fresh_offsets, monkeypatch,
                                                                                   tmp_path):
    """A seek one pid off (an older kernel's offset) would skip the first pid of every chunk:
    the offset's check refuses it, and the scan lists /proc as before."""
    real_seek = pidrange.Lister.seek
    monkeypatch.setattr(pidrange.Lister, "seek", lambda self, pid: real_seek(self, pid + 1))
    assert pidrange.open_lister() is None
    assert pidrange.open_lister() is None  # learnt once: not tried again
    (tmp_path / "nvidia0").touch()
    with Bystanders(1500) as band:
        snap = procscan.snapshot(devices.DeviceSet(str(tmp_path / "nvidia*"), fake=True))
        assert set(children(band.shell.pid)) <= set(snap["procs"])


def test_a_scan_of_a_big_host_lists_in_shards_and_sees_every_process(fresh_offsets, tmp_path, monkeypatch):
    (tmp_path / "nvidia0").touch()
    sharded = []
    real = fanout.map_shards
    monkeypatch.setattr(fanout, "map_shards", lambda *a, **k: sharded.append(a[2:4]) or real(*a, **k))
    monkeypatch.setattr(fanout, "cores", lambda: 4)
    with Bystanders(2 * procscan.SHARDED_FROM) as band:
        mine = set(children(band.shell.pid))
        wait_for(lambda: all(_argv0(pid) in (b"sleep", None) for pid in mine), "the bystanders to exec sleep")
        seen = {}
        snap = procscan.snapshot(devices.DeviceSet(str(tmp_path / "nvidia*"), fake=True),
                                 mark=lambda info: "sleep" in info["argv"][:1] and "bystander",
                                 early=lambda records, kin: seen.setdefault("marked", records))
        assert sharded == [(4 * procscan.SHARDS_PER_WORKER, 4)] and snap["workers"] == 4
        assert mine <= set(snap["procs"])
        assert mine <= {r["pid"] for r in seen["marked"]}  # the early callback saw every shard's
        again = procscan.snapshot(devices.DeviceSet(str(tmp_path / "nvidia*"), fake=True), known=snap["procs"])
        assert mine <= set(again["procs"]) and len(sharded) == 2  # the plan's count picks the workers


def _dies_in_worker(at):
    here = os.getpid()

    def check(items):
        if os.getpid() != here and at in items:
            os._exit(3)
        return list(items)
    return check


def test_every_shard_comes_back_once_when_workers_take_them_from_the_queue():
    items = list(range(5000))
    answers: list = []
    parts, workers = fanout.map_shards(lambda p: list(p), lambda s, n: [x for x in items if x % n == s], 37, 4,
                                       piece=50, first=lambda block: list(block), on_first=answers.append)
    assert workers == 4
    assert sorted(x for p in parts for x in p) == items
    assert len(answers) == 1 and sorted(x for a in answers[0] for x in a) == items


def test_map_shards_lists_here_what_a_dead_worker_took_and_runs_what_it_never_sent():
    items = list(range(3000))
    listing_dies = _dies_in_worker(1)  # the worker that takes shard 1 dies listing it: taken, never reported

    def shard(s, n):
        return listing_dies([x for x in items if x % n == s])

    answers: list = []
    parts, workers = fanout.map_shards(_dies_in_worker(700), shard, 8, 4, piece=50,
                                       first=lambda block: list(block), on_first=answers.append)
    assert workers == 4
    assert sorted(x for p in parts for x in p) == items  # shard 1 listed here; 700's piece run here
    assert len(answers) == 1 and sorted(x for a in answers[0] for x in a) == items
    parts, _ = fanout.map_shards(lambda p: list(p), shard, 3, 2)  # no first stage: no callback needed
    assert sorted(x for p in parts for x in p) == items
    parts, workers = fanout.map_shards(lambda p: list(p), lambda s, n: [x for x in items if x % n == s], 5, 0)
    assert workers == 0 and sorted(x for p in parts for x in p) == items  # no worker: all of it here


def test_a_queue_pipe_smaller_than_the_shards_never_hangs_and_loses_no_shard(monkeypatch):
    """A pipe can be one page (a user past fs.pipe-user-pages-soft, an older kernel): filling it
    with more tokens than fit, before any worker reads, blocked for ever. What does not fit is
    run here."""
    real_pipe = os.pipe

    def one_page_pipe():
        r, w = real_pipe()
        fcntl.fcntl(w, 1031, 4096)  # F_SETPIPE_SZ: shrinking is allowed to anyone
        return r, w

    monkeypatch.setattr(os, "pipe", one_page_pipe)

    def hung(*_):
        raise TimeoutError("map_shards hung filling its queue")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(60)
    try:
        parts, _ = fanout.map_shards(lambda p: list(p), lambda s, n: [s], 4097, 2)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert sorted(x for p in parts for x in p) == list(range(4097))


def test_a_shard_whose_seeked_listing_fails_is_taken_from_the_whole_listing(fresh_offsets, monkeypatch):
    lister = pidrange.open_lister()
    try:
        def refused(self, pid):
            raise OSError(22, "seek refused")

        monkeypatch.setattr(pidrange.Lister, "seek", refused)
        pids = list(range(1, 1000))
        assert pidrange.shard_list(lister, 3, 5, lambda: iter(pids)) == [
            p for p in pids if (p // pidrange.CHUNK) % 5 == 3]
    finally:
        lister.close()
