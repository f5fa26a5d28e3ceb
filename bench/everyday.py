"""The commands operators run most, at their floor: status, verify --wait, and what each call ships.

Sections (`--sections`, default all but gpu):
  bytes      what one call ships, per subcommand (bundle.agent_stream): modules, bytes over ssh
             (zlib, sources) and to this machine (with bytecode), beside what every call shipped
             before (every subcommand's modules);
  roundtrip  `invoke status --host sandbox` beside `invoke --list` (the CLI's own start), this
             tree and --against's (git archive) alternately in the same run, with the agent's
             `python3` as PATH finds it and with /usr/bin first (a Debian host's); then where the
             round trip goes, step by step, in fresh interpreters;
  wait       `verify --wait`: a holder of the sandbox's fake GPUs exits (SIGKILL, its exit seen
             by a pidfd) while the agent waits; seconds from that exit until the agent's result;
  gpu        on a GPU host: `invoke status --host local` beside `nvidia-smi --query-compute-apps`
             and `fuser -v /dev/nvidia*`, alternately (--cli-python: the CLI's venv).
Prints markdown; `--json FILE` keeps the numbers. Medians (min-max) of --reps.
Why here and not in tests: wall-clock numbers depend on the machine; the tests assert what
the numbers rest on (tests/reach/test_bundle_subcommands.py).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from scripts.agent.wire import call, frame  # noqa: E402
from scripts.reach import bundle  # noqa: E402

AGAINST = "3417671"  # the last commit before issue 37: every call shipped every module


def med(values: list) -> str:
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})" if values else "-"


def md_table(header: list, rows: list) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows])


# -- bytes ------------------------------------------------------------------------------------------
def payload_bytes() -> dict:
    every = {"modules": len(bundle.agent_modules()) + 1, "ssh": len(bundle.agent_stream()),
             "local": len(bundle.agent_stream(compiled=True))}
    per = {name: {"modules": len(bundle.agent_modules(name)) + 1, "ssh": len(bundle.agent_stream(subcommand=name)),
                  "local": len(bundle.agent_stream(compiled=True, subcommand=name)),
                  "teardown_or_phase": sorted(m for m in bundle.agent_modules(name)
                                              if m.startswith(("phases", "teardown.run", "teardown.plan",
                                                               "teardown.early", "teardown.settle")))}
           for name in call.SUBCOMMAND_MODULES}
    return {"every": every, "per": per}


def bytes_section(r: dict) -> str:
    e = r["every"]
    rows = [[name, p["modules"], p["ssh"], f"{p['ssh'] / e['ssh']:.2f}x", p["local"],
             ", ".join(p["teardown_or_phase"]) or "none"] for name, p in r["per"].items()]
    rows.append(["(before: every call)", e["modules"], e["ssh"], "1.00x", e["local"], "all"])
    return ("## What one call ships, per subcommand\n\n`python3 bench/everyday.py --sections bytes`: "
            "bundle.agent_stream(subcommand=...) as the transport sends it; `ssh`: the sources, zlib level 6 "
            "(what travels to an ssh host); `local`: with this interpreter's bytecode, uncompressed (this "
            "machine's pipe). Modules count the package `agent` itself.\n\n"
            + md_table(["subcommand", "modules", "bytes over ssh", "vs every module", "bytes local",
                        "teardown/phase modules"], rows))


# -- roundtrip --------------------------------------------------------------------------------------
def tree_of(rev: str, work: Path) -> Path | None:
    if not rev:
        return None
    if Path(rev).is_dir():  # a tree made elsewhere (`git archive REV | tar -x -C DIR`): a machine with no .git
        return Path(rev).resolve()
    tree = work / f"tree-{rev}"
    tree.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    return tree


def timed(argv: list, cwd: Path, env: dict) -> tuple:
    t0 = time.perf_counter()
    res = subprocess.run(argv, cwd=cwd, env=env, capture_output=True)
    return time.perf_counter() - t0, res.returncode


# The round trip's steps, in one fresh interpreter in the tree (cwd): each step's seconds as JSON.
PROBE = r"""
import json, os, subprocess, sys, threading, time
t = [time.perf_counter()]
def mark(): t.append(time.perf_counter())
sys.path.insert(0, os.getcwd())
import invoke; mark()
import tasks; mark()
from scripts.ops import fleet
from scripts.reach import transport, bundle
from scripts.views import fleet as fleet_view, health as health_view, status as status_view
from scripts.cli.common import hosts_of; mark()
host = hosts_of(os.environ.get("PROBE_HOST", "sandbox"))[0]; mark()
per = "subcommand" in bundle.agent_stream.__wrapped__.__code__.co_varnames
stream = lambda: bundle.agent_stream(compiled=True, **({"subcommand": "scan"} if per else {}))
stream(); mark()
bundle.agent_stream.cache_clear()
from scripts.agent.wire import requests
r = transport.call_agent(host, requests.Scan()); mark()
argv = transport.agent_argv(host, requests.Scan(), "0a" * 8, False)
def agent(av, data):  # as runner.py starts it: the stream written on a thread, stdout read here
    import tempfile
    with tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        p = subprocess.Popen(av, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err)
        def feed():
            p.stdin.write(data); p.stdin.close()
        threading.Thread(target=feed).start()
        p.stdout.read(); p.wait()
        wall = time.perf_counter() - t0
        err.seek(0)
        return wall, err.read()
data = stream()
interp = agent([argv[0], "-S", "-c", "pass"], b"")[0]
alone = agent(argv, data)[0]
err = agent(argv[:1] + ["-X", "importtime"] + argv[1:], data)[1].decode()
imports = sum(int(l.split("|")[0].split(":")[1]) for l in err.splitlines()
              if l.startswith("import time:") and "self" not in l) / 1e6
steps = dict(zip(["import_invoke", "import_tasks", "task_imports", "hosts_of", "bundle_build", "call_agent"],
                 [b - a for a, b in zip(t, t[1:])]))
steps.update(agent_interpreter=interp, agent_alone=alone, agent_imports_importtime=imports, bytes=len(data))
print(json.dumps(steps))
"""


def roundtrip(work: Path, reps: int, against: str, cli_python: str) -> dict:
    trees = {"now": REPO}
    before = tree_of(against, work)
    if before:
        trees[f"before ({against})"] = before
    env = dict(os.environ)
    for key, sub in (("GPU_PIVOT_RUN_DIR", "run"), ("XDG_STATE_HOME", "xdg"), ("GPU_PIVOT_SANDBOX_DIR", "sandbox"),
                     ("GPU_PIVOT_CONTROL_DIR", "cm")):
        env[key] = str(work / sub)
    env.pop("GPU_PIVOT_HOSTS_FILE", None)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # as on an operator's machine: each tree's .pyc written once, then read
    invoke = [cli_python, "-m", "invoke"]
    up = subprocess.run(invoke + ["sandbox", "up"], cwd=REPO, env=env, capture_output=True, text=True)
    if up.returncode:
        raise RuntimeError(f"sandbox up failed: {up.stderr[-400:]}")
    found = shutil.which("python3", path=env.get("PATH")) or "python3"
    paths = {f"python3 = {found}": env["PATH"]}
    if Path("/usr/bin/python3").exists() and os.path.realpath(found) != os.path.realpath("/usr/bin/python3"):
        paths["python3 = /usr/bin/python3"] = "/usr/bin:" + env["PATH"]
    walls: dict = {}
    codes: dict = {}
    try:
        for tree in trees.values():  # warm: Python's caches and the kept agent stream, written once per tree
            for args in (["--list"], ["status", "--host", "sandbox"]):
                timed(invoke + args, tree, env)
        for _ in range(reps):
            for tree_name, tree in trees.items():
                for path_name, path in paths.items():
                    run_env = dict(env, PATH=path)
                    for what, args in (("list", ["--list"]), ("status", ["status", "--host", "sandbox"])):
                        wall, code = timed(invoke + args, tree, run_env)
                        walls.setdefault((tree_name, path_name, what), []).append(wall)
                        codes.setdefault((tree_name, path_name, what), set()).add(code)
        steps = probe_steps(trees, paths, env, reps, cli_python)
    finally:
        subprocess.run(invoke + ["sandbox", "down"], cwd=REPO, env=env, capture_output=True)
    return {"walls": {" | ".join(k): v for k, v in walls.items()}, "codes": {" | ".join(k): sorted(v) for k, v in
                                                                           codes.items()},
            "steps": {" | ".join(k): v for k, v in steps.items()}, "trees": list(trees), "paths": list(paths),
            "reps": reps}


def probe_steps(trees: dict, paths: dict, env: dict, reps: int, cli_python: str) -> dict:
    """{(tree, agent interpreter): {step: [seconds per rep]}} from PROBE in fresh interpreters."""
    steps: dict = {}
    for path_name, path in paths.items():
        for tree_name, tree in trees.items():
            for _ in range(reps):
                out = subprocess.run([cli_python, "-c", PROBE], cwd=tree, env=dict(env, PATH=path),
                                     capture_output=True, text=True)
                if out.returncode == 0:
                    for k, v in json.loads(out.stdout.strip().splitlines()[-1]).items():
                        steps.setdefault((tree_name, path_name), {}).setdefault(k, []).append(v)
    return steps


STEP_NAMES = [("import_invoke", "CLI: `import invoke`"), ("import_tasks", "CLI: `import tasks`"),
              ("task_imports", "CLI: the status task's imports (transport, views, fleet)"),
              ("hosts_of", "CLI: the host's configuration (hosts_of)"),
              ("bundle_build", "CLI: the agent stream built (feeding thread)"),
              ("call_agent", "call_agent(scan): spawn, stream, agent, answer read"),
              ("agent_interpreter", "agent alone: `python3 -S -c pass`"),
              ("agent_alone", "agent alone: the scan as the transport starts it"),
              ("agent_imports_importtime", "agent alone: its imports (-X importtime, sum of self)")]


def roundtrip_section(r: dict, command: str) -> str:
    w = r["walls"]

    def trip(tree, path):
        return statistics.median(w[f"{tree} | {path} | status"]) - statistics.median(w[f"{tree} | {path} | list"])

    def paired(tree, path):  # each rep's status minus the list run just before it: a busy moment hits both
        return [b - a for a, b in zip(w[f"{tree} | {path} | list"], w[f"{tree} | {path} | status"], strict=True)]

    rows = [[tree, path, med(w[f"{tree} | {path} | list"]), med(w[f"{tree} | {path} | status"]),
             f"**{trip(tree, path):.3f}**", med(paired(tree, path))] for tree in r["trees"] for path in r["paths"]]
    now, before = r["trees"][0], r["trees"][-1]
    now_before = [f"- {path}: round trip now / before = **{trip(now, path) / trip(before, path):.2f}x**"
                  for path in r["paths"]] if len(r["trees"]) > 1 else []
    steps_rows = []
    keys = list(r["steps"])
    for name, label in STEP_NAMES:
        steps_rows.append([label] + [med(r["steps"][k].get(name, [])) for k in keys])
    return ("## `invoke status --host sandbox`: the round trip over `invoke --list`\n\n"
            f"`{command}`: wall seconds of fresh processes, median (min-max) of {r['reps']}, all rows alternating "
            "in one run; round trip = status median - list median (the CLI's own start is `--list`'s). The "
            "agent runs on `python3` as PATH finds it (a pyenv shim is a bash script that starts pyenv: "
            "tens of ms before Python) and with /usr/bin first, as on a Debian host.\n\n"
            + md_table(["tree", "agent interpreter", "`invoke --list` s", "`invoke status --host sandbox` s",
                        "round trip s", "paired: status - list, per rep"], rows) + "\n\n" + "\n".join(now_before)
            + "\n\nWhere it goes (each step timed in a fresh interpreter in the tree, same run; seconds):\n\n"
            + md_table(["step"] + [k.replace(" | ", ", ") for k in keys], steps_rows))


# -- wait -------------------------------------------------------------------------------------------
def verify_wait(work: Path, reps: int) -> dict:
    """The agent's `verify --wait 30` on a scope of its own (fake GPUs in a temp dir); once it
    reports waiting (a progress line), the holder tree is SIGKILLed; its exit is taken from a
    pidfd; the reaction is the agent's exit minus that exit."""
    import dataclasses
    import select

    from scripts.agent.wire import requests
    from scripts.config.hostconfig import build_host
    from scripts.reach import transport
    from tests.support import scenario
    from tests.support.procs import ProcessSet

    reactions, results = [], []
    for rep in range(reps):
        ps = ProcessSet(work / f"wait-{rep}")
        try:
            parent, workers = ps.server(tp=1)
            keys = dict(scenario.host_keys(ps), TARGETS=r"sandbox_roles\.py|sglang\.launch_server")
            host = dataclasses.replace(build_host("local", keys, "bench"), fake_gpus=str(ps.memdir))
            nonce = frame.new_nonce()
            argv = transport.agent_argv(host, requests.Verify(wait=30), nonce, True)
            argv[0] = sys.executable
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write(bundle.agent_stream(compiled=True, subcommand="verify"))
            proc.stdin.close()
            lines = []
            for raw in proc.stdout:
                lines.append(raw.decode())
                if '"verify-wait"' in lines[-1]:
                    break
            pids = [parent, *workers]
            fds = [os.pidfd_open(p) for p in pids]
            for p in pids:
                os.kill(p, signal.SIGKILL)
            assert proc.stdout is not None and proc.stdin is not None
            for fd in fds:
                select.select([fd], [], [])
                os.close(fd)
            exited = time.perf_counter()
            rest = proc.stdout.read().decode()
            proc.wait()
            done = time.perf_counter()
            doc = json.loads(frame.extract("".join(lines) + rest, nonce))
            results.append({"free": doc.get("free"), "code": proc.returncode, "waited_s": doc.get("waited_s")})
            reactions.append(done - exited)
        finally:
            ps.kill_all()
    return {"reactions": reactions, "results": results}


def wait_section(r: dict, command: str) -> str:
    free = sum(1 for x in r["results"] if x["free"] and x["code"] == 0)
    return ("## `verify --wait`: from the holder's exit to the verdict\n\n"
            f"`{command}`: the agent's `verify --wait 30` (as the transport starts it, its own bundle) on a "
            "scope of fake GPUs; once it reports waiting, the holder tree (a server and its worker holding "
            "a fake GPU) is SIGKILLed and its exit taken from pidfds; then until the agent has exited with its "
            "result. Between scans the agent waits on the holders' pidfds, then polls the GPU source's quick "
            "read, then scans once more.\n\n"
            + md_table(["measure", "seconds, median (min-max)", "runs free, exit 0"],
                       [["holder exited -> verify's result", f"**{med(r['reactions'])}**",
                         f"{free}/{len(r['results'])}"]]))


# -- gpu --------------------------------------------------------------------------------------------
def gpu(reps: int, cli_python: str) -> dict:
    devices = sorted(str(p) for p in Path("/dev").glob("nvidia*") if p.is_char_device())
    argvs = {"`invoke status --host local`": [cli_python, "-m", "invoke", "status", "--host", "local"],
             "`nvidia-smi --query-compute-apps`": ["nvidia-smi", "--query-compute-apps=pid,used_memory",
                                                     "--format=csv"],
             "`fuser -v /dev/nvidia*`": ["fuser", "-v", *devices],
             "`invoke --list`": [cli_python, "-m", "invoke", "--list"]}
    argvs = {name: argv for name, argv in argvs.items() if shutil.which(argv[0])}  # a host without nvidia-smi
    walls: dict = {}
    codes: dict = {}
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    for _ in range(reps):
        for name, argv in argvs.items():
            wall, code = timed(argv, REPO, env)
            walls.setdefault(name, []).append(wall)
            codes.setdefault(name, set()).add(code)
    # where status's own part goes there: the same steps as the round trip's, on host local
    steps: dict = {}
    for _ in range(reps):
        out = subprocess.run([cli_python, "-c", PROBE], cwd=REPO, env=dict(env, PROBE_HOST="local"),
                             capture_output=True, text=True)
        if out.returncode == 0:
            for k, v in json.loads(out.stdout.strip().splitlines()[-1]).items():
                steps.setdefault(k, []).append(v)
    return {"walls": walls, "codes": {k: sorted(v) for k, v in codes.items()}, "steps": steps}


def gpu_section(r: dict, command: str) -> str:
    status = statistics.median(r["walls"]["`invoke status --host local`"])
    rows = [[name, med(v), f"{statistics.median(v) / status:.2f}x", r["codes"][name]] for name, v in r["walls"].items()]
    return ("## GPU host: `invoke status --host local` beside nvidia-smi and fuser\n\n"
            f"`{command}`: wall seconds, median (min-max), the commands alternating.\n\n"
            + md_table(["command", "wall s", "vs status", "exit codes"], rows)
            + "\n\nWhere `status --host local` goes (each step in a fresh interpreter, seconds):\n\n"
            + md_table(["step", "median (min-max)"],
                       [[label, med(r.get("steps", {}).get(name, []))] for name, label in STEP_NAMES]))


SECTIONS = ("bytes", "roundtrip", "wait", "gpu")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sections", default="bytes,roundtrip,wait")
    parser.add_argument("--reps", type=int, default=9)
    parser.add_argument("--against", default=AGAINST, help="git revision for the side-by-side ('' for none)")
    parser.add_argument("--cli-python", default=sys.executable, help="the interpreter the CLI (invoke) runs on")
    parser.add_argument("--json", help="write the numbers here")
    args = parser.parse_args(argv)
    sections = [s for s in args.sections.split(",") if s]
    bad = [s for s in sections if s not in SECTIONS]
    if bad:
        print(f"unknown section {bad[0]!r}: one of {', '.join(SECTIONS)}", file=sys.stderr)
        return 2
    command = "python3 bench/everyday.py " + " ".join(sys.argv[1:] if argv is None else argv)
    work = Path(tempfile.mkdtemp(prefix="gpu-pivot-everyday-"))
    out, numbers = [], {}
    try:
        for s in sections:
            print(f"[everyday] {s} ...", file=sys.stderr, flush=True)
            if s == "bytes":
                numbers[s] = payload_bytes()
                out.append(bytes_section(numbers[s]))
            elif s == "roundtrip":
                numbers[s] = roundtrip(work, args.reps, args.against, args.cli_python)
                out.append(roundtrip_section(numbers[s], command))
            elif s == "wait":
                numbers[s] = verify_wait(work, args.reps)
                out.append(wait_section(numbers[s], command))
            elif s == "gpu":
                numbers[s] = gpu(args.reps, args.cli_python)
                out.append(gpu_section(numbers[s], command))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    text = "\n\n".join(out) + "\n"
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps(numbers, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
