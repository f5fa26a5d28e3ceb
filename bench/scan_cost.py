"""Scan cost: the agent's holder scan beside `fuser` over the same device files, alternating,
in one run: on this machine as it is, and with N extra idle processes started for it.

  python3 bench/scan_cost.py [--extra 1000 5000 20000] [--reps 5] [--devices GLOB] [--out FILE.json]
For each row: the agent's holder scan (`proc_scan_ms`: every process's stat and command line,
its fd table by identity, its maps; one worker per core on a big host, agent/procs/fanout.py), the
whole `scan.collect` (plus the GPU source's read and the records of the holders), and `fuser`
run on the files the glob names (a fresh fuser each rep, as an operator's one-liner runs it),
each the median of the reps, with the cores the scan could use. Why beside fuser: fuser is
what the incidents used to find holders, and the scan must not be the slower way to do it.
Beside them, the records-only scan that confirms FREED where NVML vouches (`confirm_all_ms`:
every record read whole) and the same given the plan's records (`confirm_known_ms`: a process
still the same costs one stat read, procscan.snapshot's `known`), alternating in each rep.
"""
from __future__ import annotations

import argparse
import glob
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from scripts.agent.holders import scan  # noqa: E402
from scripts.agent.options.record import Options  # noqa: E402
from scripts.agent.procs import fanout, procscan  # noqa: E402
from tests.support.procs import Bystanders  # noqa: E402


def _median(values):
    return statistics.median(values) if values else None


def measure(reps, devices, fake=False):
    ns = Options(devices=devices, protect=[], target=[], match=[], fake_gpus=None, fake_devices=fake)
    paths = sorted(glob.glob(devices))
    holder, whole, fuser, count, source = [], [], [], 0, None
    confirm_all: list = []
    confirm_known: list = []
    for _ in range(reps):
        if paths:
            t0 = time.monotonic()
            subprocess.run(["fuser", *paths], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            fuser.append((time.monotonic() - t0) * 1000)
        doc = scan.collect(ns.selection)
        holder.append(doc["proc_scan_ms"])
        whole.append(doc["scan_ms"])
        count, source = doc["processes_scanned"], doc["gpu_source"]
        for known, into in ((None, confirm_all), (doc.procs, confirm_known)):
            t0 = time.monotonic()
            procscan.snapshot(ns.device_set(), fds=False, known=known)
            into.append((time.monotonic() - t0) * 1000)
    row = {"processes": count, "median_ms": _median(whole), "min_ms": min(whole), "max_ms": max(whole),
           "holder_scan_ms": _median(holder), "fuser_ms": _median(fuser), "reps": reps, "gpu_source": source,
           "cores": fanout.cores(), "workers": fanout.workers_for(count), "device_files": len(paths),
           "confirm_all_ms": _median(confirm_all), "confirm_known_ms": _median(confirm_known)}
    row["confirm_known_vs_all"] = row["confirm_known_ms"] / row["confirm_all_ms"]
    row["scan_vs_fuser"] = row["fuser_ms"] and row["holder_scan_ms"] / row["fuser_ms"]
    return row


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--extra", type=int, nargs="*", default=[])
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--devices", default="/dev/nvidia*", help="the device files both look for (default /dev/nvidia*)")
    p.add_argument("--fake-devices", action="store_true", help="the glob names plain files (a machine with no GPU)")
    p.add_argument("--out")
    args = p.parse_args()
    rows = [dict(measure(args.reps, args.devices, args.fake_devices), label="this machine")]
    for n in args.extra:
        with Bystanders(n):
            rows.append(dict(measure(args.reps, args.devices, args.fake_devices), label=f"+{n} processes"))
    for r in rows:
        fuser = f"fuser {r['fuser_ms']:.1f} ms, scan/fuser {r['scan_vs_fuser']:.2f}x" if r["fuser_ms"] else "no fuser"
        print(f"{r['label']:>18}: {r['processes']:6d} processes  holder scan {r['holder_scan_ms']:.1f} ms, "
              f"{fuser}, whole scan {r['median_ms']:.1f} ms ({r['workers']} worker(s) of {r['cores']} cores; "
              f"GPU source {r['gpu_source']}); confirming scan {r['confirm_all_ms']:.1f} ms, given the plan's "
              f"records {r['confirm_known_ms']:.1f} ms ({r['confirm_known_vs_all']:.2f}x)", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
