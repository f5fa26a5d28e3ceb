"""The holder scan with open().read() against os.read (procfs.read_bytes), alternately.

Why: a scan reads three or more small /proc files per process before the first signal and
again to confirm FREED; the buffered file object was ~3 us of each ~5 us read. This puts
the whole procscan.snapshot() of this machine (plus --extra sleeping processes and one
holder of a fake device file) side by side, median of --reps each.
Usage: python3 bench/scan_reads.py [--extra 150] [--reps 40]
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))

from agent.procs import devices, procfs, procscan  # noqa: E402


def buffered_read(path, mode="rb"):
    with open(path, mode) as f:
        return f.read()


def buffered_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--extra", type=int, default=150)
    p.add_argument("--reps", type=int, default=40)
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gp-scan-reads-"))
    (work / "nvidia0").touch()
    kids = [subprocess.Popen(["sleep", "600"]) for _ in range(args.extra)]
    kids.append(subprocess.Popen([sys.executable, "-c", "import sys, time; f = open(sys.argv[1]); time.sleep(600)",
                                  str(work / "nvidia0")]))
    time.sleep(0.5)
    ways = {"open().read()": (buffered_read, buffered_bytes), "os.read": (procscan._read, procfs.read_bytes)}
    times: dict = {name: [] for name in ways}
    try:
        devset = devices.DeviceSet(str(work / "nvidia[0-9]*"), fake=True)
        for _ in range(args.reps):
            for name, (read, read_bytes) in ways.items():
                procscan._read, procfs.read_bytes = read, read_bytes
                t0 = time.perf_counter()
                snap = procscan.snapshot(devset)
                times[name].append(time.perf_counter() - t0)
    finally:
        for kid in kids:
            kid.kill()
            kid.wait()
    old, new = (statistics.median(times[n]) * 1e3 for n in ways)
    print(f"{len(snap['procs'])} processes, median of {args.reps}: open().read() {old:.2f} ms, "
          f"os.read {new:.2f} ms, ratio {new / old:.3f}")


if __name__ == "__main__":
    main()
