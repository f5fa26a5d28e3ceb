"""Where the whole CLI's time goes before the agent starts (issue 15's "Enter to FREED").

Runs, with the operator's CLI interpreter (`--cli-python`, a venv as `make setup` makes), the
interpreter alone, `import invoke`, and `invoke plan --host local` with subprocess.Popen hooked
to note when the agent is spawned, measured from the CLI process's own start. Medians of --reps.
Usage: python3 bench/cli_probe.py --cli-python .venv/bin/python [--against-python OTHER/bin/python] [--reps 7]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HOOK = """
import os, subprocess, sys, time
t0 = float(os.environ["GP_PROBE_T0"])
orig = subprocess.Popen.__init__
def hook(self, *a, **k):
    sys.stderr.write("AGENT_SPAWN %.4f\\n" % (time.time() - t0)); sys.stderr.flush()
    subprocess.Popen.__init__ = orig
    return orig(self, *a, **k)
subprocess.Popen.__init__ = hook
sys.argv = ["invoke", "plan", "--host", "local"]
from invoke.main import program
program.run()
"""


def wall(argv, env) -> float:
    t0 = time.monotonic()
    subprocess.run(argv, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.monotonic() - t0


def spawn_at(py: str, env) -> float:
    env = dict(env, GP_PROBE_T0=repr(time.time()))
    out = subprocess.run([py, "-c", HOOK], cwd=REPO, env=env, capture_output=True, text=True).stderr
    return next(float(line.split()[1]) for line in out.splitlines() if line.startswith("AGENT_SPAWN"))


def measures(py: str, env) -> dict:
    """One sample of each measure for the CLI interpreter `py` (seconds)."""
    return {
        "interpreter start (python -c pass)": wall([py, "-c", "pass"], env),
        "python -c 'import invoke'": wall([py, "-c", "import invoke"], env),
        "invoke --list": wall([py, "-m", "invoke", "--list"], env),
        "CLI start -> agent spawned (invoke plan)": spawn_at(py, env),
        "whole `invoke plan --host local`": wall([py, "-m", "invoke", "plan", "--host", "local"], env),
    }


def invoke_version(py: str, env) -> str:
    return subprocess.run([py, "-c", "import invoke; print(invoke.__version__)"], env=env, capture_output=True,
                          text=True).stdout.strip() or "?"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cli-python", default=sys.executable)
    p.add_argument("--against-python", default=None,
                   help="a second CLI interpreter (another venv, e.g. another Invoke) measured alternately "
                        "with --cli-python in the same run, side by side")
    p.add_argument("--reps", type=int, default=7)
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gp-cli-probe-"))
    (work / "hosts.env").write_text(f"LOCAL_PYTHON={sys.executable}\nLOCAL_TARGETS=gp_probe_no_such_program\n"
                                    "LOCAL_SCOPE=gp-probe-no-such-token\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the CLI's venv has its own packages
    env.update(GPU_PIVOT_HOSTS_FILE=str(work / "hosts.env"), XDG_STATE_HOME=str(work))
    pythons = [args.cli_python] + ([args.against_python] if args.against_python else [])
    samples: dict = {py: {} for py in pythons}
    for _ in range(args.reps):  # alternate, so a busy moment of the machine hits every interpreter
        for py in pythons:
            for name, value in measures(py, env).items():
                samples[py].setdefault(name, []).append(value)
    heads = [f"{py} (invoke {invoke_version(py, env)})" for py in pythons]
    print(f"CLI interpreters: {'; '.join(heads)}; median of {args.reps} (min-max), seconds")
    for name in samples[pythons[0]]:
        cells = [samples[py][name] for py in pythons]
        line = "   ".join(f"{statistics.median(v):.3f} ({min(v):.3f}-{max(v):.3f})" for v in cells)
        if len(cells) == 2:
            line += f"   diff {statistics.median(cells[0]) - statistics.median(cells[1]):+.3f}"
        print(f"  {name:44s} {line}")


if __name__ == "__main__":
    main()
