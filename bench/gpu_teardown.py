"""GPU benchmark: gpu-pivot teardown wall time vs the physical floor, side by side.

Run on the GPU machine: python3 bench/gpu_teardown.py --reps 5 --children 3 --gib-per-proc 20 --out FILE.json
Each rep starts a real torch tree (parent + CHILDREN spawned children, each holding GIB on
every GPU, so (CHILDREN+1)*GIB per GPU) and frees it two ways, alternating:
  floor:     SIGKILL the whole tree at once, poll NVML v2 every 2 ms until every GPU reads 0 MiB used
  gpu-pivot: `invoke teardown --host local --yes` (whole CLI, wall clock), and the agent's own wall_s
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

from tests.gpu_support import GpuTree, gpu_count, nvml_used_mib  # noqa: E402


def floor_once(workdir, args, n):
    tree = GpuTree(workdir, f"bench-floor-{n}", args.children, args.gib_per_proc)
    import pynvml
    pynvml.nvmlInit()
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    t0 = time.monotonic()
    for pid in tree.starts:
        os.kill(pid, 9)
    while any(pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2).used for h in handles):
        if time.monotonic() - t0 > 60:  # memory held by something else: say so instead of waiting forever
            tree.kill()
            raise SystemExit("floor: GPU memory still used 60 s after SIGKILL of the tree; "
                             "is another process on the GPU?")
        time.sleep(0.002)
    t = time.monotonic() - t0
    pynvml.nvmlShutdown()
    tree.kill()
    return t


def pivot_once(workdir, args, n, env):
    token = f"bench-pivot-{n}-{os.getpid()}"
    tree = GpuTree(workdir, token, args.children, args.gib_per_proc)
    env = dict(env, GPU_PIVOT_HOSTS_FILE=str(Path(workdir) / "hosts.env"))
    Path(env["GPU_PIVOT_HOSTS_FILE"]).write_text(
        f"LOCAL_PYTHON={sys.executable}\nLOCAL_TARGETS='gpu_tree\\.py'\nLOCAL_SCOPE={token}\n")
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "invoke", "teardown", "--host", "local", "--yes", "--json"], cwd=REPO,
                         capture_output=True, text=True, env=env)
    wall = time.monotonic() - t0
    doc = json.loads(out.stdout)["local"]
    left = tree.alive()
    tree.kill()
    return {"cli_wall_s": wall, "agent_wall_s": doc["wall_s"], "exit": out.returncode, "freed_mib": doc["freed_mib"],
            "after_used": nvml_used_mib() if not left else None, "left": left}


def summary(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--children", type=int, default=3)
    p.add_argument("--gib-per-proc", type=float, default=20)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    env = dict(os.environ, XDG_STATE_HOME=tempfile.mkdtemp(), GPU_PIVOT_RUN_DIR=tempfile.mkdtemp())
    floors, pivots = [], []
    with tempfile.TemporaryDirectory() as work:
        for n in range(args.reps):
            floors.append(floor_once(work, args, n))
            pivots.append(pivot_once(work, args, n, env))
            print(f"rep {n}: floor {floors[-1]:.3f}s  gpu-pivot agent {pivots[-1]['agent_wall_s']:.3f}s "
                  f"cli {pivots[-1]['cli_wall_s']:.3f}s exit {pivots[-1]['exit']}", flush=True)
    result = {
        "gpus": gpu_count(), "children": args.children, "gib_per_proc": args.gib_per_proc,
        "gib_per_gpu": (args.children + 1) * args.gib_per_proc,
        "floor_s": summary(floors),
        "gpu_pivot_agent_s": summary([r["agent_wall_s"] for r in pivots]),
        "gpu_pivot_cli_s": summary([r["cli_wall_s"] for r in pivots]),
        "all_exit_0": all(r["exit"] == 0 for r in pivots),
        "all_freed_to_0": all(r["after_used"] == [0] * gpu_count() for r in pivots),
        "reps": pivots, "floor_reps": floors,
    }
    result["ratio_agent_vs_floor"] = result["gpu_pivot_agent_s"]["median"] / result["floor_s"]["median"]
    result["ratio_cli_vs_floor"] = result["gpu_pivot_cli_s"]["median"] / result["floor_s"]["median"]
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k not in ("reps", "floor_reps")}, indent=1))


if __name__ == "__main__":
    main()
