"""Run a phase on the host so it outlives the ssh session and stops cleanly.

Why two ways: where systemd is PID 1, `systemd-run --unit gpu-pivot-PHASE` gives a
unit with KillMode=mixed, a stop timeout and logs in journald (not --collect: a unit that
failed keeps its result to report, and is `reset-failed` before it starts again); elsewhere (containers
without systemd, the GPU test machine) the phase runs in its own session (`setsid`) with
a log file and a state file (pid + start time). Its exit code is written by a tiny `sh`
wrapper, so a job that dies is reported with its code instead of as "not ready".
Subcommands: phase-start, phase-ready, phase-stop, phase-logs, smoke (the phase comes as
`--spec`, frame.encode_spec).
"""
import os
import shutil
import signal
import subprocess
import time
import urllib.request

from ..options.record import Options
from ..procs import procfs, procscan
from ..state import lastrun
from ..state.auditlog import Audit
from ..state.phasestate import load_state, members, save_state, session_pids
from ..teardown import checkpoint, plan, run as teardown
from ..teardown.targets import Targets
from ..wire import codes, defaults, frame, records

WRAP = '"$@"; echo $? > "$GPU_PIVOT_EXIT_FILE"'
LOG_TAIL = 15


def unit_name(name):
    return "gpu-pivot-%s" % name


def systemd_run_argv(spec):
    """The exact systemd-run command for a phase (tested by argv; untested live here)."""
    argv = ["systemd-run", "--unit", unit_name(spec["name"]), "--quiet",
            "--property", "KillMode=mixed", "--property", "TimeoutStopSec=%d" % int(spec["stop_timeout"])]
    if spec.get("dir"):
        argv += ["--working-directory", spec["dir"]]
    for k, v in sorted(phase_env(spec).items()):
        argv += ["--setenv", "%s=%s" % (k, v)]
    return argv + ["--"] + list(spec["argv"])


def phase_env(spec):
    env = dict(spec.get("env") or {})
    if spec.get("gpus"):
        env["CUDA_VISIBLE_DEVICES"] = spec["gpus"]
    return env


def _spawn(argv, spec, log, exit_file):
    """setsid + log file; the sh wrapper records the exit code. Returns (pid, start_time)."""
    d = os.path.dirname(log)
    if d:
        os.makedirs(d, exist_ok=True)
    env = dict(os.environ, **phase_env(spec))
    env["GPU_PIVOT_EXIT_FILE"] = exit_file
    if os.path.exists(exit_file):
        os.unlink(exit_file)
    with open(log, "ab") as out:
        proc = subprocess.Popen(["sh", "-c", WRAP, "gpu-pivot-phase"] + list(argv), cwd=spec.get("dir") or None,
                                env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, close_fds=True)
    return proc.pid, procfs.start_time(proc.pid)


def _alive_state(state):
    if not state:
        return False
    if state.get("unit"):
        return subprocess.run(["systemctl", "is-active", "--quiet", state["unit"]]).returncode == 0
    return procfs.same_process(state["pid"], state["start_time"])


def unit_result(unit):
    """'failed: exit-code, status 3' for a unit that ended (kept, not --collect-ed, so its
    result can be told), or its state."""
    out = subprocess.run(["systemctl", "show", "-p", "ActiveState,Result,ExecMainStatus", unit],
                         capture_output=True, text=True).stdout
    props = dict(line.partition("=")[::2] for line in out.splitlines())
    return "%s: %s, status %s" % (props.get("ActiveState", "?"), props.get("Result", "?"),
                                  props.get("ExecMainStatus", "?"))


def reset_failed(unit):
    """A unit that ended `failed` (its stop timed out and systemd SIGKILLed it, or it crashed)
    keeps its name taken: `systemd-run --unit` with it fails until `systemctl reset-failed`.
    Returns True when it was failed."""
    if subprocess.run(["systemctl", "is-failed", "--quiet", unit]).returncode != 0:
        return False
    subprocess.run(["systemctl", "reset-failed", unit], capture_output=True)
    return True


class SpecCommand:
    """An agent subcommand about one phase: it takes --spec (cli.py adds it, as the wire's
    SUBCOMMANDS name it), decodes it, and acts on it (`act`, given the spec and the few option
    values it reads by its run); its result is written through RESULT, the record the local
    side reads it as."""

    RESULT: type = records.Record

    @staticmethod
    def add_arguments(parser):
        pass

    @classmethod
    def answer(cls, code_doc):
        """(exit_code, the result) of the act's (exit_code, doc)."""
        code, doc = code_doc
        return code, records.written(cls.RESULT, doc, code=code)


class Start(SpecCommand):
    """Start a phase (and its prep jobs) detached from this session."""

    RESULT = records.StartResult

    @classmethod
    def run(cls, opts: Options):
        return cls.answer(cls.act(frame.decode_spec(opts.spec)))

    @staticmethod
    def act(spec):
        name = spec["name"]
        old = load_state(name)
        if _alive_state(old):
            error = "phase %s is already running (%s)" % (name, old.get("unit") or old["pid"])
            return codes.EXIT_FAILED, {"started": False, "error": error}
        run_dir = lastrun.run_dir()
        state = {"name": name, "argv": spec["argv"], "started": time.time(), "prep": []}
        if plan.systemd_running() and shutil.which("systemd-run"):
            reset_failed(unit_name(name))
            proc = subprocess.run(systemd_run_argv(spec), capture_output=True, text=True)
            if proc.returncode:
                return codes.EXIT_FAILED, {"started": False, "error": "systemd-run failed: %s" % proc.stderr.strip()}
            state.update(unit=unit_name(name), how="systemd-run")
        else:
            log = spec.get("log") or os.path.join(run_dir, "phase-%s.log" % name)
            pid, start = _spawn(spec["argv"], spec, log, os.path.join(run_dir, "phase-%s.exit" % name))
            state.update(pid=pid, start_time=start, log=log, how="setsid",
                         exit_file=os.path.join(run_dir, "phase-%s.exit" % name))
        for i, cmd in enumerate(spec.get("prep") or []):
            log = os.path.join(run_dir, "phase-%s-prep%d.log" % (name, i))
            exit_file = os.path.join(run_dir, "phase-%s-prep%d.exit" % (name, i))
            pid, start = _spawn(["sh", "-c", cmd], dict(spec, gpus=None), log, exit_file)
            state["prep"].append({"cmd": cmd, "pid": pid, "start_time": start, "log": log, "exit_file": exit_file})
        save_state(state)
        return codes.EXIT_OK, {"started": True, "state": state}


def _read_exit(path):
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def log_tail(state, lines=LOG_TAIL):
    if state.get("unit"):
        out = subprocess.run(["journalctl", "-u", state["unit"], "-n", str(lines), "--no-pager", "-o", "cat"],
                             capture_output=True, text=True)
        return out.stdout.splitlines()[-lines:]
    try:
        with open(state["log"], "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            return f.read().decode("utf-8", "replace").splitlines()[-lines:]
    except OSError:
        return []


def _holding(state, gpus):
    """Does any process of the phase (its unit, or its session) hold a GPU device (of `gpus`, the
    run's GpuSource)?"""
    devset = gpus.device_set()
    pids, procs = session_pids(state)
    return any(procscan.held_devices(pid, devset, procs[pid]["threads"])[0] for pid in pids)


def http_ok(url, timeout=2.0):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return 200 <= resp.status < 300, "HTTP %d" % resp.status
    except Exception as exc:  # connection refused, timeout, HTTP 503...
        return False, "%s: %s" % (type(exc).__name__, exc)


def prep_report(state):
    out = []
    for p in state.get("prep", []):
        code = _read_exit(p["exit_file"])
        running = procfs.same_process(p["pid"], p["start_time"])
        out.append({"cmd": p["cmd"], "pid": p["pid"], "exit": code,
                    "status": "running" if running and code is None
                    else ("exited %s" % code if code is not None else "gone")})
    return out


def check(spec, state, gpus):
    """(ready, dead, detail) for one look at the phase; `gpus`: the run's GpuSource."""
    alive = _alive_state(state)
    if not alive and state.get("unit"):
        return False, True, "unit %s is not running (%s)" % (state["unit"], unit_result(state["unit"]))
    if not alive:
        code = _read_exit(state["exit_file"]) if state.get("exit_file") else None
        return False, True, "the phase's process is not running (exit code %s)" % code
    if spec["ready"].startswith("http"):
        ok, why = http_ok(spec["ready"])
        return ok, False, "%s -> %s" % (spec["ready"], why)
    if spec["ready"] == "holding":
        ok = _holding(state, gpus)
        return ok, False, "holding a GPU" if ok else "alive, not yet holding a GPU"
    return True, False, "alive"


class Ready(SpecCommand):
    """Wait until a started phase is ready (HTTP health, or alive and holding its GPUs)."""

    RESULT = records.ReadyResult

    @staticmethod
    def add_arguments(parser):
        parser.add_argument("--wait", type=float, default=0.0)
        parser.add_argument("--intruders", action="store_true",
                            help="name any process outside the phase that holds a GPU meanwhile (a pivot's)")

    @classmethod
    def run(cls, opts: Options):
        return cls.answer(cls.act(frame.decode_spec(opts.spec), opts.wait, opts.intruders, opts.selection,
                                  opts.emit_progress))

    @staticmethod
    def act(spec, wait, intruders, sel, progress):
        """Look until ready, dead or `wait` seconds; with `intruders`, name what of `sel` (the
        selection: its GPUs too) holds a GPU outside the phase meanwhile."""
        state = load_state(spec["name"])
        if not state:
            return codes.EXIT_FAILED, {"ready": False, "error": "phase %s was never started here" % spec["name"]}
        started = time.monotonic()
        last = -10.0
        seen: dict = {}
        looked = None
        while True:
            ready, dead, detail = check(spec, state, sel.gpus)
            waited = time.monotonic() - started
            if intruders and (ready or dead or looked is None or waited - looked >= 1.0):
                looked = waited
                from .intruders import find  # a pivot's ready only: the scan's modules

                seen.update(((i["pid"], i["start_time"]), i) for i in find(sel, state))
            if ready or dead or waited >= wait:
                break
            if waited - last >= 2.0:
                last = waited
                tail = log_tail(state, 1)
                progress(phase="ready-wait", elapsed_s=round(waited, 1), detail=detail,
                                   last_log=tail[-1] if tail else "")
            time.sleep(0.25)
        code = codes.EXIT_OK if ready else codes.EXIT_FAILED
        return code, {"ready": ready, "dead": dead, "detail": detail, "waited_s": round(waited, 2),
                                     "log_tail": [] if ready else log_tail(state), "prep": prep_report(state),
                                     "state": state, "intruders": list(seen.values())}


class Stop(SpecCommand):
    """Stop a phase: systemctl stop, or TERM its whole session, KILL after the stop timeout."""

    RESULT = records.StopResult

    @staticmethod
    def add_arguments(parser):
        parser.add_argument("--operator", default=None)

    @classmethod
    def run(cls, opts: Options):
        return cls.answer(cls.act(frame.decode_spec(opts.spec), opts.operator, opts.emit_progress))

    @staticmethod
    def act(spec, operator, progress):
        stop = checkpoint.of_spec(spec)  # a bad one is bad input: exit 2 before anything
        state = load_state(spec["name"])
        if not state:
            return codes.EXIT_OK, {"stopped": [], "note": "phase %s was never started here" % spec["name"]}
        audit = Audit(operator or "gpu-pivot")
        stops = checkpoint.run([stop], audit, progress) if stop else []  # its signal and wait, before TERM
        targets, stopped, failed, notes = [], [], False, []
        leaders = list(state.get("prep", []))
        if state.get("unit"):
            unit_procs = members(state)
            proc = subprocess.run(["systemctl", "stop", state["unit"]], capture_output=True, text=True)
            audit.log({"pid": None, "cmdline": state["unit"]}, "systemctl stop", "exit %d" % proc.returncode)
            stopped.append(state["unit"])
            failed = proc.returncode != 0
            if reset_failed(state["unit"]):
                notes.append("%s ended failed (its stop timed out: systemd SIGKILLed it); reset-failed, so it "
                             "can start again" % state["unit"])
                audit.log({"pid": None, "cmdline": state["unit"]}, "systemctl reset-failed", "done")
            # what `systemctl stop` left alive (KillMode=process or none, a stop that failed) is ours to end
            targets += [t for t in unit_procs if procfs.same_process(t["pid"], t["start_time"])]
        else:
            leaders.insert(0, state)
        for leader in leaders:  # the prep jobs run in sessions of their own, outside any unit
            if procfs.same_process(leader["pid"], leader["start_time"]):
                targets += members(leader)
        tracked = Targets(targets, audit)
        tracked.signal(targets, signal.SIGTERM, "SIGTERM")
        limit = spec.get("stop_timeout", defaults.STOP_TIMEOUT_S)
        alive = teardown.wait_gone(progress, tracked, limit, None, time.monotonic(), "stop")
        if alive:
            tracked.signal(alive, signal.SIGKILL, "SIGKILL")
            alive = teardown.wait_gone(progress, tracked, 5.0, None, time.monotonic(), "stop", among=alive)
        code = codes.EXIT_OK if not alive and not failed else codes.EXIT_FAILED
        return code, {"stopped": stopped + [t["pid"] for t in targets], "left": [t["pid"] for t in alive],
                      "actions": audit.records, "note": "; ".join(notes) or None, "checkpoint_stops": stops}


class Logs(SpecCommand):
    """Print the phase's log (last lines), or follow it until interrupted."""

    RESULT = records.LogsResult

    @staticmethod
    def add_arguments(parser):
        parser.add_argument("--lines", type=int, default=50)
        parser.add_argument("--follow", action="store_true")

    @classmethod
    def run(cls, opts: Options):
        return cls.answer(cls.act(frame.decode_spec(opts.spec), opts.lines, opts.follow))

    @staticmethod
    def act(spec, lines, follow):
        state = load_state(spec["name"])
        if not state:
            return codes.EXIT_FAILED, {"error": "phase %s was never started here" % spec["name"]}
        if not follow:
            where = state.get("unit") or state.get("log")
            return codes.EXIT_OK, {"lines": log_tail(state, lines), "where": where}
        if state.get("unit"):
            os.execvp("journalctl", ["journalctl", "-u", state["unit"], "-n", str(lines), "-f", "-o", "cat"])
        os.execvp("tail", ["tail", "-n", str(lines), "-F", state["log"]])
        return codes.EXIT_OK, {}  # not reached


class Smoke(SpecCommand):
    """Send one request to a started server (from the host: its URL is often 127.0.0.1)."""

    RESULT = records.SmokeResult

    @classmethod
    def run(cls, opts: Options):
        return cls.answer(cls.act(frame.decode_spec(opts.spec)))

    @staticmethod
    def act(spec):
        body = (spec.get("smoke_body") or "").encode() or None
        req = urllib.request.Request(spec["smoke_url"], data=body, method="POST" if body else "GET",
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=defaults.SMOKE_TIMEOUT_S) as resp:
                text = resp.read(2000).decode("utf-8", "replace")
                return codes.EXIT_OK, {"ok": True, "status": resp.status, "body": text}
        except Exception as exc:
            return codes.EXIT_FAILED, {"ok": False, "error": "%s: %s" % (type(exc).__name__, exc)}
