"""How late the CLI learns that a command (ssh, or the local agent) has exited: Popen.wait with
a deadline (what the runner did: it polls, its sleeps doubling to 50 ms) beside
scripts/reach/runner.wait_exit (a pidfd, polled: woken by the exit itself), alternating, in one run.

  python3 bench/exit_wait.py [--reps 15] [--runs-for 0.3 1.0 2.0]
Each rep starts `python3 -S -c` that sleeps the given seconds, prints CLOCK_MONOTONIC (one clock
for every process of the machine) and leaves at once (os._exit); the lateness is the wait's
return minus that time. Medians in ms, and their ratio.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from scripts.reach import runner  # noqa: E402


def late_ms(runs_for: float, wait) -> float:
    code = f"import os, time; time.sleep({runs_for}); print(time.monotonic(), flush=True); os._exit(0)"
    proc = subprocess.Popen([sys.executable, "-S", "-c", code], stdout=subprocess.PIPE)
    wait(proc)
    returned = time.monotonic()
    assert proc.stdout is not None
    exited = float(proc.stdout.read())
    return (returned - exited) * 1000


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--runs-for", type=float, nargs="*", default=[0.3, 1.0, 2.0])
    args = p.parse_args()
    ways = {"Popen.wait(timeout)": lambda proc: proc.wait(timeout=60),
            "runner.wait_exit (pidfd)": lambda proc: runner.wait_exit(proc, 60)}
    print(f"{'command runs for':>17}  " + "  ".join(f"{w:>26}" for w in ways) + "  ratio")
    for runs_for in args.runs_for:
        got: dict = {w: [] for w in ways}
        for _ in range(args.reps):
            for w, wait in ways.items():  # alternating: the machine's swings fall on both
                got[w].append(late_ms(runs_for, wait))
        med = {w: statistics.median(v) for w, v in got.items()}
        old, new = med.values()
        print(f"{runs_for:>15.1f} s  " + "  ".join(f"{m:>23.2f} ms" for m in med.values())
              + f"  {new / old:.2f}x", flush=True)


if __name__ == "__main__":
    main()
