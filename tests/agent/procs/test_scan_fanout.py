"""The holder scan split across forked workers (scripts/agent/procs/fanout.py) says what a one-core
scan says: the same processes, holders and mappings (a device opened or mapped under another
name too), and a worker that fails costs only speed."""
from __future__ import annotations

import os
import subprocess
import sys

from scripts.agent.procs import devices, fanout, procfs, procscan
from tests.support.procs import wait_for

HOLD = """
import mmap, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR)
if sys.argv[2] == "map-then-close":
    m = mmap.mmap(fd, 4096)
    os.close(fd)
open(sys.argv[3], "w").close()
time.sleep(600)
"""


def _identities():
    """(pid, start time) of every process now: a pid another test's process left may be reused."""
    return {(pid, st["start_time"]) for pid, st in ((p, procfs.read_stat(p)) for p in procscan.all_pids()) if st}


def _map(func, items, workers, **kw):
    """fanout.map_stream over a list with this many workers."""
    return fanout.map_stream(func, iter(items), lambda n: workers, **kw)[0]


def test_every_piece_comes_back_and_what_a_worker_did_not_send_is_run_here():
    items = list(range(1000))
    parts = _map(lambda piece: sorted(piece), items, 4, piece=50)
    assert sorted(x for p in parts for x in p) == items
    here = os.getpid()

    def dies_halfway(piece):
        if os.getpid() != here and 500 in piece:
            os._exit(3)  # a worker gone mid-share: its later pieces never come
        return list(piece)

    for workers in (2, 4):
        parts = _map(dies_halfway, items, workers, piece=40)
        assert sorted(x for p in parts for x in p) == items


def test_workers_are_one_per_core_and_never_for_a_short_list(monkeypatch):
    monkeypatch.setattr(fanout, "cores", lambda: 16)
    assert fanout.workers_for(100) == 1
    assert fanout.workers_for(1000) == 4
    assert fanout.workers_for(20000) == 16


def test_a_scan_in_workers_says_what_a_one_core_scan_says(tmp_path, monkeypatch):
    gpu = tmp_path / "nvidia0"
    gpu.write_bytes(b"\0" * 4096)
    alias = tmp_path / "another-name"
    os.link(gpu, alias)  # the same inode under another name: a holder by identity
    procs = []
    try:
        for how, path in (("hold", gpu), ("map-then-close", alias), ("hold", alias)):
            ready = tmp_path / f"ready-{len(procs)}"
            procs.append(subprocess.Popen([sys.executable, "-c", HOLD, str(path), how, str(ready)]))
            wait_for(ready.exists, f"holder {len(procs)}")
        devset = devices.DeviceSet(str(tmp_path / "nvidia*"), fake=True)
        before = _identities()
        monkeypatch.setattr(fanout, "workers_for", lambda n: 1)
        one = procscan.snapshot(devset)
        monkeypatch.setattr(fanout, "workers_for", lambda n: 3)
        three = procscan.snapshot(devset)
        stable = before & _identities()  # others on the machine come and go (and their pids are reused) meanwhile
        mine = {p.pid for p in procs}
        for snap in (one, three):
            assert {pid for pid in snap["holders"] if pid in mine} == mine, snap["holders"]
            assert set(snap["mapped"]) & mine == {procs[1].pid}
        assert {k: three["holders"][k] for k in mine} == {k: one["holders"][k] for k in mine}
        for snap in (one, three):  # both saw every process there throughout
            assert stable <= {(p, r["start_time"]) for p, r in snap["procs"].items()}
        assert all(one["procs"][p]["cmdline"] == three["procs"][p]["cmdline"] for p in mine)
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_the_scan_survives_an_ignored_sigchld(tmp_path, monkeypatch):
    """A service manager or CI runner may start the agent with SIGCHLD ignored (it is inherited):
    the kernel then reaps the workers itself, and waiting for them must not end the scan."""
    import signal

    old = signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    try:
        assert sorted(x for part in _map(list, list(range(2000)), 2) for x in part) == list(range(2000))
        (tmp_path / "nvidia0").touch()
        monkeypatch.setattr(fanout, "workers_for", lambda count: 2)
        snap = procscan.snapshot(devices.DeviceSet(str(tmp_path / "nvidia*"), fake=True))
        assert os.getpid() in snap["procs"] and snap["workers"] == 2
    finally:
        signal.signal(signal.SIGCHLD, old)


def test_the_first_stage_reaches_on_first_once_with_every_share_while_the_pieces_still_run(tmp_path):
    """on_first gets every share's first answer while the workers still run their pieces: the
    last piece of each worker waits for the file on_first makes (20 s at most, then says so)."""
    items = list(range(1000))
    flag = tmp_path / "first-seen"
    calls = []

    def on_first(answers):
        calls.append(sorted(x for a in answers for x in a))
        flag.touch()

    def piece(p):
        if os.getpid() != here and p[-1] >= 990:
            try:
                wait_for(flag.exists, "on_first before the last pieces", 20)
            except Exception:  # raised in a worker, the piece would be run here again: say it instead
                return ["late"]
        return list(p)

    here = os.getpid()
    for workers in (2, 4):
        calls.clear()
        flag.unlink(missing_ok=True)
        parts = _map(piece, items, workers, piece=50, first=lambda share: list(share), on_first=on_first)
        assert calls == [items]  # once, with every share
        assert not any("late" in p for p in parts)
        assert sorted(x for p in parts for x in p) == items


def test_map_stream_starts_workers_as_the_listing_grows_and_gives_every_item_back():
    items = list(range(3000))
    listed = []

    def listing():
        for x in items:
            listed.append(x)
            yield x

    answers = []
    parts, workers = fanout.map_stream(lambda p: list(p), listing(), lambda n: min(5, n // 250), piece=40,
                                       first=lambda block: len(block), on_first=answers.append)
    assert workers == 5 and listed == items
    assert sorted(x for p in parts for x in p) == items
    assert len(answers) == 1 and sum(answers[0]) == len(items)  # every block's answer, once
    parts, workers = fanout.map_stream(lambda p: list(p), iter(range(100)), lambda n: 4)
    assert workers == 4 and sorted(x for p in parts for x in p) == list(range(100))  # the count asks for them
    parts, workers = fanout.map_stream(lambda p: list(p), iter(range(400)), lambda n: 1)
    assert workers == 1 and parts == [list(range(400))]  # a one-core scan: here, no fork
    parts, workers = fanout.map_stream(lambda p: list(p), iter(range(3000)), lambda n: 1)
    assert workers == 1 and sorted(x for p in parts for x in p) == list(range(3000))  # never more than asked


def test_map_stream_runs_here_what_a_dead_worker_never_sent():
    here = os.getpid()

    def first(block):
        if os.getpid() != here and 1500 in block:
            os._exit(3)
        return list(block)

    def piece(p):
        if os.getpid() != here and 700 in p:
            os._exit(3)
        return list(p)

    answers = []
    parts, _ = fanout.map_stream(piece, iter(range(3000)), lambda n: 4, first=first, on_first=answers.append)
    assert sorted(x for p in parts for x in p) == list(range(3000))
    assert sorted(x for a in answers[0] for x in a) == list(range(3000))


def test_a_scan_with_an_early_callback_reads_records_lean_then_whole(tmp_path, monkeypatch):
    """Before the callback only a marked record is read whole (uid, command line shown); every
    record the scan returns is whole; the Kin knows each process's children."""
    (tmp_path / "nvidia0").touch()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        wait_for(lambda: ((procscan.basic(child.pid) or {}).get("argv") or [""])[-1].endswith("sleep(60)"), "child")
        seen = {}

        def early(records, kin):
            seen.update(records={r["pid"]: r for r in records}, kids=kin.children(os.getpid()))

        me = os.getpid()
        for workers in (1, 3):
            monkeypatch.setattr(fanout, "workers_for", lambda n, w=workers: w)
            snap = procscan.snapshot(devices.DeviceSet(str(tmp_path / "nvidia*"), fake=True),
                                     mark=lambda info: "me" if info["pid"] == me else None, early=early)
            assert set(seen["records"]) == {me} and seen["records"][me]["uid"] == os.getuid()
            assert "cmdline" in seen["records"][me]
            assert (child.pid, procscan.basic(child.pid)["start_time"]) in seen["kids"]
            assert all("uid" in r and "cmdline" in r for r in snap["procs"].values())
            assert snap["procs"][child.pid]["uid"] == os.getuid() and snap["workers"] == workers
    finally:
        child.kill()
        child.wait()


def test_a_process_gone_after_its_lean_read_stays_in_the_snapshot():
    """Before the first signal a process is read lean (stat, argv); its owner is read after.
    A wrapper that ended with its server in between (`setsid bash -c 'SERVER; echo exited'`
    under a restart loop) must stay in the snapshot as read: its parent is what links the
    targets to the loop that restarts them, and without it the window is skipped."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        lean = procscan.basic(child.pid, lean=True)
        assert lean is not None and "uid" not in lean
    finally:
        child.kill()
        child.wait()
    part = procscan._scan_part([child.pid], None, procscan.PROC, {}, read={child.pid: lean})
    procs = part["procs"]
    assert procs[child.pid]["ppid"] == os.getpid() and procs[child.pid]["uid"] == procscan.GONE_UID


def test_a_holder_gone_before_the_plan_is_not_a_target_signalled_outside_its_container():
    """A loop in a container (`while :; do sleep 1 & wait; done` under docker-init) forks a
    `sleep` that inherits the GPU fds: a holder when the fds are read, gone by the time its
    cgroup is. With no cgroup it passed for a bare process and the plan listed it to be
    signalled beside `docker stop` (CI). A process that exited before its details were read is
    marked gone and left out of the plan; a live one is kept."""
    from scripts.agent.holders.scan import Scan
    from scripts.agent.options.record import Options
    from scripts.agent.teardown import plan

    live = subprocess.Popen(["sleep", "60"])
    ended = subprocess.Popen(["sleep", "60"])
    try:
        records = {p.pid: procscan.basic(p.pid) for p in (live, ended)}
    finally:
        ended.kill()
        ended.wait()
    try:
        holders = [procscan.detail(records[p.pid], ["/dev/nvidia0"]) for p in (live, ended)]
        assert [h.get("gone", False) for h in holders] == [False, True]
        for h in holders:
            h["protected"] = None
        doc = Scan({"holders": holders}, records, set())
        args = Options(target=None, match=[], protect=[], scope=None, scope_uid=None,
                       only_matching=False, stop_starters=False, disable=False)
        built = plan.build(doc, args.selection)
        assert [(t["pid"], t["via"]) for t in built["targets"]] == [(live.pid, "signal")], built["targets"]
    finally:
        live.kill()
        live.wait()


EXEC_LATER = """
import os, sys, time
open(sys.argv[1], "w").close()
while not os.path.exists(sys.argv[2]):
    time.sleep(0.01)
os.execvp("sleep", ["sleep", "600"])
"""


def test_a_confirming_scan_reads_again_only_what_changed_since_the_plans(tmp_path, monkeypatch):
    """snapshot(known=the plan's records): a process still the same keeps its known record (one
    read, its stat, nothing sent back by a worker); one that exec'd another program, one whose
    parent died (reparented), and one started since are read whole; one gone is not there; a
    holder's fds are still read. In workers and on one core alike."""
    gpu = tmp_path / "nvidia0"
    gpu.write_bytes(b"\0" * 4096)
    devset = devices.DeviceSet(str(tmp_path / "nvidia*"), fake=True)
    started: list = []

    def start(argv, ready=None):
        started.append(subprocess.Popen(argv))
        if ready is not None:
            wait_for(ready.exists, f"{argv[:3]} ready")
        return started[-1]

    try:
        holder = start([sys.executable, "-c", HOLD, str(gpu), "hold", str(tmp_path / "held")], tmp_path / "held")
        still = start(["sleep", "600"])
        execs = start([sys.executable, "-c", EXEC_LATER, str(tmp_path / "up"), str(tmp_path / "go")], tmp_path / "up")
        parent = start(["sh", "-c", f"sleep 600 & echo $! > {tmp_path}/orphan; wait"])
        wait_for(lambda: (tmp_path / "orphan").exists() and (tmp_path / "orphan").read_text().strip(), "the orphan")
        orphan = int((tmp_path / "orphan").read_text())
        gone = start(["sleep", "600"])
        known = procscan.snapshot(devset)["procs"]
        assert known[orphan]["ppid"] == parent.pid
        (tmp_path / "go").touch()
        wait_for(lambda: procscan.basic(execs.pid)["argv"][:1] == ["sleep"], "the exec")
        parent.kill()
        parent.wait()
        wait_for(lambda: procscan.basic(orphan)["ppid"] != parent.pid, "the orphan reparented")
        gone.kill()
        gone.wait()
        new = start(["sleep", "601"])
        wait_for(lambda: procscan.basic(new.pid)["argv"] == ["sleep", "601"], "the new process's exec")
        for workers in (1, 3):
            monkeypatch.setattr(fanout, "workers_for", lambda n, w=workers: w)
            snap = procscan.snapshot(devset, known=known)
            procs = snap["procs"]
            assert procs[still.pid] is known[still.pid] and procs[holder.pid] is known[holder.pid]
            assert list(snap["holders"].get(holder.pid, [])) == [str(gpu)], snap["holders"]
            assert procs[execs.pid]["argv"] == ["sleep", "600"] and procs[execs.pid] is not known[execs.pid]
            assert procs[orphan]["ppid"] != parent.pid
            assert procs[new.pid]["argv"] == ["sleep", "601"] and gone.pid not in procs
    finally:
        for p in started:
            p.kill()
            p.wait()
        if "known" in locals() and orphan in known:  # ours, reparented: by pid and start time
            procfs.signal_if_same(orphan, known[orphan]["start_time"], 9)


def test_a_process_whose_stat_cannot_be_read_again_is_not_taken_for_gone(monkeypatch):
    """detail() asks whether the process is still there. Where /proc is mounted hidepid=noaccess
    and the agent is not root, another user's stat is refused (PermissionError); a record no
    parser understood has no start time. Neither can tell, so neither is "gone" (seen: the
    refusal crashed the scan of a GPU process NVML listed; before, it was not inspected: exit 6)."""
    from scripts.agent.procs import procfs

    child = subprocess.Popen(["sleep", "60"])
    try:
        record = procscan.basic(child.pid)

        def refused(pid, proc=procscan.PROC):
            raise PermissionError(1, "Operation not permitted", f"{proc}/{pid}/stat")

        monkeypatch.setattr(procfs, "read_stat", refused)
        assert "gone" not in procscan.detail(record, [])
        monkeypatch.undo()
        odd = procscan.not_understood(child.pid, ValueError("odd"))
        assert "gone" not in procscan.detail(odd, [])
    finally:
        child.kill()
        child.wait()


def test_a_target_gone_before_the_plan_still_leaves_what_started_it_watched(tmp_path):
    """A holder that exited between the scan and its details (a crash-looping server caught
    mid-crash) is not signalled, but it is kept in the plan's `gone`, and the teardown builds
    the lineage from it too: its parent, which may start it again, is related to it (seen:
    without it nothing 'could restart a target', and the restart came after FREED)."""
    from scripts.agent.holders.scan import Scan
    from scripts.agent.options.record import Options
    from scripts.agent.teardown import plan, settle

    starter = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time\n"
                                "p = subprocess.Popen(['sleep', '600'])\n"
                                "open(sys.argv[1], 'w').write(str(p.pid))\ntime.sleep(600)\n", str(tmp_path / "child")])
    try:
        child = int(wait_for(lambda: (tmp_path / "child").exists() and (tmp_path / "child").read_text(), "the child"))
        wait_for(lambda: (procscan.basic(child) or {}).get("argv", [])[:1] == ["sleep"], "the child's exec")
        records = {p: procscan.basic(p) for p in (starter.pid, child)}
        os.kill(child, 9)  # it crashes right after the scan read it (its parent has not reaped it)
        wait_for(lambda: not procfs.same_process(child, records[child]["start_time"]), "the crash")
        held = procscan.detail(records[child], ["/dev/nvidia0"])
        held["protected"] = None
        doc = Scan({"holders": [held]}, records, set())
        args = Options(target=None, match=[], protect=[], scope=None, scope_uid=None,
                       only_matching=False, stop_starters=False, disable=False)
        built = plan.build(doc, args.selection)
        assert built["targets"] == [] and [g["pid"] for g in built["gone"]] == [child]
        lineage = settle.Lineage(doc, built["targets"] + built["gone"], starters=built["starters"])
        assert (starter.pid, records[starter.pid]["start_time"]) in lineage.starters
        assert [s["pid"] for s in lineage.live_starters(0)] == [starter.pid]  # frozen, then named: exit 11
    finally:
        starter.kill()
        starter.wait()
