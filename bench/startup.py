"""Start-up cost of the command line: what a person waits for before anything happens.

Measures, each the median of --reps runs in a fresh interpreter:
  - `python -X importtime -c 'import tasks'`: the sum of every module's own import time,
    beside `import invoke` alone (Invoke and what it imports: the floor tasks.py cannot avoid);
  - `invoke --list` and `invoke --help teardown` wall time (they load tasks.py, run nothing);
  - `invoke status --host local` wall time with no hosts.env (a local agent scan; on a
    machine without a GPU it still scans every process);
  - the agent bundle: building it (every call does, before the agent can start) and starting
    the agent with it as the transport does (`ping`), issue 15's "bundle import time".
Why: `invoke --list` and `invoke --help TASK` should not pay for the ssh transport, hosts.env
parsing, ClusterShell or the sandbox; only the task that runs imports what it uses.

Side by side: the working tree against a git revision from before tasks.py was split
(--against, default BEFORE_REV, extracted with `git archive` into a temp dir), measured
alternately in the same run so a busy moment of the machine hits both. Without git (or
with --against ''), the saved medians in bench/results/startup-before.json stand in.
`--save FILE` writes this run's medians as JSON.
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

from scripts.views.render import table  # noqa: E402

BEFORE_REV = "560bcc9"  # the last commit with the 576-line tasks.py that imported everything
BEFORE_JSON = REPO / "bench" / "results" / "startup-before.json"
MEASURES = [("import_tasks_s", "`import tasks` (-X importtime, sum of self)"),
            ("import_invoke_s", "`import invoke` alone (the floor)"),
            ("import_modules", "modules `import tasks` imports"),
            ("invoke_modules", "modules `import invoke` imports"),
            ("invoke_list_s", "`invoke --list` wall"),
            ("invoke_help_s", "`invoke --help teardown` wall"),
            ("status_local_s", "`invoke status --host local` wall"),
            ("bundle_build_s", "agent bundle built (local side, every call)"),
            ("agent_ping_s", "agent started as the transport starts it, `ping`")]

# Both bundle measures in one fresh interpreter: build the bundle as the transport does for this
# machine, then start the agent with it as the transport would (its `-S -c BOOT` stream form
# where the tree has one, else `python3 -` with the script on stdin). Prints "BUILD START".
AGENT_PROBE = """
import subprocess, sys, time
from scripts.reach import bundle
try:
    from scripts.agent.wire.call import STREAM_FLAGS
except ImportError:  # a tree from before the wire package
    from scripts.agent.contract import STREAM_FLAGS
t0 = time.perf_counter()
if hasattr(bundle, "agent_stream"):
    data, flags = bundle.agent_stream(compiled=True), list(STREAM_FLAGS)
else:
    data, flags = bundle.agent_payload(), []
built = time.perf_counter() - t0
t0 = time.perf_counter()
subprocess.run([sys.executable, *flags, "-", "ping", "--json"], input=data, check=True, capture_output=True)
print(built, time.perf_counter() - t0)
"""


def _env(tree: Path, work: Path) -> dict:
    """No hosts.env (the runs start in an empty directory), a private state dir: the run
    depends on nothing of the caller's."""
    env = dict(os.environ, XDG_STATE_HOME=str(work / "xdg"), GPU_PIVOT_CONTROL_DIR=str(work / "cm"),
               PYTHONPATH=str(tree))
    env.pop("GPU_PIVOT_HOSTS_FILE", None)
    return env


def importtime(env: dict, code: str) -> tuple:
    """(seconds, modules) for running `code`, from -X importtime's self column (summed)."""
    err = subprocess.run([sys.executable, "-X", "importtime", "-c", code], cwd=env["XDG_STATE_HOME"], env=env,
                         capture_output=True, text=True, check=True).stderr
    total = mods = 0
    for line in err.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        total += int(line[len("import time:"):].split("|")[0])
        mods += 1
    return total / 1e6, mods


def wall(argv: list, env: dict, ok=(0,)) -> float:
    t0 = time.monotonic()
    proc = subprocess.run(argv, cwd=env["XDG_STATE_HOME"], env=env, capture_output=True, text=True)
    took = time.monotonic() - t0
    if proc.returncode not in ok:
        raise RuntimeError(f"{' '.join(argv)}: exit {proc.returncode}: {proc.stderr[-1000:]}")
    return took


def one_round(tree: Path, env: dict, runs: dict) -> None:
    invoke = [sys.executable, "-m", "invoke", "--search-root", str(tree)]
    t, m = importtime(env, "import tasks")
    runs["import_tasks_s"].append(t)
    runs["import_modules"].append(m)
    t, m = importtime(env, "import invoke")
    runs["import_invoke_s"].append(t)
    runs["invoke_modules"].append(m)
    runs["invoke_list_s"].append(wall(invoke + ["--list"], env))
    runs["invoke_help_s"].append(wall(invoke + ["--help", "teardown"], env))
    # exit 6 is fine: not root, some processes could not be inspected
    runs["status_local_s"].append(wall(invoke + ["status", "--host", "local"], env, ok=(0, 6)))
    probe = subprocess.run([sys.executable, "-c", AGENT_PROBE], cwd=env["XDG_STATE_HOME"], env=env,
                           capture_output=True, text=True)
    if probe.returncode == 0:  # a tree from before the bundle: no such rows
        built, started = map(float, probe.stdout.split())
        runs["bundle_build_s"].append(built)
        runs["agent_ping_s"].append(started)


def measure(trees: dict, reps: int) -> dict:
    """{label: {measure: median}} for each source tree, the trees measured in turn each round."""
    runs: dict = {label: {k: [] for k, _ in MEASURES} for label in trees}
    with tempfile.TemporaryDirectory(prefix="gpu-pivot-startup-") as tmp:
        envs = {}
        for i, (label, tree) in enumerate(trees.items()):
            work = Path(tmp) / f"run{i}"
            work.mkdir()
            (work / "xdg").mkdir(mode=0o700)
            envs[label] = _env(tree, work)
            wall([sys.executable, "-c", "import tasks"], envs[label])  # write the bytecode caches once
        for _ in range(reps):
            for label, tree in trees.items():
                one_round(tree, envs[label], runs[label])
    return {label: {k: statistics.median(v) if v else None for k, v in r.items()} | {"reps": reps}
            for label, r in runs.items()}


def extract(rev: str, into: Path) -> Path | None:
    """The tree of `rev` (git archive), or None when there is no git history here."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev], capture_output=True)
    if archive.returncode:
        return None
    into.mkdir()
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def fmt(key: str, value) -> str:
    if value is None:
        return "-"
    return f"{value:.0f}" if key.endswith("_modules") else f"{value:.3f}"


def render(now: dict, before: dict | None, before_label: str) -> str:
    rows = []
    for key, label in MEASURES:
        b = before.get(key) if before else None
        rows.append([label, fmt(key, b), fmt(key, now[key]), f"{now[key] / b:.2f}x" if b and now[key] else "-"])
    head = [f"measure (median of {now['reps']})", f"before ({before_label})", "now", "now/before"]
    return table(head, rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--against", default=BEFORE_REV, help="git revision to measure beside the working tree ('': none)")
    p.add_argument("--save", help="write this run's medians (the working tree's) to FILE as JSON")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpu-pivot-before-") as tmp:
        old = extract(args.against, Path(tmp) / "tree") if args.against else None
        trees = {"now": REPO} | ({"before": old} if old else {})
        medians = measure(trees, args.reps)
    if old:
        before, label = medians["before"], args.against
    else:
        before = json.loads(BEFORE_JSON.read_text()) if BEFORE_JSON.exists() else None
        label = BEFORE_JSON.name
    if args.save:
        Path(args.save).write_text(json.dumps(medians["now"], indent=1, sort_keys=True) + "\n")
    print(render(medians["now"], before, label))


if __name__ == "__main__":
    main()
