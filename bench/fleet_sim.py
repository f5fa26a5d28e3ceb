"""A fleet of N simulated hosts: the local side of `invoke status` alone, at 128 hosts and more.

Why: a loopback fleet puts every host's agent and sshd on this machine's CPUs (bench/RESULTS.md
section 4), so it cannot say what the operator's side costs at 128 hosts. Here each host is an
alias with no ssh whose interpreter (`ALIAS_PYTHON`) is a stand-in: it reads the agent stream
to its end, waits --host-s (the host's own work: its agent's start and scan), and prints a real
scan result (taken once from the sandbox) framed with the call's nonce. What is measured is
gpu-pivot's own fan-out: the threads, the runner, reading and rendering each result, and the
waves the fanout makes (`status` at its default, config/defaults.py READ_FANOUT); the local CPU
is the whole command's (RUSAGE_CHILDREN: invoke and the stand-ins, whose own start is a
Python interpreter each, counted apart as `stand-in CPU`). No ssh: a real host adds its ssh
client's CPU (section 7e measures that).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PLACEHOLDER = "f" * 16

STAND_IN = """#!{python} -S
import os, sys, time
sys.stdin.buffer.read()
nonce = sys.argv[sys.argv.index("--marker") + 1]
time.sleep(float(os.environ.get("SIM_HOST_S", "0.3")))
with open({doc!r}) as f:
    sys.stdout.write(f.read().replace({placeholder!r}, nonce))
"""


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def sandbox_scan(work: Path, env: dict, cli_python: str) -> str:
    """A real scan result of the sandbox, framed with PLACEHOLDER as the nonce."""
    invoke = [cli_python, "-m", "invoke"]
    subprocess.run(invoke + ["sandbox", "up"], cwd=REPO, env=env, capture_output=True, check=True)
    probe = ("import json, sys; sys.path.insert(0, '.')\n"
             "from scripts.cli.common import hosts_of\nfrom scripts.reach.transport import call_agent\n"
             "from scripts.agent.wire.requests import Scan\n"
             "print(json.dumps(call_agent(hosts_of('sandbox')[0], Scan()).doc))")
    try:
        out = subprocess.run([cli_python, "-c", probe], cwd=REPO, env=env, capture_output=True, text=True, check=True)
    finally:
        subprocess.run(invoke + ["sandbox", "down"], cwd=REPO, env=env, capture_output=True)
    doc = json.loads(out.stdout)
    sys.path.insert(0, str(REPO))
    from scripts.agent.wire import frame

    return frame.frame(PLACEHOLDER, json.dumps(doc, sort_keys=True))


def run(sizes: list, reps: int, host_s: float, cli_python: str) -> dict:
    work = Path(tempfile.mkdtemp(prefix="gpu-pivot-fleet-sim-"))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    for key, sub in (("GPU_PIVOT_RUN_DIR", "run"), ("XDG_STATE_HOME", "xdg"), ("GPU_PIVOT_SANDBOX_DIR", "sandbox"),
                     ("GPU_PIVOT_CONTROL_DIR", "cm")):
        env[key] = str(work / sub)
    try:
        (work / "doc.txt").write_text(sandbox_scan(work, env, cli_python))
        stand_in = work / "agent-stand-in"
        stand_in.write_text(STAND_IN.format(python=sys.executable,  # not a PATH shim: its start is no host cost
                                            doc=str(work / "doc.txt"), placeholder=PLACEHOLDER))
        stand_in.chmod(0o755)
        hosts = work / "hosts.env"
        hosts.write_text("".join(f"NODE{i:03d}_PYTHON={stand_in}\n" for i in range(1, max(sizes) + 1)))
        run_env = dict(env, GPU_PIVOT_HOSTS_FILE=str(hosts), SIM_HOST_S=str(host_s))
        idle = []  # a stand-in's own CPU: one started alone, as the fleet starts each
        for _ in range(reps):
            c0 = cpu_seconds()
            subprocess.run([str(stand_in), "--marker", "0"], input=b"", env=dict(run_env, SIM_HOST_S="0"),
                           capture_output=True)
            idle.append(cpu_seconds() - c0)
        rows = []
        for size in sizes:
            spec = f"node[001-{size:03d}]" if size > 1 else "node001"
            walls, cpus, codes = [], [], set()
            for _ in range(reps):
                c0, t0 = cpu_seconds(), time.perf_counter()
                res = subprocess.run([cli_python, "-m", "invoke", "status", "--host", spec, "--brief"], cwd=REPO,
                                     env=run_env, capture_output=True, text=True)
                walls.append(time.perf_counter() - t0)
                cpus.append(cpu_seconds() - c0)
                codes.add(res.returncode)
                if res.returncode not in (0,):
                    print(res.stdout[-300:], res.stderr[-300:], file=sys.stderr)
            rows.append({"hosts": size, "walls": walls, "cpu_s": cpus, "codes": sorted(codes)})
        return {"rows": rows, "stand_in_cpu_s": statistics.median(idle), "host_s": host_s, "reps": reps,
                "cpus": os.cpu_count()}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def report(r: dict, command: str) -> str:
    base = statistics.median(r["rows"][0]["walls"])
    own = r["stand_in_cpu_s"]
    lines = [f"`{command}` ({r['cpus']} CPUs): `invoke status` of N simulated hosts (each waits {r['host_s']} s "
             "as its host's work), median (min-max) of "
             f"{r['reps']}; local CPU per host = (the command's CPU - N x a stand-in's own, {own:.3f} s) / N.", "",
             "| hosts | wall s | vs 1 host | local CPU s per host, stand-ins' own out | exit codes |",
             "|---|---|---|---|---|"]
    for row in r["rows"]:
        w, n = row["walls"], row["hosts"]
        cpu = (statistics.median(row["cpu_s"]) - n * own) / n
        lines.append(f"| {n} | {statistics.median(w):.3f} ({min(w):.3f}-{max(w):.3f}) | "
                     f"{statistics.median(w) / base:.2f}x | {cpu:.4f} | {row['codes']} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[1, 32, 128])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--host-s", type=float, default=0.3)
    p.add_argument("--cli-python", default=sys.executable)
    p.add_argument("--json")
    args = p.parse_args()
    r = run(sorted(args.sizes), args.reps, args.host_s, args.cli_python)
    print(report(r, "python3 bench/fleet_sim.py " + " ".join(sys.argv[1:])))
    if args.json:
        Path(args.json).write_text(json.dumps(r, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
