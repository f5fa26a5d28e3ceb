"""Free the GPUs: lock, plan, SIGTERM all targets at once, KILL after grace, verify, settle, record.

Why this order: every target gets SIGTERM in the same instant so a server
and its workers shut down together (signalling only the parent leaves workers holding
memory); polling every 50 ms ends the wait the moment they are gone, instead of a fixed
sleep; SIGKILL only what outlives the grace period. Signals go through a pidfd, or after
a pid + start-time check, so a reused pid is never hit, and only to processes the plan
listed (and the operator approved, when a plan was shown first) and, as the plan states,
the processes those fork meanwhile (targets.py). Free must then hold for a settle window
(settle.py) so a supervisor's respawn is caught, not blessed.

The state directory is checked before anything is signalled (unusable: exit 3, nothing
sent); a write that fails DURING a teardown does not stop it (the processes matter more
than the log): it is reported in `record_errors`. The agent ignores SIGHUP and SIGINT and
survives a dropped connection or a Ctrl-C on the operator's side: it finishes and keeps
the result in last.json on the host, which `invoke status` shows.
"""
import getpass
import os
import signal
import socket
import subprocess
import time

from . import contract, forkwatch, gpuinfo, hostlock, lastrun, options, plan, procfs, scan, settle, verify
from .auditlog import Audit
from .targets import Targets

SETTLE_S = 2.0
PROGRESS_EVERY_S = 0.5


def add_arguments(parser):
    plan.add_arguments(parser)
    options.add_threshold(parser)
    parser.add_argument("--grace", type=float, default=30.0, help="seconds between SIGTERM and SIGKILL")
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="seconds to wait for the GPUs to be free after that")
    parser.add_argument("--wait-lock", type=float, default=0.0, help="wait this long for another teardown's lock")
    parser.add_argument("--operator", default=None, help="who asked (for the audit log)")
    parser.add_argument("--approved", default=None, metavar="PID:START,...",
                        help="signal only these processes (the plan the operator saw)")
    parser.add_argument("--settle", type=float, default=SETTLE_S,
                        help="seconds the GPUs must stay free after the targets are gone (catches respawns)")


def parse_approved(text):
    if text is None:
        return None
    out = set()
    for item in filter(None, text.split(",")):
        pid, _, start = item.partition(":")
        if not (pid.isdigit() and start.isdigit()):
            raise options.UsageError("--approved %r: expected PID:START[,PID:START...], got %r"
                                     % (text[:80], item[:40]))
        out.add((int(pid), int(start)))
    return out


def _mib_left(source):
    """GPU MiB still used, for progress lines; None without a GPU reader (phase stop)."""
    if source is None:
        return None
    try:
        return gpuinfo.total_used_mib(source.read())
    except Exception:  # a failing driver query must not stop a teardown halfway
        return None


def _stop_units(the_plan, audit, targets_by_pid):
    """Start `systemctl stop` / `docker stop` for each unit or container; returns the Popens."""
    stops = [(["systemctl", "disable", "--now", u["unit"]] if u["disable"] else ["systemctl", "stop", u["unit"]],
              u["pids"]) for u in the_plan["units"]]
    stops += [(["docker", "stop", c["id"]], c["pids"]) for c in the_plan["containers"]]
    running = [(argv, pids, subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                             stderr=subprocess.PIPE)) for argv, pids in stops]
    for argv, pids, _ in running:
        first = targets_by_pid.get(pids[0], {"pid": pids[0]})
        audit.log(first, " ".join(argv), "started")
    return running


def _finish_units(running, audit, targets_by_pid):
    for argv, pids, proc in running:
        if proc.poll() is None:
            continue
        first = targets_by_pid.get(pids[0], {"pid": pids[0]})
        err = proc.stderr.read().decode(errors="replace").strip()
        audit.log(first, " ".join(argv), "exit %d%s" % (proc.returncode, (": " + err) if err else ""))


def wait_gone(args, targets, limit_s, source, started, phase, among=None):
    """Poll every 50 ms until every target is gone or limit_s passes; adopt and signal
    what they fork meanwhile; progress lines every half second."""
    t0 = time.monotonic()
    last = 0.0
    alive = targets.alive(among)
    while alive and time.monotonic() - t0 < limit_s:
        now = time.monotonic()
        if now - last >= PROGRESS_EVERY_S:
            last = now
            args.emit_progress(phase=phase, elapsed_s=round(now - started, 2), alive=[t["pid"] for t in alive],
                               mib_left=_mib_left(source))
        time.sleep(verify.POLL_S)
        targets.adopt_new()
        alive = targets.alive(None if among is None else among + targets.added)
    return alive


def stuck_report(alive, doc):
    """Targets that outlived SIGKILL: state D means stuck in the driver."""
    holders = {h["pid"]: h for h in doc.get("holders", [])}
    out = []
    for t in alive:
        stat = procfs.read_stat(t["pid"]) or {}
        h = holders.get(t["pid"], {})
        state = stat.get("state", "?")
        out.append({"pid": t["pid"], "state": state, "cmdline": t["cmdline"],
                    "gpu_mib": h.get("gpu_mib") or t["gpu_mib"], "devices": h.get("devices") or t["devices"],
                    "why": "stuck in the driver (state D, uninterruptible): SIGKILL takes effect only when the "
                           "driver call returns; if it never does, the GPU needs a reset or the host a reboot"
                    if state == "D" else "still alive after SIGKILL (state %s)" % state})
    return out


def _start_watch(planned):
    try:
        return forkwatch.ForkWatch.start([(t["pid"], t["start_time"]) for t in planned])
    except Exception:  # the watch is an aid: /proc parentage still works without it
        return None


class Recorder:
    """last.json writes that never stop a teardown: failures are kept and reported."""

    def __init__(self):
        self.errors = []

    def save(self, doc):
        try:
            lastrun.save(doc)
        except OSError as exc:
            self.errors.append("could not write last.json: %s" % exc)


def execute(args, operator):
    started = time.monotonic()
    source, tried = gpuinfo.open_source(args.fake_gpus, args.devices)
    record = {"started": time.strftime(contract.TIME_FORMAT), "operator": operator, "state": "running",
              "host": socket.gethostname(), "exit_code": None, "agent": lastrun.agent_identity()}
    recorder = Recorder()
    watch = None
    try:
        since = procfs.read_stat(os.getpid())["start_time"]
        doc = scan.collect(args, source)
        doc["gpu_source_tried"] = tried
        the_plan = plan.build(doc, args)
        approved = parse_approved(args.approved)
        planned = [t for t in the_plan["targets"] if approved is None or (t["pid"], t["start_time"]) in approved]
        unapproved = [t for t in the_plan["targets"] if t not in planned]
        record.update(plan=the_plan, before=doc["gpus"], unapproved=unapproved,
                      concurrent_teardowns=hostlock.concurrent_teardowns())
        recorder.save(record)
        audit = Audit(operator)
        watch = _start_watch(planned)
        targets = Targets(planned, audit, watch, chain=doc["_chain"] | {os.getpid()}, protect=args.protect,
                          since_ticks=since, scope_uid=args.scope_uid)
        by_pid = {t["pid"]: t for t in planned}
        units = _stop_units(dict(the_plan, units=[u for u in the_plan["units"] if set(u["pids"]) & set(by_pid)],
                                 containers=[c for c in the_plan["containers"] if set(c["pids"]) & set(by_pid)]),
                            audit, by_pid)
        targets.signal(planned, signal.SIGTERM, "SIGTERM")
        args.emit_progress(phase="sigterm", elapsed_s=round(time.monotonic() - started, 2),
                           alive=[t["pid"] for t in planned], mib_left=_mib_left(source))
        alive = wait_gone(args, targets, args.grace, source, started, "grace")
        _finish_units(units, audit, by_pid)
        if alive:
            targets.signal(alive, signal.SIGKILL, "SIGKILL")
            alive = wait_gone(args, targets, min(5.0, args.timeout), source, started, "sigkill", among=alive)
        before = {(h["pid"], h["start_time"]) for h in doc["holders"]}
        result = settle.watch(args, source, targets, started, before, on_poll=lambda d, p: args.emit_progress(
            phase="verify", elapsed_s=round(time.monotonic() - started, 2), problems=p[:5],
            mib_left=gpuinfo.total_used_mib(d["gpus"])))
        after, free, problems = result["doc"], result["free"], result["problems"]
        alive = targets.alive()
        code = contract.EXIT_OK if free else verify.exit_code(after, free, args.max_used_mib)
        if targets.failed:
            code = contract.EXIT_NOT_FREE
        record.update(state="finished", exit_code=code, verdict="free" if free else "not free", problems=problems,
                      after=after["gpus"], actions=audit.records, stuck=stuck_report(alive, after),
                      still_holding=[] if free else verify.still_holding(after),
                      freed_mib=gpuinfo.total_used_mib(doc["gpus"]) - gpuinfo.total_used_mib(after["gpus"]),
                      signalled=sum(1 for a in audit.records
                                    if a["result"] == "sent" and a["signal"].startswith("SIG")),
                      signal_failures=targets.failed, adopted=targets.added, appeared=result["appeared"],
                      free_at_s=result["free_at_s"], settled_at_s=result["settled_at_s"], settle_s=args.settle,
                      uninspected=len(after.get("denied") or []), fork_watch=getattr(watch, "mode", "proc"),
                      concurrent_teardowns=_merge(record["concurrent_teardowns"], hostlock.concurrent_teardowns()),
                      finished=time.strftime(contract.TIME_FORMAT))
        out = _result(record, scan.public(after), started)
        recorder.save(out)
        out["record_errors"] = recorder.errors + list(getattr(audit, "write_errors", []))
        return code, out
    finally:
        if watch is not None:
            watch.close()
        source.close()


def _merge(first, later):
    """Other users' teardowns seen at the start or the end (one that began meanwhile counts)."""
    seen = {c["pid"] for c in first}
    return first + [c for c in later if c["pid"] not in seen]


def _result(record, doc, started):
    out = dict(doc)
    out.update(record)
    out["wall_s"] = round(time.monotonic() - started, 3)
    return out


def run(args):
    signal.signal(signal.SIGHUP, signal.SIG_IGN)   # the ssh session may drop: finish anyway
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # a Ctrl-C on the operator's side: finish anyway
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # writes to a dead pipe fail quietly instead
    operator = args.operator or "%s@%s" % (getpass.getuser(), socket.gethostname())
    scan.device_set(args)  # a bad device glob is bad input: exit 2 before anything
    parse_approved(args.approved)
    for flag in ("grace", "timeout", "settle", "wait_lock"):
        value = getattr(args, flag)
        if not 0 <= value <= contract.MAX_WAIT_S:  # also refuses nan
            raise options.UsageError("--%s %r: must be between 0 and %d seconds" % (flag.replace("_", "-"), value,
                                                                                 contract.MAX_WAIT_S))
    try:
        lastrun.preflight()
    except OSError as exc:
        return contract.EXIT_UNREACHABLE, {"state_error": str(exc), "error": str(exc), "hostname": socket.gethostname(),
                            "verdict": "not started: nothing was signalled"}
    try:
        fd = hostlock.acquire(operator, args.wait_lock)
    except hostlock.Locked as exc:
        return contract.EXIT_LOCKED, {"locked": True, "holder": exc.holder, "error": str(exc),
                                      "hostname": socket.gethostname()}
    except OSError as exc:  # the lock file itself refused (a link, not ours): like an unusable state dir
        return contract.EXIT_UNREACHABLE, {"state_error": str(exc), "error": str(exc), "hostname": socket.gethostname(),
                            "verdict": "not started: nothing was signalled"}
    try:
        return execute(args, operator)
    finally:
        hostlock.release(fd)
