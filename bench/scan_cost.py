"""Scan cost: one agent scan (every process's stat/cmdline, every fd readlink) over all
processes on this machine, and optionally with N extra idle processes started for it.

  python3 bench/scan_cost.py [--extra 100 1000 5000] [--reps 7] [--out FILE.json]
Reports the median and min-max of the agent's own `scan_ms` for each process count.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from scripts.agent import scan  # noqa: E402


def measure(reps):
    ns = argparse.Namespace(devices="/dev/nvidia*", protect=[], target=[], match=[], fake_gpus=None)
    times, count = [], 0
    for _ in range(reps):
        doc = scan.collect(ns)
        times.append(doc["scan_ms"])
        count = doc["processes_scanned"]
    return {"processes": count, "median_ms": statistics.median(times), "min_ms": min(times), "max_ms": max(times),
            "reps": reps, "gpu_source": doc["gpu_source"]}


def with_extra(n, reps):
    procs = [subprocess.Popen(["sleep", "600"], stdin=subprocess.DEVNULL) for _ in range(n)]
    time.sleep(0.2)
    try:
        return measure(reps)
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--extra", type=int, nargs="*", default=[])
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--out")
    args = p.parse_args()
    rows = [dict(measure(args.reps), label="this machine")]
    for n in args.extra:
        rows.append(dict(with_extra(n, args.reps), label=f"+{n} processes"))
    for r in rows:
        print(f"{r['label']:>16}: {r['processes']:5d} processes  median {r['median_ms']:.1f} ms "
              f"(min {r['min_ms']:.1f}, max {r['max_ms']:.1f}; GPU source {r['gpu_source']})")
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
