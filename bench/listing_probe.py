"""Does listing /proc scale over cores? (issue 26: the listing is most of the first SIGTERM's
wait and of the confirming scan on a host of 20,000 processes.)

  python3 bench/listing_probe.py [--extra 20000] [--reps 7] [--out FILE.json]

/proc's root can be read from any pid on: seek the directory to TGID_OFFSET + pid (the
kernel's proc_pid_readdir starts at the first thread group id at or above it). So W workers
could each list a range of pids at once. This times, with the host's processes plus --extra
idle `sleep`s: the listing as the agent does it now (os.scandir, one core), and W pre-forked
workers (W = 1, 2, 4, ... cores) each listing its own pid range through getdents64, the ranges
cut at the quantiles of a listing made just before (the best split there can be): from the
go on a pipe to every worker's done. Medians of the reps, milliseconds.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import struct
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.support.procs import Bystanders  # noqa: E402

TGID_OFFSET = 258  # fs/proc/base.c: FIRST_PROCESS_ENTRY (256) + "self" + "thread-self"
GETDENTS64 = {"x86_64": 217, "aarch64": 61}
_libc = ctypes.CDLL(None, use_errno=True)


def list_range(lo, hi, size=32768):
    """Pids in [lo, hi) as /proc lists them, from a seek to lo."""
    nr = GETDENTS64[os.uname().machine]
    fd = os.open("/proc", os.O_RDONLY | os.O_DIRECTORY)
    buf = ctypes.create_string_buffer(size)
    out = []
    try:
        os.lseek(fd, TGID_OFFSET + lo, os.SEEK_SET)
        while True:
            n = _libc.syscall(nr, fd, buf, size)
            if n <= 0:
                return out
            data, at = buf.raw[:n], 0
            while at < n:
                reclen = struct.unpack_from("<H", data, at + 16)[0]
                name = data[at + 19:data.index(b"\0", at + 19)]
                at += reclen
                if name.isdigit():
                    pid = int(name)
                    if pid >= hi:
                        return out
                    out.append(pid)
    finally:
        os.close(fd)


def scandir_ms():
    t = time.perf_counter()
    with os.scandir("/proc") as entries:
        pids = [int(e.name) for e in entries if e.name.isdigit()]
    return (time.perf_counter() - t) * 1000, len(pids)


def parallel_ms(bounds):
    """Pre-forked workers, one per range; ms from the go to the last done, and the slowest
    worker's own listing time."""
    workers = []
    for lo, hi in bounds:
        go_r, go_w = os.pipe()
        done_r, done_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(go_w)
            os.close(done_r)
            os.read(go_r, 1)
            t = time.perf_counter()
            n = len(list_range(lo, hi))
            os.write(done_w, struct.pack("<dI", time.perf_counter() - t, n))
            os._exit(0)
        os.close(go_r)
        os.close(done_w)
        workers.append((pid, go_w, done_r))
    time.sleep(0.05)
    t = time.perf_counter()
    for _, go_w, _ in workers:
        os.write(go_w, b"x")
    own, count = [], 0
    for _, _, done_r in workers:
        took, n = struct.unpack("<dI", os.read(done_r, 12))
        own.append(took)
        count += n
    wall = (time.perf_counter() - t) * 1000
    for pid, go_w, done_r in workers:
        os.close(go_w)
        os.close(done_r)
        os.waitpid(pid, 0)
    return wall, max(own) * 1000, count


def measure(reps):
    cores = len(os.sched_getaffinity(0))
    widths = [w for w in (1, 2, 4, 8, 16, 32, 64) if w <= cores]
    row: dict = {"cores": cores}
    runs: dict = {}
    for _ in range(reps):
        ms, n = scandir_ms()
        runs.setdefault("scandir", []).append(ms)
        row["processes"] = n
        pids = sorted(list_range(0, 1 << 30))
        for w in widths:
            cuts = [0] + [pids[len(pids) * k // w] for k in range(1, w)] + [1 << 30]
            wall, slowest, count = parallel_ms([(cuts[i], cuts[i + 1]) for i in range(w)])
            runs.setdefault("w%d" % w, []).append(wall)
            runs.setdefault("w%d_slowest_own" % w, []).append(slowest)
            row["w%d_listed" % w] = count
    row.update({k: round(statistics.median(v), 2) for k, v in runs.items()})
    return row


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--extra", type=int, nargs="*", default=[20000])
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--out")
    a = p.parse_args()
    rows = [dict(measure(a.reps), label="this machine")]
    for n in a.extra:
        with Bystanders(n):
            rows.append(dict(measure(a.reps), label="+%d processes" % n))
    for r in rows:
        cols = "  ".join("%s %s" % (k, r[k]) for k in r if k.startswith(("scandir", "w")) and "listed" not in k)
        print("%18s: %d processes, %d cores; ms: %s" % (r["label"], r["processes"], r["cores"], cols), flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
