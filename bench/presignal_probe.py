"""Where the time before the first SIGTERM goes, on a host of many processes.

  python3 bench/presignal_probe.py [--extra 20000] [--reps 5] [--out FILE.json]

The pieces of teardown.execute that run before the signal batch, each timed in this process
over the same host, median of the reps: the /proc holder scan (procscan.snapshot: one worker
per core on a big host), the rest of scan.collect (the holders' records, the GPU read), the
plan (plan.build), the fork watch's subscription and first walk, and the targets' records; and
when the early SIGTERM batch (agent/teardown/early.py) would go, counted from the same start. The target is a small tree
holding a fake device file (a parent and two children, scripts named with a token of their own), so the
run needs no GPU; the bystanders are idle `sleep`s (tests/support/procs.Bystanders). Nothing is
signalled: the probe stops where the teardown would send the SIGTERM.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from scripts.agent import cli  # noqa: E402
from scripts.agent.holders import scan  # noqa: E402
from scripts.agent.procs import fanout, procfs, procscan  # noqa: E402
from scripts.agent.teardown import early, plan, run as teardown  # noqa: E402
from scripts.agent.teardown.targets import Targets  # noqa: E402
from tests.support.procs import Bystanders  # noqa: E402

TREE = """import os, subprocess, sys, time
fd = open(sys.argv[1], "rb")
kids = [subprocess.Popen([sys.executable, sys.argv[2]]) for _ in range(2)]
print("ready", flush=True)
time.sleep(3600)
"""


PIECES = ("records_only_scan", "fork_watch_subscribe", "early_batch_at", "proc_scan", "rest_of_collect", "plan_build",
          "fork_watch_begin", "targets_init", "total")


class _NoAudit:
    records: list = []

    def log(self, *a, **k):
        return {}


def _args(devdir: str, token: str):
    return cli.parse(["teardown", "--devices", f"{devdir}/nvidia*", "--fake-devices",
                      "--match", token + r"_\w+\.py", "--scope", token])


def one(args, steps=None) -> dict:
    """One pass over the pieces, in the order teardown.execute runs them; seconds each. The
    early batch is picked (agent/teardown/early.py) but not sent: `early_batch_at` is when it would go."""
    out = {}
    tr = time.monotonic()
    procscan.snapshot(args.device_set(), fds=False, mark=scan._target_mark(args.selection))
    out["records_only_scan"] = time.monotonic() - tr  # not part of the total: what a scan without fds costs
    t0 = time.monotonic()
    watch = teardown._subscribe_watch()
    since = procfs.read_stat(os.getpid())["start_time"]
    t1 = time.monotonic()
    out["fork_watch_subscribe"] = t1 - t0
    seen = {}

    def batch(records, table=()):
        seen["rows"] = early.pick(records, args.selection, None, table)
        seen["at"] = time.monotonic()

    doc = scan.collect(args.selection, scan.gpuinfo.NoSource(), early=batch)
    t2 = time.monotonic()
    out["early_batch_at"] = seen["at"] - t0
    if steps is not None:
        out.update({"step_" + k: v for k, v in steps.pieces(t0).items()})
    out["proc_scan"] = doc["proc_scan_ms"] / 1000
    out["rest_of_collect"] = (t2 - t1) - out["proc_scan"]
    the_plan = early.merge(plan.build(doc, args.selection), seen["rows"])
    t3 = time.monotonic()
    out["plan_build"] = t3 - t2
    planned = the_plan["targets"]
    watch = teardown._begin_watch(watch, planned, doc.procs)
    t4 = time.monotonic()
    out["fork_watch_begin"] = t4 - t3
    Targets(planned, _NoAudit(), watch, chain=doc.chain | {os.getpid()}, protect=args.protect, since_ticks=since,
            scope_uid=args.scope_uid)
    t5 = time.monotonic()
    out["targets_init"] = t5 - t4
    out["total"] = t5 - t0
    out["targets"] = len(planned)
    out["early_targets"] = len(seen["rows"])
    out["processes"] = doc["processes_scanned"]
    if watch is not None:
        watch.close()
    return out


def _timed_worker(old, log, from_start):
    """A scan worker's body (fanout._stream_worker or _shard_worker) that writes to `log` when
    its first stage began (`from_start`: when the worker began, as a map_shards worker lists its
    own share first) and when it ended."""
    def f(func, first, *a, **k):
        begun = time.monotonic()
        seen: list = []

        def timed_first(items):
            t0 = time.monotonic()
            out = first(items)
            seen.append((t0, time.monotonic()))
            return out
        try:
            return old(func, timed_first if first is not None else None, *a, **k)
        finally:
            if seen:
                with open(log, "a") as fh:
                    fh.write("%r %r\n" % (begun if from_start else seen[0][0], seen[-1][1]))
    return f


class Steps:
    """Times inside the first stage, by wrapping what it calls (the workers write their own
    first-stage start and end to a file): the /proc listing where this process lists it
    (fanout.map_stream: workers read records meanwhile), the workers' forks, each worker's first
    stage (with map_shards, from its start: it lists its own share first), and the early
    batch's pick with its records' details."""

    def __init__(self):
        self.saved: list = []
        self.log = tempfile.NamedTemporaryFile(prefix="presignal-", delete=False)
        self.reset()

    def reset(self):
        self.t: dict = {"forks": [], "detail": 0.0}
        os.truncate(self.log.name, 0)

    def wrap(self, owner, name, make):
        old = getattr(owner, name)
        self.saved.append((owner, name, old))
        setattr(owner, name, make(old))

    def __enter__(self):
        log = self.log.name

        def listing(old):
            def f(*a, **k):
                self.t["listing_begin"] = time.monotonic()
                yield from old(*a, **k)
                self.t["listing_end"] = time.monotonic()
            return f

        def forked(old):
            def f(*a, **k):
                out = old(*a, **k)
                self.t["forks"].append(time.monotonic())
                return out
            return f

        def pick(old):
            def f(*a, **k):
                self.t["pick_begin"] = time.monotonic()
                out = old(*a, **k)
                self.t["pick_end"] = time.monotonic()
                return out
            return f

        def detail(old):
            def f(*a, **k):
                t0 = time.monotonic()
                out = old(*a, **k)
                self.t["detail"] += time.monotonic() - t0
                return out
            return f

        self.wrap(procscan, "listing", listing)
        self.wrap(fanout, "_grow", forked)
        self.wrap(fanout, "_fork_shard", forked)
        self.wrap(fanout, "_stream_worker", lambda old: _timed_worker(old, log, from_start=False))
        self.wrap(fanout, "_shard_worker", lambda old: _timed_worker(old, log, from_start=True))
        self.wrap(early, "pick", pick)
        self.wrap(procscan, "detail", detail)
        return self

    def __exit__(self, *exc):
        for owner, name, old in reversed(self.saved):
            setattr(owner, name, old)
        self.saved.clear()

    def pieces(self, t0):
        """Seconds from t0 (the fork watch's subscription, as `one` counts)."""
        t = self.t
        workers = [tuple(map(float, line.split())) for line in Path(self.log.name).read_text().splitlines()]
        out = {"detail_in_pick": t["detail"], "pick": t["pick_end"] - t["pick_begin"],
               "pick_begin_at": t["pick_begin"] - t0}
        if "listing_end" in t:  # listed here (fanout.map_stream); with map_shards each worker lists its share
            out.update(listing=t["listing_end"] - t["listing_begin"], listing_end_at=t["listing_end"] - t0)
        if t["forks"]:
            out["last_fork_at"] = t["forks"][-1] - t0
        if workers:
            out["worker_first_stage_max"] = max(e - b for b, e in workers)
            out["worker_first_stage_min"] = min(e - b for b, e in workers)
            out["last_worker_first_end_at"] = max(e for _, e in workers) - t0
        return out


def measure(args, reps: int, profile: bool = False, steps: bool = False) -> dict:
    runs = []
    for _ in range(reps):
        if not steps:
            runs.append(one(args))
            continue
        with Steps() as st:
            row = one(args, st)
        runs.append(row)
    if profile:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.runcall(one, args)
        pstats.Stats(prof).sort_stats("tottime").print_stats(18)
    keys = [k for k in runs[0] if k not in ("targets", "early_targets", "processes")]
    keys = [k for k in keys if all(k in r for r in runs)]
    row = {k: round(statistics.median(r[k] for r in runs), 4) for k in keys}
    row.update(targets=runs[0]["targets"], early_targets=runs[0]["early_targets"], processes=runs[0]["processes"],
               reps=reps, cores=fanout.cores(),
               workers=fanout.workers_for(runs[0]["processes"]))
    return row


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--extra", type=int, nargs="*", default=[20000])
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--out")
    p.add_argument("--profile", action="store_true", help="also print cProfile's top functions of one pass per row")
    p.add_argument("--steps", action="store_true",
                   help="also time the steps inside the first stage (listing, forks, the workers' first "
                        "stage, the early batch's pick and its records' details): step_* keys, seconds")
    a = p.parse_args()
    token = "gpvprobe%d" % os.getpid()
    with tempfile.TemporaryDirectory() as devdir:
        for i in range(2):
            Path(devdir, f"nvidia{i}").write_bytes(b"")
        server, worker = Path(devdir, f"{token}_server.py"), Path(devdir, f"{token}_worker.py")
        server.write_text(TREE)
        worker.write_text("import time\ntime.sleep(3600)\n")
        tree = subprocess.Popen([sys.executable, str(server), f"{devdir}/nvidia0", str(worker)], stdout=subprocess.PIPE,
                                start_new_session=True)
        try:
            assert tree.stdout is not None and tree.stdout.readline().strip() == b"ready"
            args = _args(devdir, token)
            rows = [dict(measure(args, a.reps, a.profile, a.steps), label="this machine")]
            for n in a.extra:
                with Bystanders(n):
                    rows.append(dict(measure(args, a.reps, a.profile, a.steps), label=f"+{n} processes"))
        finally:
            os.killpg(tree.pid, 9)
            tree.wait()
    for r in rows:
        parts = "  ".join(f"{k} {r[k] * 1000:.1f}" for k in PIECES)
        print(f"{r['label']:>18}: {r['processes']} processes, {r['targets']} targets ({r['early_targets']} early), "
              f"{r['workers']}/{r['cores']} "
              f"workers/cores; ms: {parts}", flush=True)
        steps = "  ".join(f"{k[5:]} {r[k] * 1000:.1f}" for k in r if k.startswith("step_"))
        if steps:
            print(f"{'':>18}  steps, ms: {steps}", flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
