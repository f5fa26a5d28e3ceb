"""`make bench`: every benchmark side by side in one run, written to bench/RESULTS.md.

Sections: (1) sandbox teardown, gpu-pivot vs the one-liners typed in the EAGLE3 data-generation
pivot and the patched-server deploy, each replayed only inside a throwaway PID namespace
holding nothing but the benchmark's processes; (2) ssh: connections
per teardown, cold vs warm ControlMaster; (3) scan cost vs process count; (4) fleet:
1/4/16/32 loopback sshd hosts, parallel vs one after another; (5) GPU rows, measured on the
GPU machine by bench/gpu_session.sh and merged from bench/results/gpu-teardown.json;
(6) start-up of the command line (bench/startup.py), beside the numbers from before tasks.py
was split into scripts/cli/.

Running it (issue 27): a section that fails is recorded in the results (a fleet run that
fails, in its own row) and the run goes on; every section prints what it does at least every
HEARTBEAT_S; results go to bench/results/local-<date>.md (git-ignored), and the tracked
bench/RESULTS.md changes only with --publish (`make bench-publish`).
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.floor import release_floor  # noqa: E402
from scripts.reach import ssh  # noqa: E402
from scripts.views.render import table  # noqa: E402
from tests.support import scenario  # noqa: E402
from tests.support.incident_replay import DATAGEN_SCRIPT, NAMES, namespace_command, sequences  # noqa: E402
from tests.support.loopback_sshd import LoopbackSshd  # noqa: E402
from tests.support.procs import ProcessSet  # noqa: E402

FIXTURE_FLOOR = REPO / "tests" / "fixtures" / "h200-driver580" / "release-floor.json"
GPU_RESULTS = REPO / "bench" / "results"  # gpu-teardown-<N>gpu.json from bench/gpu_session.sh
RESULTS_MD = REPO / "bench" / "RESULTS.md"  # tracked: rewritten only with --publish (make bench-publish)
HEARTBEAT_S = 10.0  # a section says what it is doing at least this often


def local_results() -> Path:
    """Where a run's results go unless told otherwise: bench/results/local-<date>.md (git-ignored)."""
    return GPU_RESULTS / f"local-{time.strftime('%Y-%m-%d')}.md"


class Progress:
    """What a section does, printed when it changes (`step`) and, while it does not, every
    HEARTBEAT_S with the time spent: a section silent for minutes looked hung."""

    def __init__(self, name: str, every: float | None = None, out=None):
        self.name, self.every, self.out = name, every or HEARTBEAT_S, out or sys.stdout
        self.text, self.started = "starting", time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True)

    def _say(self, text: str) -> None:
        print(f"  {self.name} [{time.monotonic() - self.started:5.0f}s] {text}", file=self.out, flush=True)

    def step(self, text: str) -> None:
        self.text = text
        self._say(text)

    def _beat(self) -> None:
        while not self._stop.wait(self.every):
            self._say(f"still running: {self.text}")

    def __enter__(self) -> Progress:
        global _current
        _current = self
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        global _current
        self._stop.set()
        self._thread.join()
        _current = None


_current: Progress | None = None


def progress(text: str) -> None:
    """A section's step, shown at once (and repeated by the heartbeat while it lasts)."""
    if _current is not None:
        _current.step(text)


def run_section(name: str, fn, every: float | None = None) -> tuple:
    """(fn's value, None), or (None, one line saying why) when it failed: the run goes on."""
    with Progress(name, every):
        try:
            return fn(), None
        except Exception as exc:  # noqa: BLE001  a benchmark's failure is a result: recorded, the run goes on
            words = str(exc).strip().splitlines()
            line = f"{type(exc).__name__}: {words[0] if words else ''}".strip()[:300]
            print(f"  {name}: FAILED ({line}); the run goes on", flush=True)
            return None, line


def med(values):
    return statistics.median(values)


def span(values):
    return f"{min(values):.3f}-{max(values):.3f}"


def invoke_argv(*args):
    return [sys.executable, "-m", "invoke", *args]


# -- 1. sandbox teardown vs the incidents' one-liners ---------------------------------------------
def oneliner_comparison(work: Path, reps: int) -> list:
    """One row per sequence. 'verdict correct': what the sequence said about the GPUs
    matches what is left (gpu-pivot: exit 0 iff every target is gone and no unprotected
    holder is left; the datagen one-liner prints "Server killed" whatever happened; the
    deploy one-liner prints a count of "0MiB" lines, which is not a count of free GPUs)."""
    rows = []
    for name in NAMES:
        walls, gone, kept, correct, said = [], [], [], [], ""
        runs = reps if name == "gpu-pivot" else max(1, reps // 2)  # the one-liners sleep 5 s per run
        for i in range(runs):
            progress(f"{name}: run {i + 1}/{runs}")
            wd = work / f"sequence-{NAMES.index(name)}-{i}"
            wd.mkdir()
            out = subprocess.run(namespace_command(wd, sequences(wd)[name]), capture_output=True, text=True,
                                 timeout=300)
            res = json.loads(out.stdout.strip().splitlines()[-1])
            all_gone = not any(res["alive"][r] for r in scenario.TARGET_ROLES)
            walls.append(res["wall_s"])
            gone.append(sum(not res["alive"][r] for r in scenario.TARGET_ROLES))
            kept.append(sum(res["alive"][r] for r in scenario.BYSTANDER_ROLES))
            said = res["said"] or f"(nothing; exit {res['rc']})"
            if name == "gpu-pivot":
                correct.append((res["rc"] == 0) == all_gone)
            elif name == DATAGEN_SCRIPT:
                correct.append(all_gone)  # it always says "Server killed"
            else:
                correct.append(False)  # killed before saying anything / grep count is not a verdict
        rows.append([name, f"{med(walls):.2f}", span(walls), f"{min(gone)}/{len(scenario.TARGET_ROLES)}",
                     f"{min(kept)}/{len(scenario.BYSTANDER_ROLES)}", f"{sum(correct)}/{runs}", said, runs])
    return rows


# -- 2. ssh: connections per teardown, cold vs warm ControlMaster ---------------------------------
def ssh_costs(work: Path, reps: int) -> dict:
    sshd = LoopbackSshd(work / "sshd", env={"GPU_PIVOT_RUN_DIR": str(work / "ssh-run")}, kex=None).start()
    ps = ProcessSet(work / "ssh-scn")
    env = dict(os.environ, GPU_PIVOT_CONTROL_DIR=str(work / "cm"), XDG_STATE_HOME=str(work / "xdg"),
               GPU_PIVOT_HOSTS_FILE=str(work / "ssh-hosts.env"))
    (work / "ssh-hosts.env").write_text(sshd.hosts_env("gpu1", extra=scenario.host_keys(ps)))
    try:
        scenario.start(ps, stubborn=False)
        before = sshd.connections()
        subprocess.run(invoke_argv("teardown", "--host", "gpu1", "--yes", "--grace", "5"), cwd=REPO, env=env,
                       capture_output=True, check=True)
        per_teardown = sshd.connections() - before
        cold, warm = [], []
        socket = ssh.control_path(sshd.dest(), sshd.ssh_opts.split(), env["GPU_PIVOT_CONTROL_DIR"])
        ctl = ["ssh", *sshd.ssh_opts.split(), "-o", f"ControlPath={socket}", "-O", "exit", sshd.dest()]
        for i in range(reps):
            progress(f"ping cold and warm, {i + 1}/{reps}")
            subprocess.run(ctl, capture_output=True)
            cold.append(_timed(invoke_argv("ping", "--host", "gpu1"), env))
            warm.append(_timed(invoke_argv("ping", "--host", "gpu1"), env))
        subprocess.run(ctl, capture_output=True)
    finally:
        ps.kill_all()
        sshd.stop()
    return {"connections_per_teardown": per_teardown, "cold": cold, "warm": warm}


def _timed(argv, env) -> float:
    t0 = time.monotonic()
    subprocess.run(argv, cwd=REPO, env=env, capture_output=True, check=True)
    return time.monotonic() - t0


# -- 3. scan cost -------------------------------------------------------------------------------
def scan_costs(extra: list, reps: int, work: Path | None = None) -> list:
    """bench/scan_cost.py's rows (the holder scan beside fuser). On a machine with no NVIDIA
    device files both look for two plain files of the run's own (--fake-devices)."""
    progress(f"bench/scan_cost.py: {reps} reps at {len(extra)} process counts, beside fuser")
    devices = []
    if not glob.glob("/dev/nvidia*") and work is not None:
        for i in range(2):
            (work / f"nvidia{i}").touch()
        devices = ["--fake-devices", "--devices", str(work / "nvidia*")]
    out = subprocess.run([sys.executable, str(REPO / "bench" / "scan_cost.py"), "--reps", str(reps), *devices,
                          "--extra", *map(str, extra), "--out", "/dev/stdout"], capture_output=True, text=True,
                         check=True)
    text = out.stdout
    return json.loads(text[text.index("["):])


def scan_rows(scans: list) -> str:
    """The scan-vs-fuser table: processes, the holder scan, fuser, their ratio, workers; then the
    records-only confirming scan, every record read whole beside given the plan's (an older
    result without them: -)."""
    def confirm(s):
        if s.get("confirm_known_ms") is None:
            return ["-", "-"]
        return [f"{s['confirm_all_ms']:.1f} / {s['confirm_known_ms']:.1f}", f"{s['confirm_known_vs_all']:.2f}x"]

    return table(["processes", "holder scan ms (median)", "fuser ms (median)", "scan / fuser", "workers / cores",
                  "whole scan ms", "GPU source", "confirming scan ms: all / given the plan's", "ratio"],
                 [[s["processes"], f"{s['holder_scan_ms']:.1f}",
                   "-" if s.get("fuser_ms") is None else f"{s['fuser_ms']:.1f}",
                   "-" if not s.get("scan_vs_fuser") else f"{s['scan_vs_fuser']:.2f}x",
                   f"{s.get('workers', 1)} / {s.get('cores', '?')}", f"{s['median_ms']:.1f}", s["gpu_source"],
                   *confirm(s)]
                  for s in scans])


def gpu_scan_lines(path: Path) -> list:
    """Section 3b: the same benchmark on the 16-core GPU machine, over its real /dev/nvidia*."""
    if not path.exists():
        return []
    rows = json.loads(path.read_text())
    return ["### 3b. On the GPU machine (H200 host, real /dev/nvidia*)", "",
            f"`python3 bench/scan_cost.py --extra 1000 5000 20000 --reps 5` (run by `bench/gpu_scale.sh`), merged "
            f"from `bench/results/{path.name}`; each extra process is an idle `sleep`; fuser and the scan alternate, "
            f"median of the reps; {rows[0].get('cores', '?')} cores.", "", scan_rows(rows), ""]


def gpu_lines() -> list:
    """Sections 5, 5b and 5c: every GPU result in bench/results, merged, not re-measured."""
    return gpu_section(sorted(GPU_RESULTS.glob("gpu-teardown-*gpu.json"))) + [""] + \
        watched_lines(GPU_RESULTS / "gpu-monitors.json") + \
        busy_host_lines(GPU_RESULTS / "gpu-scale-by0.json", GPU_RESULTS / "gpu-scale-by20000.json",
                        GPU_RESULTS / "gpu-scale-wrapped.json")


def watched_lines(path: Path) -> list:
    """Section 5b: a teardown while someone watches the GPUs, beside the run with no one."""
    if not path.exists():
        return []
    g = json.loads(path.read_text())
    rows = [[kind, f"{p['exit_0']}/{p['reps_n']}", p["freed_lines_max"],
             "{median:.3f} ({min:.3f}-{max:.3f})".format(**p["cli_freed_line_s"]),
             "{median:.3f} ({min:.3f}-{max:.3f})".format(**p["cli_exit_s"]), f"{p['exit_minus_first_s']:+.3f}"]
            for kind, p in g["pollers"].items()]
    return ["## 5b. GPU: a teardown while someone watches the GPUs", "",
            "`bench/gpu_monitors.sh` on the H200 (merged from `bench/results/gpu-monitors.json`): a one-process "
            f"torch server holding {g['gib_per_proc']:g} GiB; in each rep, side by side: nobody watching, "
            "`nvidia-smi` every 1 s (`watch -n 1 nvidia-smi`), every 0.2 s, a renamed copy of nvidia-smi every "
            "0.2 s, and a pynvml loop opening NVML, reading every GPU and closing it every 0.2 s. Seconds from Enter.",
            "", table(["who watches", "FREED, exit 0", "FREED lines (most)", "CLI to FREED", "CLI exit",
                       "exit - nobody's"], rows),
            "", f"Floor (SIGKILL -> 0 MiB) median {g['floor_s']['median']:.3f} s.", ""]


def busy_host_lines(base: Path, busy: Path, wrapped: Path) -> list:
    """Section 5c: the torch tree's teardown on a quiet host, among 20,000 processes, and (when
    measured) under a supervisor that survives it, whose window is watched whole."""
    if not (base.exists() and busy.exists()):
        return []
    runs = [json.loads(p.read_text()) for p in (base, busy, wrapped) if p.exists()]
    head = ["measure"] + [("supervisor survives" if g.get("wrapped") else f"{g.get('bystanders', 0):,} bystanders")
                          + ": median (min-max) s" for g in runs] + ["vs floor" for _ in runs]
    rows = []
    for key, label in GPU_ROWS:
        vals = [g.get(key) for g in runs]
        ratios = ["-" if not v else f"{v['median'] / g['floor_s']['median']:.2f}x"
                  for v, g in zip(vals, runs, strict=True)]
        rows.append([label] + ["-" if not v else "{median:.3f} ({min:.3f}-{max:.3f})".format(**v) for v in vals] +
                    ratios)
    steps = runs[1].get("breakdown_s") or {}
    lines = ["## 5c. GPU: a teardown on a busy host (20,000 processes)", "",
             "`bench/gpu_scale.sh` on the H200 (merged from `bench/results/" + busy.name + "` and `" + base.name +
             "`): the usual tree, on the host as it is and with 20,000 idle `sleep` processes started for the "
             "whole run; floor and gpu-pivot alternate. No supervisor survives the tree, so the settle window ends "
             "as soon as the GPUs read free (`settle: nothing left that could restart a target`); in the last column "
             "(`gpu-scale-wrapped.json`, when measured; maybe an older run) the tree runs under a "
             "`bash -c '...; sleep'` that survives it, and the CLI's exit waits out the 2 s window. Device "
             "sessions differ by 20-30% (a floor of 0.31 s one day, 0.40 s the next): compare within one run; "
             "`bench/results/history/README.md` keeps earlier runs and a same-call old/new comparison.", "",
             table(head, rows), ""]
    if steps:
        lines += ["Where the time goes among 20,000 processes (medians):", "",
                  table(["step", "median s"], [[k, f"{v['median']:.3f}"] for k, v in steps.items() if v]), ""]
    return lines


# -- 4. fleet -------------------------------------------------------------------------------------
def _run_once(argv: list, env: dict) -> tuple:
    """(completed process, wall s, None): one timed run; bench/fleet_manycore.py passes its own
    runner, which also counts the local side's CPU seconds instead of None."""
    t0 = time.monotonic()
    res = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True)
    return res, time.monotonic() - t0, None


FLEET_MODES = (("parallel", "16"), ("one after another", "1"))


def fleet(work: Path, sizes: list, reps: int, runner=_run_once, modes=FLEET_MODES, status: bool = False,
          ssh_opts: str = "") -> list:
    """Each row: a teardown of `size` hosts per mode (its --fanout); with `status`, an `invoke
    status` of the same hosts first, in the same run (its own walls and CPU in the row).
    ssh_opts: added to every host's ALIAS_SSH_OPTS (the key exchange a bench compares)."""
    n = max(sizes)
    # each loopback "host" keeps its own state dir (and so its own teardown lock), as real hosts do
    # kex=None: the servers offer OpenSSH's default key exchanges, as real hosts do (ssh_opts may narrow them)
    first = LoopbackSshd(work / "fleet" / "h01", env={"GPU_PIVOT_RUN_DIR": str(work / "fleet" / "run01")},
                         kex=None).start()
    servers = [first] + [LoopbackSshd(work / "fleet" / f"h{i:02d}", keys_from=first, kex=None,
                                      env={"GPU_PIVOT_RUN_DIR": str(work / "fleet" / f"run{i:02d}")}).start()
                         for i in range(2, n + 1)]
    hosts_file = work / "fleet-hosts.env"
    env = dict(os.environ, GPU_PIVOT_CONTROL_DIR=str(work / "fcm"), XDG_STATE_HOME=str(work / "fxdg"),
               GPU_PIVOT_HOSTS_FILE=str(hosts_file))
    rows = []
    try:
        for size in sizes:
            for mode, fanout in modes:
                walls, cpus, failed = [], [], []
                status_walls, status_cpus = [], []
                for r in range(reps):
                    progress(f"{size} host(s), {mode}, run {r + 1}/{reps}")
                    sets = []
                    text = ""
                    for i, sshd in enumerate(servers[:size], 1):
                        ps = ProcessSet(work / "fleet" / f"set-{size}-{mode[0]}-{r}-{i}")
                        ps.server(tp=2)
                        ps.role("hold", title="nvidia-persistenced")
                        sets.append(ps)
                        text += sshd.hosts_env(f"node{i:02d}", extra={
                            "DEVICES": ps.glob, "FAKE_DEVICES": "yes", "SCOPE": str(ps.base),
                            "TARGETS": r"sandbox_roles\.py"}, more_opts=ssh_opts)
                    hosts_file.write_text(text)
                    spec = f"node[01-{size:02d}]" if size > 1 else "node01"
                    if status:  # status at its default --fanout (defaults.READ_FANOUT: every host at once)
                        res, wall, cpu = runner(invoke_argv("status", "--host", spec), env)
                        if res.returncode == 0:
                            status_walls.append(wall)
                            status_cpus.append(cpu)
                        else:
                            failed.append(f"status exit {res.returncode}")
                    res, wall, cpu = runner(invoke_argv("teardown", "--host", spec, "--yes", "--fanout", fanout,
                                                        "--grace", "5"), env)
                    for ps in sets:
                        ps.kill_all()
                    if res.returncode:  # recorded in its row, not timed; the other runs go on
                        said = (res.stderr or res.stdout or "").strip().splitlines()
                        failed.append(f"exit {res.returncode}: {said[-1][:200] if said else 'nothing said'}")
                        progress(f"{size} host(s), {mode}, run {r + 1}/{reps}: FAILED ({failed[-1]})")
                        continue
                    walls.append(wall)
                    cpus.append(cpu)
                rows.append({"hosts": size, "mode": mode, "walls": walls, "cpu_s": cpus, "failed": failed,
                             "fanout": fanout, "status_walls": status_walls, "status_cpu_s": status_cpus})
                if size == 1:
                    break  # one host: parallel and sequential are the same run
    finally:
        for s in servers:
            s.stop()
    return rows


# -- 6. start-up ----------------------------------------------------------------------------------
def startup(reps: int) -> str:
    """bench/startup.py's table (its own process: it times fresh interpreters anyway)."""
    progress(f"bench/startup.py: {reps} reps")
    return subprocess.run([sys.executable, str(REPO / "bench" / "startup.py"), "--reps", str(reps)],
                          capture_output=True, text=True, check=True).stdout.rstrip()


# -- the report -----------------------------------------------------------------------------------
GPU_ROWS = (
    ("floor_s", "floor: SIGKILL the whole tree -> NVML v2 reads 0 (2 ms poll)"),
    ("floor_strict_s", "floor, strict: ... and no GPU lists a compute process (FREED's test)"),
    ("agent_free_at_s", "agent free at: lock, scan, plan, SIGTERM, every GPU reads free"),
    ("agent_settled_s", "agent settled: free at + the settle window (respawn watch)"),
    ("cli_freed_line_s", "whole CLI: Enter -> the `free at` line"),
    ("cli_exit_s", "whole CLI: Enter -> exit (after the settle window: the verdict)"),
)


def gpu_section(paths: list) -> list:
    """Section 5: the GPU rows of every gpu-teardown-<N>gpu.json, side by side (one column
    pair per GPU count), the floor first, with the issue's two targets as the headline."""
    lines = ["## 5. GPU: teardown vs the physical floor (H200)", ""]
    runs = [json.loads(path.read_text()) for path in paths]
    runs = [g for g in runs if "agent_free_at_s" in g]  # older files (one agent row with the settle) are skipped
    if not runs:
        return lines + ["No GPU results yet: run `bash bench/gpu_session.sh` (or `python3 bench/gpu_teardown.py`) "
                        "on a GPU machine and copy its gpu-teardown-<N>gpu.json to bench/results/.", ""]
    lines += ["Measured on the GPU machine by `python3 bench/gpu_teardown.py` (run by `bash bench/gpu_final.sh`); "
              "merged from bench/results/, not re-measured by this run. Tree: a parent + "
              f"{runs[0]['children']} spawned torch children, {runs[0]['gib_per_proc']:g} GiB each on every GPU = "
              f"{runs[0]['gib_per_gpu']:g} GiB per GPU; floor and gpu-pivot alternate, {runs[0]['reps_n']} reps each; "
              "median (min-max) in seconds. The CLI prints `free at` when every GPU first reads free and keeps "
              f"watching {runs[0]['settle_s']:g} s for a respawn; its exit code is the verdict of that whole window.",
              ""]
    head = ["measure"]
    for g in runs:
        head += [f"{g['gpus']} GPU median (min-max) s", "vs floor"]
    rows = []
    for key, label in GPU_ROWS:
        row = [label]
        for g in runs:
            v, f = g.get(key), g["floor_s"]["median"]
            row += ["-", "-"] if not v else [f"{v['median']:.3f} ({v['min']:.3f}-{v['max']:.3f})",
                                             f"{v['median'] / f:.2f}x"]
        rows.append(row)
    lines.append(table(head, rows))
    lines.append("")
    steps = [g for g in runs if g.get("breakdown_s")]
    if steps:
        lines += ["Where the CLI's time to FREED goes (medians of the same reps; each step's own median):", ""]
        head = ["step"] + [f"{g['gpus']} GPU median (min-max) s" for g in steps]
        rows = [[label] + ["-" if not g["breakdown_s"].get(label) else
                           "{median:.3f} ({min:.3f}-{max:.3f})".format(**g["breakdown_s"][label]) for g in steps]
                for label in steps[0]["breakdown_s"]]
        lines += [table(head, rows), ""]
    for g in runs:
        f = g["floor_s"]["median"]
        agent, cli = g["agent_free_at_s"], g["cli_freed_line_s"]
        host = (f" (CUDA_VISIBLE_DEVICES on a {g['gpus_on_host']}-GPU host)"
                if g.get("gpus_on_host", g["gpus"]) != g["gpus"] else "")
        failed = [r["exit"] for r in g["reps"] if r["exit"]]
        runs_text = ("every run exited 0" if not failed else
                     f"{len(failed)} of {len(g['reps'])} runs exited {', '.join(map(str, failed))} (see those reps in "
                     "the JSON)")
        ratio, margin = agent["median"] / f, cli["median"] - f
        strict = g.get("floor_strict_s")
        against_strict = ("" if not strict else
                          f" Against the strict floor: {agent['median'] / strict['median']:.3f}x and "
                          f"{cli['median'] - strict['median']:+.3f} s.")
        lines.append(f"- {g['gpus']} GPU{host}: agent free at / floor = **{ratio:.3f}x** (target <= 1.15x: "
                     f"{'met' if ratio <= 1.15 else 'MISSED'}); CLI to FREED - floor = **{margin:+.3f} s** (target <= "
                     f"+0.300 s: {'met' if margin <= 0.3 else 'MISSED'}); {runs_text}; every GPU read 0 MiB "
                     f"afterwards: {g['all_freed_to_0']}.{against_strict}")
    lines += [""] + history_lines(GPU_RESULTS / "history")
    return lines + exit_probe_lines(GPU_RESULTS / "exit-probe-1gpu.json") + \
        exit_probe_2gpu_lines(GPU_RESULTS / "exit-probe-2gpu.json") + \
        cli_probe_lines(GPU_RESULTS / "cli-probe-2gpu.txt", GPU_RESULTS / "cli-probe-local.txt")


def manycore_fleet_lines(path: Path) -> list:
    """Section 4b: section 4's fleet run on the 32-CPU GPU machine (bench/fleet_manycore.sh
    writes the markdown there; merged, not re-measured), and what its parallel rows mean."""
    if not path.exists():
        return []
    return [path.read_text().rstrip("\n"), "",
            "The parallel rows run `--fanout 16`: 32 hosts are two waves of 16, so the 32-host row is two "
            "teardowns back to back plus the ssh set-up of 32 connections.", ""]


def cli_probe_lines(gpu: Path, local: Path) -> list:
    """Where the CLI's time goes before the agent starts (bench/cli_probe.py, the operator's CLI
    venv beside the same venv with another Invoke, alternately): the GPU run's and a dev
    machine's, and what the Invoke pin takes off the row a teardown pays."""
    if not gpu.exists():
        return []
    out = ["Where the whole CLI's time goes before the agent starts, in the same GPU run (`python3 "
           "bench/cli_probe.py --cli-python /tmp/cli-venv/bin/python --against-python /tmp/cli-venv-alt/bin/python`: "
           "the CLI in its own venv as `make setup` makes, beside the same venv with another Invoke, alternately):",
           "", "```", gpu.read_text().rstrip("\n"), "```", ""]
    if local.exists():
        out += [f"The same on a development machine (`bench/results/{local.name}`):", "", "```",
                local.read_text().rstrip("\n"), "```", ""]
    out += ["Invoke 3.x reads its own version through importlib.metadata when it is imported; 2.2.1, the pinned "
            "version, does not, and gpu-pivot uses nothing 3.0 added. `diff` is the first interpreter's median "
            "minus the second's; on the GPU machine single rows swing by tens of ms between reps, so the row a "
            "teardown pays, CLI start -> agent spawned, is the one to read (each run's is in "
            "bench/results/history/README.md). The rest of `import invoke` (unittest.mock with asyncio, the "
            "vendored yaml) is Invoke's own; gpu-pivot's own imports, hosts.env and the task body are ~0.03 s, and "
            "the agent then starts in ~0.05 s (`timings.startup_s`).", ""]
    return out


def history_lines(folder: Path) -> list:
    """Earlier closing-run results kept for comparison (bench/results/history/runN-gpu-teardown-
    <G>gpu.json; which code each measured: that folder's README.md): the two headline numbers."""
    rows = []
    def run_number(path):  # run4 before run10
        return int(path.name.split("-")[0][3:]), path.name

    for path in sorted(folder.glob("run*-gpu-teardown-*gpu.json"), key=run_number):
        g = json.loads(path.read_text())
        f = g["floor_s"]["median"]
        rows.append([path.name.split("-")[0], f"{g['gpus']}", f"{f:.3f}", f"{g['agent_free_at_s']['median'] / f:.3f}x",
                     f"{g['cli_freed_line_s']['median'] - f:+.3f}"])
    if not rows:
        return []
    return ["Earlier runs of the same benchmark on the way here (bench/results/history/, README.md there says "
            "what code each measured):", "",
            table(["run", "GPUs", "floor s", "agent free at / floor", "CLI to FREED - floor s"], rows), ""]


def exit_probe_lines(path: Path) -> list:
    """What the driver's release costs under the agent's own conditions (bench/exit_probe.py):
    why the agent may send SIGTERM rather than SIGKILL, and open NVML only after its signals."""
    if not path.exists():
        return []
    s = json.loads(path.read_text())["summary"]

    def m(key, field=None):
        v = s[key][field] if field else s[key]
        return f"{v['median']:.3f} s ({v['min']:.3f}-{v['max']:.3f})"

    return ["The driver's release under the agent's conditions (`python3 bench/exit_probe.py`, 1 GPU, the same "
            "tree, median (min-max) of 5 fresh trees each): every GPU reads 0 after SIGKILL in "
            f"{m('kill', 'free_s')}, after SIGTERM in {m('term', 'free_s')}, and after SIGKILL while another "
            f"process opens NVML at the same instant in {m('kill+init', 'free_s')}: neither the gentler signal nor "
            "the agent's NVML open slows the release. The other way round it does: NVML's init takes "
            f"{m('init during kill init_s')} during a release against {m('init idle init_s')} on an idle GPU, "
            "which is why the agent opens NVML on a thread after its signals and never waits for it before them.",
            ""]


def exit_probe_2gpu_lines(path: Path) -> list:
    """When a GPU is free, on 2 GPUs (bench/exit_probe.py with its pidfd clock and process
    list): why FREED cannot come before the targets' exit, whatever this benchmark's floor says."""
    if not path.exists():
        return []
    rows = [r for r in json.loads(path.read_text())["rows"]
            if None not in (r["free_s"], r.get("no_procs_s"), r.get("exited_s"))]
    if not rows:
        return []
    ms = 1000
    listed_gap = max(abs(r["no_procs_s"] - r["exited_s"]) for r in rows) * ms
    early = [(r["exited_s"] - r["free_s"]) * ms for r in rows if r["exited_s"] - r["free_s"] > 0.05]
    fresh = [(r["during"]["its_free_s"], r["exited_s"]) for r in rows
             if (r.get("during") or {}).get("its_free_s") is not None]
    fresh_gap = max((abs(seen - exited) for seen, exited in fresh), default=0) * ms
    early_text = (f"in {len(early)} of {len(rows)} a handle opened before the signal read every GPU at 0 MiB "
                  f"{min(early):.0f}-{max(early):.0f} ms before that (the release ends one of two ways: about 0.1 s "
                  "before the exit, or with it)" if early else "memory read 0 MiB with the exit in every tree")
    return [f"When a GPU is free, on 2 GPUs (`python3 bench/exit_probe.py`, {len(rows)} fresh trees of the same "
            "kind: SIGKILL, SIGTERM, and SIGKILL while a second process opens NVML, with and without Xid events): "
            f"every GPU listed its compute processes until the processes had exited (pidfd) in all {len(rows)} "
            f"(within {listed_gap:.0f} ms); {early_text}; a handle opened after the signal, as the agent's is, read "
            f"0 MiB with the exit in all {len(fresh)} trees that had one (within {fresh_gap:.0f} ms). gpu-pivot calls "
            "a GPU free only when it reads free and lists no process (a context still listed is not gone), so its "
            "own floor is the targets' exit: the strict floor row above times it beside the issue's floor, in the "
            "same polling loop.", ""]


def _not_measured(failed: dict, key: str) -> list:
    return [f"**Not measured in this run**: FAILED ({failed.get(key, 'no result')}).", ""]


def fleet_table(rows: list) -> str:
    """Section 4's rows: a run that failed is counted in its row, with what it said."""
    base_rows = [r for r in rows if r["hosts"] == 1 and r["walls"]]
    base = med(base_rows[0]["walls"]) if base_rows else None
    out = []
    for r in rows:
        failed = r.get("failed") or []
        timed = [f"{med(r['walls']):.2f}", span(r["walls"]), f"{med(r['walls']) / base:.2f}x" if base else "-"] \
            if r["walls"] else ["-", "-", "-"]
        runs = len(r["walls"]) + len(failed)
        out.append([r["hosts"], r["mode"], *timed,
                    f"{len(failed)}/{runs}: {failed[0]}" if failed else "-"])
    return table(["hosts", "mode", "wall s (median)", "min-max", "vs 1 host", "failed runs"], out)


def report(args, results: dict, failed: dict | None = None) -> str:
    """The results as markdown. `results`: each section's value (keys: oneliners, ssh, scans,
    fleet, startup), None for a section that failed; `failed`: {key: the line saying why}."""
    failed = failed or {}
    oneliner_rows, ssh, scans = results.get("oneliners"), results.get("ssh"), results.get("scans")
    fleet_rows, startup_table = results.get("fleet"), results.get("startup")
    floor = release_floor(FIXTURE_FLOOR)
    lines = ["# gpu-pivot benchmark results", "",
             f"Produced by `make bench` ({' '.join(sys.argv[1:]) or 'defaults'}) on {platform.node()} "
             f"({platform.machine()}, {os.cpu_count()} CPUs, Linux {platform.release()}, "
             f"Python {platform.python_version()}) at {time.strftime('%Y-%m-%d %H:%M:%S %Z')}. "
             "Medians of the runs; min-max beside them.", ""]
    if failed:
        lines += [f"**This run is incomplete**: {len(failed)} section(s) failed ({', '.join(sorted(failed))}); each "
                  "says why below.", ""]
    lines += ["## 1. Sandbox teardown: gpu-pivot vs the incidents' one-liners", "",
              "The one-liners typed in two real incidents: the EAGLE3 data-generation pivot "
              "(`pkill -f`, `pkill -9 -f python3`, `fuser -k`, run over ssh as `bash -c` or from a script file) "
              "and the patched-server deploy (`ps aux | grep python3 | ... | xargs kill -9`, `fuser -k`).", "",
              "Scenario (tests/support/scenario.py): targets = a server tree (parent, 2 spawned workers, a non-GPU "
              "tokenizer child, a double-forked helper left in its session), a server + worker ignoring SIGTERM, "
              "an orphan worker, a renamed worker `VLLM::EngineCore` (9 processes); bystanders = "
              "`nvidia-persistenced`, an `nvitop` monitor, an unrelated `python3` job (3). Each row runs inside "
              "`unshare --pid --fork --mount-proc` holding only these processes. Wall time = the sequence's own run "
              "time (to 'GPUs free' for gpu-pivot, which verifies it; the one-liners include their fixed sleeps). "
              "gpu-pivot runs with `--grace 1` so the SIGTERM-ignoring server costs 1 s.", ""]
    if oneliner_rows is None:
        lines += _not_measured(failed, "oneliners")
    else:
        lines.append(table(["sequence", "wall s (median)", "min-max", "targets gone (worst run)",
                            "bystanders alive (worst run)", "verdict correct", "last line it printed", "runs"],
                           oneliner_rows))
        pivot_row = next(r for r in oneliner_rows if r[0] == "gpu-pivot")
        script_row = next(r for r in oneliner_rows if r[0] == DATAGEN_SCRIPT)
        ratio = float(script_row[1]) / float(pivot_row[1])
        lines += ["", f"Ratio: datagen one-liner (script) / gpu-pivot wall time = **{ratio:.1f}x**; gpu-pivot stops "
                  f"{pivot_row[3]} targets and keeps {pivot_row[4]} bystanders, the one-liner keeps {script_row[4]}.",
                  ""]
    lines += ["## 2. Through the loopback sshd", ""]
    if ssh is None:
        lines += _not_measured(failed, "ssh")
    else:
        lines += ["- ssh connections opened by one `invoke teardown --host gpu1 --yes`: "
                  f"**{ssh['connections_per_teardown']}** (counted in sshd's log).",
                  f"- `invoke ping --host gpu1` wall time, cold ControlMaster (no master; this call starts one): "
                  f"median **{med(ssh['cold']):.3f} s** ({span(ssh['cold'])}); warm (reusing it): median "
                  f"**{med(ssh['warm']):.3f} s** ({span(ssh['warm'])}); ratio cold/warm "
                  f"{med(ssh['cold']) / med(ssh['warm']):.2f}x over {len(ssh['cold'])} "
                  "runs each, alternating. Both include starting Python and Invoke locally.", ""]
    lines += ["## 3. Scan cost: the holder scan beside `fuser` over the same device files", "",
              "The agent's holder scan (every process's stat, command line, fd table by identity and maps; one "
              "forked worker per core on a big host) and a fresh `fuser` on the same files, alternating, median of "
              "the reps; the whole `scan` adds the GPU source's read. On this machine:", ""]
    if scans is None:
        lines += _not_measured(failed, "scans")
    else:
        lines += [scan_rows(scans), ""]
    lines += gpu_scan_lines(GPU_RESULTS / "gpu-scan-vs-fuser.json")
    lines += ["## 4. Fleet: teardown of N hosts (one loopback sshd and its own process set per host)", "",
              "Each host: a server + 2 workers (targets) and an `nvidia-persistenced` (kept). "
              "`--fanout 16` (parallel) vs `--fanout 1` (one after another); wall time of the whole "
              "`invoke teardown` command; a run that failed is not timed and is counted in its row.", ""]
    if fleet_rows is None:
        lines += _not_measured(failed, "fleet")
    else:
        lines.append(fleet_table(fleet_rows))
        timed = {(r["hosts"], r["mode"] == "parallel"): med(r["walls"]) for r in fleet_rows if r["walls"]}
        big = max(r["hosts"] for r in fleet_rows)
        base, par, seq = timed.get((1, True)), timed.get((big, True)), timed.get((big, False))
        lines.append("")
        if base and par and seq:
            lines += [f"Ratio: {big} hosts in parallel / 1 host = **{par / base:.2f}x**; {big} hosts one after "
                      f"another / parallel = **{seq / par:.1f}x**.", ""]
        lines += [f"All {big} hosts and their agents run on this one machine ({os.cpu_count()} CPUs), so the parallel "
                  "rows are bounded by local CPU (each agent's Python start, scan and ssh crypto), not by the network; "
                  "on a real fleet each agent runs on its own host and only the ssh clients share the operator's CPU.",
                  ""]
    lines += manycore_fleet_lines(GPU_RESULTS / "fleet-manycore.md")
    lines += gpu_lines()
    lines += ["", "Reference floor from the fixture `release-floor.json` (20-80 GB): "
              f"{floor['min_s']:.3f}-{floor['max_s']:.3f} s."]
    lines += ["", "## 6. Start-up of the command line", ""]
    if startup_table is None:
        lines += _not_measured(failed, "startup")
    else:
        lines += ["`bench/startup.py`: wall time of fresh processes, no hosts.env, medians; `before` is "
                  "bench/results/startup-before.json (tasks.py as one 576-line module importing everything). "
                  "`invoke status --host local` includes the local agent's own start and scan.", "",
                  startup_table]
    everyday = GPU_RESULTS / "everyday.md"  # section 7, from bench/everyday.py and its GPU and fleet runs
    if everyday.exists():
        lines += ["", everyday.read_text().rstrip()]
    return "\n".join(lines) + "\n"


# (title, results key, section): each runs on its own; one that fails is recorded, the run goes on
SECTIONS = (
    ("1/5 one-liner comparison", "oneliners", lambda args, work: oneliner_comparison(work, args.reps)),
    ("2/5 ssh", "ssh", lambda args, work: ssh_costs(work, args.reps)),
    ("3/5 scan cost", "scans", lambda args, work: scan_costs(args.scan_extra, args.reps, work)),
    ("4/5 fleet", "fleet", lambda args, work: fleet(work, args.fleet, max(1, args.reps // 2))),
    ("5/5 start-up", "startup", lambda args, work: startup(args.reps)),
)


def run_all(args, work: Path, sections=SECTIONS, every: float | None = None) -> tuple:
    """({key: value or None}, {key: why it failed}) of every section, one after another."""
    results, failed = {}, {}
    for title, key, section in sections:
        print(f"{title} ...", flush=True)
        results[key], why = run_section(title, lambda s=section: s(args, work), every)
        if why:
            failed[key] = why
    return results, failed


def write_results(text: str, out: Path, publish: bool, failed: dict) -> int:
    """Write the run's results to `out`; with `publish`, to the tracked RESULTS.md too, unless
    a section failed (a partial run is not published). Exit code: 1 when a section failed."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(f"results: {out}")
    if publish and not failed:
        RESULTS_MD.write_text(text)
        print(f"published: {RESULTS_MD}")
    elif publish:
        print(f"NOT published: {len(failed)} section(s) failed ({', '.join(sorted(failed))}); {RESULTS_MD} unchanged")
    elif out.resolve() != RESULTS_MD.resolve():
        print(f"{RESULTS_MD.name} unchanged (`make bench-publish` writes it)")
    return 1 if failed else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--fleet", type=int, nargs="*", default=[1, 4, 16, 32])
    p.add_argument("--scan-extra", type=int, nargs="*", default=[100, 1000, 5000])
    p.add_argument("--out", default=None,
                   help="the results file (default bench/results/local-<date>.md, git-ignored; --gpu-only: RESULTS.md)")
    p.add_argument("--publish", action="store_true",
                   help="also write the tracked bench/RESULTS.md (make bench-publish); not after a failed section")
    p.add_argument("--gpu-only", action="store_true",
                   help="only rewrite sections 3b and 5-5c of --out from bench/results/ (after a GPU run)")
    args = p.parse_args(argv)
    if args.gpu_only:
        target = Path(args.out) if args.out else RESULTS_MD
        text = target.read_text()
        start, end = text.index("## 5. GPU"), text.index("Reference floor from the fixture")
        gpu = "\n".join(gpu_lines()) + "\n"
        text = text[:start] + gpu + text[end:]
        scan_start = text.index("### 3b.") if "### 3b." in text else text.index("## 4. Fleet")
        text = text[:scan_start] + "\n".join(gpu_scan_lines(GPU_RESULTS / "gpu-scan-vs-fuser.json")) + "\n" + \
            text[text.index("## 4. Fleet"):]
        target.write_text(text)
        print(gpu)
        return 0
    work = Path(tempfile.mkdtemp(prefix="gpu-pivot-bench-"))
    # a benchmark never reads or writes the machine's gpu-pivot state (/run/gpu-pivot, the audit log
    # in ~/.local/state): every section, and what it starts, keeps it in the run's own dir
    for key, sub in (("GPU_PIVOT_RUN_DIR", "run"), ("XDG_STATE_HOME", "xdg"), ("GPU_PIVOT_SANDBOX_DIR", "sandbox"),
                     ("GPU_PIVOT_CONTROL_DIR", "cm")):
        os.environ[key] = str(work / sub)
    try:
        results, failed = run_all(args, work)
        text = report(args, results, failed)
        print(text)
        return write_results(text, Path(args.out) if args.out else local_results(), args.publish, failed)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
