"""/proc listed in shards, each worker its own (scripts/agent/procs/pidrange.py, fanout.map_shards):
together the shards are every pid once, a dense band of pids is spread over every worker, a
kernel that seeks otherwise is never trusted, and a worker that fails costs only speed."""
from __future__ import annotations

import os

import pytest

from scripts.agent.procs import devices, fanout, pidrange, procscan
from tests.procs import Bystanders, children


def _listed():
    return {int(n) for n in os.listdir("/proc") if n.isdigit()}


@pytest.fixture
def fresh_offsets(monkeypatch):
    """pidrange learns the offset once per agent: each test learns it again."""
    monkeypatch.setattr(pidrange, "_OFFSETS", {})


def test_the_shards_are_every_pid_once_and_spread_a_band_over_every_worker(fresh_offsets):
    with Bystanders(3000) as band:
        mine = set(children(band.shell.pid))
        lister = pidrange.open_lister()
        assert lister is not None and lister.offset > 0
        try:
            for workers in (1, 2, 3, 16):
                before = _listed()
                shares = [pidrange.shard_list(lister, k, workers) for k in range(workers)]
                after = _listed()
                together = [p for share in shares for p in share]
                assert len(together) == len(set(together))  # no pid in two shards
                assert (before & after) <= set(together)  # every process there throughout is listed
                assert all(share == sorted(share) for share in shares)
                if workers in (2, 3):  # the band's 3,000 pids: ~24 chunks, dealt round
                    counts = [len(mine & set(share)) for share in shares]
                    assert min(counts) >= len(mine) / workers / 2, counts
        finally:
            lister.close()


def test_the_estimate_is_of_the_right_size():
    with Bystanders(3000):
        lister = pidrange.open_lister()
        try:
            count = len(_listed())
            assert count / 3 <= pidrange.estimate(lister) <= count * 3
            assert pidrange.threads_on_host() >= count - 50  # threads too: at least the processes
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
    monkeypatch.setattr(fanout, "map_shards", lambda *a, **k: sharded.append(a[2]) or real(*a, **k))
    monkeypatch.setattr(fanout, "cores", lambda: 4)
    with Bystanders(procscan.SHARDED_FROM + 500) as band:
        seen = {}
        snap = procscan.snapshot(devices.DeviceSet(str(tmp_path / "nvidia*"), fake=True),
                                 mark=lambda info: "sleep" in info["argv"][:1] and "bystander",
                                 early=lambda records, kin: seen.setdefault("marked", records))
        mine = set(children(band.shell.pid))
        assert sharded == [4] and snap["workers"] == 4
        assert mine <= set(snap["procs"])
        assert mine <= {r["pid"] for r in seen["marked"]}  # the early callback saw every shard's
        again = procscan.snapshot(devices.DeviceSet(str(tmp_path / "nvidia*"), fake=True), known=snap["procs"])
        assert mine <= set(again["procs"]) and sharded == [4, 4]  # the plan's count picks the workers


def test_map_shards_lists_here_the_shard_of_a_worker_that_died_and_runs_what_it_never_sent():
    items = list(range(3000))
    here = os.getpid()

    def shard(k, n):
        if os.getpid() != here and k == 1:
            os._exit(3)  # dies while listing: its shard is listed here
        return [x for x in items if x % n == k]

    def piece(p):
        if os.getpid() != here and 700 in p:
            os._exit(3)  # dies after its first frame: the pieces it never sent are run here
        return list(p)

    answers: list = []
    parts, workers = fanout.map_shards(piece, shard, 4, piece=50, first=lambda block: list(block),
                                       on_first=answers.append)
    assert workers == 4
    assert sorted(x for p in parts for x in p) == items
    assert len(answers) == 1 and sorted(x for a in answers[0] for x in a) == items
    parts, _ = fanout.map_shards(lambda p: list(p), shard, 3)  # no first stage: no callback needed
    assert sorted(x for p in parts for x in p) == items
