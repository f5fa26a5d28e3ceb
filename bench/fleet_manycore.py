"""Section 4 of bench/run.py (the fleet) on a many-core machine, with the local side's CPU time.

Why: on the 2-CPU CI box, 32 loopback hosts in parallel measure the box (32 agents, 32 sshd
sessions and the ssh clients fight for 2 CPUs), not gpu-pivot. On the GPU machine (16+ CPUs)
the same run shows what parallel fan-out costs. The local side's CPU per host is what a
real fleet would still share on the operator's machine: `invoke` itself, its ssh clients and
the ssh ControlMaster processes they leave (the agents run on the hosts).

How CPU is counted: this process becomes a child subreaper (prctl), so the ssh masters that
outlive `invoke` are reparented here; after each run they are ended and reaped, and the
run's CPU is the growth of RUSAGE_CHILDREN (user + system) across it. Every run therefore
opens its connections cold. Zombies of earlier runs are reaped before a run starts, so their
CPU is not counted in it.

Writes OUT/fleet-manycore.json and OUT/fleet-manycore.md (a block for bench/RESULTS.md).
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.run import FLEET_MODES, fleet, med, span  # noqa: E402
from scripts.config.defaults import READ_FANOUT  # noqa: E402
from scripts.views.render import table  # noqa: E402

PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


def _children() -> list:
    out = []
    for tid in os.listdir("/proc/self/task"):
        try:
            out += [int(p) for p in Path(f"/proc/self/task/{tid}/children").read_text().split()]
        except OSError:
            continue
    return out


def _stat(pid: int) -> tuple:
    """(state, start time in clock ticks) of a process, or (None, None)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None, None
    return fields[0], int(fields[19])


def _ticks_now() -> int:
    return int(float(Path("/proc/uptime").read_text().split()[0]) * os.sysconf("SC_CLK_TCK"))


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


def reap_zombies() -> None:
    for pid in _children():
        if _stat(pid)[0] == "Z":
            _reap(pid)


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def busy_seconds() -> float:
    """CPU seconds the whole machine has been busy (every core: /proc/stat less idle and iowait)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


# The machine's busy CPU seconds of each run, by (task, --host): the loopback hosts' sshd and
# agents run here too, so this is all the run's work, theirs and the operator's side's.
BOX: dict = {}


def counted_run(argv: list, env: dict) -> tuple:
    """bench.run.fleet's runner: (completed process, wall s, local CPU s of the whole run)."""
    reap_zombies()
    since = _ticks_now()
    c0 = cpu_seconds()
    b0 = busy_seconds()
    t0 = time.monotonic()
    res = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.monotonic() - t0
    task = "status" if "status" in argv else "teardown"
    BOX.setdefault((task, argv[argv.index("--host") + 1]), []).append(busy_seconds() - b0)
    # what invoke left running and we inherited: its ssh ControlMaster processes
    left = [p for p in _children() if (_stat(p)[1] or 0) >= since]
    for pid in left:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    for pid in left:
        _reap(pid)
    return res, wall, cpu_seconds() - c0


def with_box(rows: list) -> list:
    """Each row with the machine's busy CPU of its runs (status_box_s, box_s), from BOX."""
    for r in rows:
        spec = f"node[01-{r['hosts']:02d}]" if r["hosts"] > 1 else "node01"
        r["status_box_s"], r["box_s"] = BOX.pop(("status", spec), []), BOX.pop(("teardown", spec), [])
    return rows


def status_report(rows: list, reps: int, fanout: str, ssh_opts: str = "") -> str:
    """`invoke status` and `invoke teardown` of the same hosts (--status): wall, vs 1 host, the
    local side's CPU per host, and the box's floor, side by side. The floor: one host's wall
    plus the rest of the run's work (the machine's busy CPU over one host's) spread over every
    core; no scheduling of this machine's work does better, so wall / floor is gpu-pivot's."""
    cpus = os.cpu_count() or 1

    def ratio(r, key):
        base = med(rows[0][key])
        return f"{med(r[key]) / base:.2f}x" if r[key] and base else "-"

    def floor(r, walls, box):
        if not (r[walls] and r[box] and rows[0][walls] and rows[0][box]):
            return "-"
        least = med(rows[0][walls]) + max(0.0, med(r[box]) - med(rows[0][box])) / cpus
        return f"{med(r[box]):.1f} / {least / med(rows[0][walls]):.2f}x / {med(r[walls]) / least:.2f}x"

    body = table(["hosts", "status wall s", "vs 1 host", "local CPU s/host", "box CPU s / floor / wall vs floor",
                  f"teardown wall s (--fanout {fanout})", "vs 1 host", "local CPU s/host",
                  "box CPU s / floor / wall vs floor", "failed"],
                 [[r["hosts"],
                   f"{med(r['status_walls']):.2f} ({span(r['status_walls'])})" if r["status_walls"] else "-",
                   ratio(r, "status_walls"),
                   f"{med(r['status_cpu_s']) / r['hosts']:.3f}" if r["status_cpu_s"] else "-",
                   floor(r, "status_walls", "status_box_s"),
                   f"{med(r['walls']):.2f} ({span(r['walls'])})" if r["walls"] else "-", ratio(r, "walls"),
                   f"{med(r['cpu_s']) / r['hosts']:.3f}" if r["cpu_s"] else "-", floor(r, "walls", "box_s"),
                   len(r["failed"])] for r in rows])
    opts = f" --ssh-opts '{ssh_opts}'" if ssh_opts else ""
    return (f"`python3 bench/fleet_manycore.py --status --fanout {fanout}{opts} --sizes "
            f"{' '.join(str(r['hosts']) for r in rows)} --reps {reps}` on {platform.node()} ({os.cpu_count()} CPUs): "
            "one loopback sshd and its own process set (a server + 2 workers, an `nvidia-persistenced`) per "
            "host; each run opens its ssh connections cold; `status` reads every host at once (its default "
            f"--fanout, config/defaults.py READ_FANOUT = {READ_FANOUT}), the teardown at the --fanout given. "
            "Local CPU: `invoke`, its ssh clients and the ControlMasters they leave.\n\n"
            + body + "\n")


def report(rows: list, reps: int) -> str:
    base = med(next(r["walls"] for r in rows if r["hosts"] == 1))
    big = max(r["hosts"] for r in rows)
    par = med(next(r["walls"] for r in rows if r["hosts"] == big and r["mode"] == "parallel"))
    seq = [r for r in rows if r["hosts"] == big and r["mode"] != "parallel"]
    body = table(["hosts", "mode", "wall s (median)", "min-max", "vs 1 host", "local CPU s per host (median)"],
                 [[r["hosts"], r["mode"], f"{med(r['walls']):.2f}", span(r["walls"]), f"{med(r['walls']) / base:.2f}x",
                   f"{med(r['cpu_s']) / r['hosts']:.3f}"] for r in rows])
    cpus = os.cpu_count()
    lines = [f"## 4b. Fleet on {cpus} CPUs (the GPU machine)", "",
             f"`bash bench/fleet_manycore.sh` on {platform.node() or 'the GPU machine'} ({cpus} CPUs, "
             f"{platform.platform()}; Python {platform.python_version()}; openssh from `.debs/`, extracted, not "
             f"installed). Same run as section 4 (a server + 2 workers and an `nvidia-persistenced` per host, "
             f"`--fanout 16` vs `--fanout 1`, `--grace 5`), {reps} runs per row, each opening its ssh connections "
             "cold. Local CPU: `invoke`, its ssh clients and the ssh ControlMaster processes they leave "
             "(user + system, from RUSAGE_CHILDREN; the agents and sshd are the hosts' side).", "", body, "",
             f"Ratio: {big} hosts in parallel / 1 host = **{par / base:.2f}x**"
             + (f"; {big} hosts one after another / parallel = **{med(seq[0]['walls']) / par:.1f}x**." if seq else "."),
             ""]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--out", default=os.environ.get("OUT", "/tmp/fleet-out"))
    p.add_argument("--status", action="store_true",
                   help="also time `invoke status` of the same hosts; parallel only (no --fanout 1 rows)")
    p.add_argument("--fanout", default="16", help="the teardown's --fanout in the parallel rows")
    p.add_argument("--ssh-opts", nargs="*", default=[""],
                   help="each a variant run in turn, added to every host's ssh options (e.g. '' "
                        "'-o KexAlgorithms=curve25519-sha256': the key exchange's cost side by side)")
    args = p.parse_args()
    if 1 not in args.sizes:
        p.error("--sizes must include 1 (the baseline of the ratios)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    become_subreaper()
    work = Path(tempfile.mkdtemp(prefix="gpu-pivot-fleet-"))
    variants = {}
    try:
        modes = (("parallel", args.fanout),) if args.status else (("parallel", args.fanout),) + FLEET_MODES[1:]
        for i, opts in enumerate(args.ssh_opts):
            (work / f"v{i}").mkdir()
            rows = fleet(work / f"v{i}", sorted(args.sizes), args.reps, runner=counted_run, modes=modes,
                         status=args.status, ssh_opts=opts)
            variants[opts] = with_box(rows)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    (out / "fleet-manycore.json").write_text(json.dumps({"cpus": os.cpu_count(), "reps": args.reps,
                                                         "rows": variants.get("", next(iter(variants.values()))),
                                                         "variants": variants}, indent=1))
    text = "\n".join(status_report(rows, args.reps, args.fanout, opts) if args.status else report(rows, args.reps)
                     for opts, rows in variants.items())
    (out / "fleet-manycore.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
