"""GPU benchmark: what the CUDA probe adds to a pivot, beside the teardown, in one run.

Run on the GPU machine:
  python3 bench/gpu_probe.py --reps 5 --children 3 --gib-per-proc 20 --out FILE.json
Each rep starts a real torch tree (tests/support/gpu_tree.py), frees it with `invoke teardown
--host local --yes` (bench/gpu_teardown.py's own measurement), then runs what a pivot's probe
step runs, `invoke verify --host local --probe --json`, timed from Enter to exit. Printed side
by side: the teardown's medians (CLI exit, agent wall), the probe step's (CLI exit, the
probe's own seconds, cuInit, the slowest GPU) and probe/teardown ratios. Reads and probes
only: no GPU setting is changed, nothing is reset.
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
sys.path.insert(0, str(REPO / "bench"))

from gpu_teardown import _teardown_once  # noqa: E402

from tests.support.gpu_support import GpuTree, add_tree_arguments, gpu_count  # noqa: E402


def probe_once(args, env):
    t0 = time.monotonic()
    done = subprocess.run([args.cli_python, "-m", "invoke", "verify", "--host", "local", "--probe", "--json"],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    wall = time.monotonic() - t0
    doc = json.loads(done.stdout).get("local", {})
    p = doc.get("probe") or {}
    per = [g.get("probe") or {} for g in doc.get("gpus") or []]
    return {"exit": done.returncode, "cli_exit_s": wall, "probe_s": p.get("seconds"), "init_s": p.get("init_s"),
            "released_s": p.get("released_s"), "slowest_gpu_s": max((r.get("seconds") or 0 for r in per), default=None),
            "states": [r.get("state") for r in per]}


def median(rows, key):
    values = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(values) if values else None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_tree_arguments(parser)
    parser.add_argument("--cli-python", default=str(REPO / ".venv" / "bin" / "python"))
    args = parser.parse_args()
    if gpu_count() == 0:
        sys.exit("no NVIDIA GPU visible through NVML: run this on the GPU machine")
    workdir = Path(tempfile.mkdtemp(prefix="gp-bench-probe-"))
    teardowns, probes = [], []
    for rep in range(args.reps):
        token = f"gpupivot-probe-bench-{os.getpid()}-{rep}"
        tree = GpuTree(workdir, token, args.children, args.gib_per_proc)
        t = _teardown_once(workdir, token, tree, args, dict(os.environ))
        teardowns.append(t)
        env = dict(os.environ, GPU_PIVOT_HOSTS_FILE=str(workdir / "hosts.env"))
        probes.append(probe_once(args, env))
        print(f"rep {rep}: teardown exit {t['exit']} {t['cli_exit_s']:.3f}s; probe exit {probes[-1]['exit']} "
              f"{probes[-1]['cli_exit_s']:.3f}s (probe {probes[-1]['probe_s']}s)", flush=True)
    med = {"teardown_cli_exit_s": median(teardowns, "cli_exit_s"), "teardown_agent_wall_s": median(teardowns,
                                                                                                     "agent_wall_s"),
           "probe_cli_exit_s": median(probes, "cli_exit_s"), "probe_s": median(probes, "probe_s"),
           "probe_init_s": median(probes, "init_s"), "probe_slowest_gpu_s": median(probes, "slowest_gpu_s")}
    ratios = {"probe_step_over_teardown": (med["probe_cli_exit_s"] / med["teardown_cli_exit_s"])
              if med["probe_cli_exit_s"] and med["teardown_cli_exit_s"] else None,
              "probe_over_teardown_agent": (med["probe_s"] / med["teardown_agent_wall_s"])
              if med["probe_s"] and med["teardown_agent_wall_s"] else None}
    print(json.dumps({"medians": med, "ratios": ratios}, indent=1))
    Path(args.out).write_text(json.dumps({"gpus": gpu_count(), "reps": args.reps, "medians": med, "ratios": ratios,
                                          "teardowns": teardowns, "probes": probes}, indent=1, default=str))


if __name__ == "__main__":
    main()
