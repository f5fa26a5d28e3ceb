"""Free the GPUs: lock, plan, SIGTERM the targets in two batches, KILL after grace, verify, settle, record.

Why this order: a batch's targets get SIGTERM in the same instant so a server and its
workers shut down together (signalling only the parent leaves workers holding memory): the
early batch (early.py: what a target pattern names and its tree, sent once every record is
read) and the plan's batch (the rest of the plan, once the fd tables and maps are read); the
wait wakes on each target's exit (pidfds, targets.py) or fork (the fork watch's socket),
instead of a fixed sleep or a 50 ms tick. SIGKILL only what still runs its own code after
the grace period: a target in its exit (procfs.exiting) needs none and its grace is not
waited out; its exit itself is then waited for on the pidfds (no signal speeds it, and free
needs it), and the settle window's NVML read and holder scan say when the GPUs are free.

The whole account: docs/design-notes.md (scripts/agent/teardown/run.py)."""
from __future__ import annotations

import importlib.util
import os
import signal
import socket
import time

from ..gpu import gpuinfo
from ..holders import scan
from ..options.record import Options
from ..procs import procfs
from ..state import lastrun
from ..state.auditlog import Audit
from ..wire import codes, defaults, records
from . import early, forkwatch, hold, hostlock, plan, shm, units
from .freeze import Freezer
from .targets import Targets

TYPE_CHECKING = False  # typing costs the agent ~3 ms a start: mypy reads this block by its name
if TYPE_CHECKING:
    from typing import Callable

    from ..policy.selection import Selection

SETTLE_S = defaults.SETTLE_S
PROGRESS_EVERY_S = 0.5
PROC_WALK_EVERY_S = 0.05  # without the fork connector: how often /proc is walked for new descendants
EXIT_LOOK_S = (0.002, 0.05)  # wait_gone: first look for targets in their exit, doubling up to the last
# imported only after the signals (execute), checked present before them
LATER = ("..gpu.checkup", ".settle", ".verify")


class AgentIncomplete(Exception):
    """A module of the agent is missing (a broken bundle): nothing may be signalled."""


class Settings:
    """What the teardown's steps read of its flags, made once in run(opts): the selection (its
    GPU source, protect list, scope and threshold with it), the approved plan (parsed), the
    waits, the MPS and shared-memory choices, the settle window's flags and the progress line.
    Frozen and typed, so a step's reads show and mypy checks them."""

    __slots__ = ("selection", "fake_gpus", "approved", "grace", "timeout", "mps", "keep_shm", "settle", "settle_auto",
                 "progress")

    selection: Selection
    fake_gpus: str | None  # the sandbox's fake GPU memory: read before the signals, it costs nothing
    approved: set | None  # parse_approved: None when every planned target may be signalled
    grace: float
    timeout: float
    mps: str | None
    keep_shm: bool
    settle: float
    settle_auto: bool
    progress: Callable[..., None]  # Options.emit_progress: one progress line when asked for

    def __init__(self, **values):
        for name in self.__slots__:
            object.__setattr__(self, name, values.pop(name))
        if values:
            raise TypeError("Settings has no field %s" % ", ".join(sorted(values)))

    def __setattr__(self, name, value):
        raise AttributeError("Settings is frozen: %s" % name)


def add_arguments(parser):
    plan.add_arguments(parser)  # --max-used-mib: cli.py adds it (the wire's SUBCOMMANDS name it)
    parser.add_argument("--grace", type=float, default=defaults.GRACE_S, help="seconds between SIGTERM and SIGKILL")
    parser.add_argument("--timeout", type=float, default=defaults.TIMEOUT_S,
                        help="seconds to wait for the GPUs to be free after that")
    parser.add_argument("--wait-lock", type=float, default=defaults.WAIT_LOCK_S,
                        help="wait this long for another teardown's lock")
    parser.add_argument("--operator", default=None, help="who asked (for the audit log)")
    parser.add_argument("--approved", default=None, metavar="PID:START,...",
                        help="signal only these processes (the plan the operator saw)")
    parser.add_argument("--mps", choices=("protect", "quit"), default="protect",
                        help="CUDA MPS: protect the control daemon and its server (default), or quit it through its "
                             "control pipe once the targets are gone and wait for its server to exit")
    parser.add_argument("--settle", type=float, default=None,
                        help="seconds the GPUs must stay free after the targets are gone, to catch a respawn "
                             "(default %g, and none when nothing that could restart a target survives: settle.py; "
                             "given, the whole window is always watched)" % SETTLE_S)
    parser.add_argument("--keep-shm", action="store_true",
                        help="keep the /dev/shm files and System V segments the stopped targets left (by default "
                             "those no live process holds are removed once the GPUs are FREED: shm.py)")
    parser.add_argument("--hold-s", type=float, default=None, metavar="SECONDS",
                        help="once FREED, keep the host's lock for a pivot: a detached holder owns it until "
                             "`release --token` or these seconds pass (hold.py); with --hold-phase, --hold-token")
    parser.add_argument("--hold-phase", default=None, help="the phase the pivot starts next (the lock's text)")
    parser.add_argument("--hold-token", default=None, help="hex the pivot's `release` call names the hold by")


def parse_approved(text):
    if text is None:
        return None
    out = set()
    for item in filter(None, text.split(",")):
        kind, eq, name = item.partition("=")  # unit=NAME, container=ID: a pending restart (pending.py)
        if eq and kind in ("unit", "container") and name:
            out.add((kind, name))
            continue
        pid, _, start = item.partition(":")
        if not (pid.isdigit() and start.isdigit()):
            raise codes.UsageError("--approved %r: expected PID:START[,PID:START...], got %r"
                                     % (text[:80], item[:40]))
        out.add((int(pid), int(start)))
    return out


def _read_gpus(source):
    """The source's GPUs, or [] when the driver query fails (it must not stop a teardown)."""
    try:
        return source.read()
    except Exception:
        return []


def _freed(before, after):
    """MiB freed, or None where either side is unknown (never a 0 that reads as nothing freed)."""
    return None if before is None or after is None else before - after


def _mib_left(source):
    """GPU MiB still used, for progress lines; None without a GPU reader (phase stop)."""
    if source is None:
        return None
    try:
        return gpuinfo.total_used_mib(source.read())
    except Exception:  # a failing driver query must not stop a teardown halfway
        return None


def _stop_units(the_plan, audit, targets_by_pid):
    """Start the manager's stop for each unit, container or other manager's program
    (units.stop_argv; plan["managers"]: supervisorctl, sv down, podman stop...); returns the
    Popens. With --disable a container's restart policy is set to `no` first, so nothing
    brings it back between the stop and the update."""
    items = the_plan["units"] + the_plan["containers"] + [m for m in the_plan.get("managers", []) if m["run"]]
    if not items:
        return []
    import subprocess  # here: a teardown without units or containers starts no process

    running = []
    for item in items:
        first = _audited_as(item, targets_by_pid)
        for argv in units.before_stop(item):
            proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True)
            audit.log(first, units.stop_text(item, argv), _exit_text(proc.returncode, proc.stderr))
        argv = units.stop_argv(item)
        # cwd /: supervisorctl reads a supervisord.conf in its working directory
        running.append((argv, item, subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                                     stderr=subprocess.PIPE, cwd="/")))
        audit.log(first, units.stop_text(item, argv), "started")
    return running


def _audited_as(item, targets_by_pid):
    """The process a stop is logged against: its first target, or for a pending restart (no
    process yet: pending.py) the unit or container itself."""
    if item["pids"]:
        return targets_by_pid.get(item["pids"][0], {"pid": item["pids"][0]})
    return {"pid": None, "cmdline": "%s (%s)" % (item.get("unit") or item.get("name") or item.get("id"),
                                                 item.get("pending"))}


def _exit_text(code, err):
    err = err.decode(errors="replace").strip()
    return "exit %d%s" % (code, (": " + err) if err else "")


def _finish_units(running, audit, targets_by_pid, wait_s=0.0, targets=None):
    """Log each finished stop with whether the unit or container comes back by itself
    (enabled at boot, a docker restart policy); `wait_s`: how long to wait for one still running.
    Its processes still alive once the stop has ended (KillMode=process, a stop that failed)
    get SIGTERM then, audited, instead of waiting out the grace period unsignalled; but never
    the process another manager runs itself (`main_pid`): `sv down` and `svc -d` return before
    the supervisor has read them, and a signal that ends the process first has it started again
    (what is below it, a server under supervisord's `bash -c`, is signalled)."""
    if not running:
        return
    import subprocess  # loaded by _stop_units already: it started these

    for argv, item, proc in running:
        if proc.returncode is not None:
            continue
        try:
            proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            continue
        first = _audited_as(item, targets_by_pid)
        rec = audit.log(first, units.stop_text(item, argv), _exit_text(proc.returncode, proc.stderr.read()))
        rec["comes_back"] = units.comes_back(item)  # the report says it (teardown_view.verdict_lines)
        ours = [targets_by_pid[p] for p in item["pids"] if p in targets_by_pid and p != item.get("main_pid")]
        left = targets.running(ours) if targets else []
        if left:
            targets.signal(left, signal.SIGTERM, "SIGTERM")


def wait_gone(progress, targets, limit_s, source, started, phase, among=None, on_wake=None, until_gone=False):
    """Wait until no target runs its own code any more (each has exited or every thread of it
    is in its exit: procfs.exiting; `until_gone`: until each has exited) or limit_s passes,
    waking on each exit (pidfd), each fork (connector socket), and - unless `until_gone` - to
    look again for targets that entered their exit (which no fd reports): every 2 ms at
    first, backing off to 50 ms while they live on (a server's own SIGTERM handling). A
    process in its exit is left to finish: it needs no SIGKILL. Adopts and
    signals what targets fork meanwhile (without the connector: a /proc walk every
    PROC_WALK_EVERY_S, and always before saying none is left); `progress` (Options.emit_progress)
    lines every half second; `on_wake(alive)` each time it wakes (manager stops that ended); with
    `until_gone` it is also asked every 2 ms, backing off to 50 ms, and a true answer ends the
    wait (exits that no longer matter: _released). Returns those still running."""
    t0 = last = time.monotonic()
    watch_fd = targets.watch.fileno() if targets.watch is not None else None
    next_walk = t0 + PROC_WALK_EVERY_S
    look_again = EXIT_LOOK_S[0]

    def current():
        among_now = None if among is None else among + targets.added
        return targets.alive(among_now) if until_gone else targets.running(among_now)

    alive = current()
    while alive:
        now = time.monotonic()
        if now - t0 >= limit_s:
            break
        if now - last >= PROGRESS_EVERY_S:
            last = now
            progress(phase=phase, elapsed_s=round(now - started, 2), alive=[t["pid"] for t in alive],
                     mib_left=_mib_left(source))
        wake = min(t0 + limit_s, last + PROGRESS_EVERY_S,
                   t0 + limit_s if until_gone and on_wake is None else now + look_again,
                   next_walk if watch_fd is None else t0 + limit_s)  # an exit itself wakes the pidfds
        targets.wait(alive, wake - now, [watch_fd])
        look_again = min(look_again * 2, EXIT_LOOK_S[1])
        if on_wake is not None and on_wake(alive) and until_gone:
            break
        alive = current()
        now = time.monotonic()
        if watch_fd is not None or not alive or now >= next_walk:
            next_walk = now + PROC_WALK_EVERY_S
            targets.adopt_new()
            alive = current()
    return alive


def stuck_report(alive, doc):
    """Targets that did not end: after SIGKILL, or already in their exit (procfs.exiting: no
    SIGKILL is sent to those, it would change nothing). State D means stuck in a kernel call:
    the GPU driver's, or a dead mount's (health.py shows its wait channel)."""
    holders = {h["pid"]: h for h in doc.get("holders", [])}
    out = []
    for t in alive:
        stat = procfs.read_stat(t["pid"]) or {}
        h = holders.get(t["pid"], {})
        state = stat.get("state", "?")
        in_exit = procfs.exiting(t["pid"], t["start_time"])
        if state == "D":
            why = ("stuck in the kernel (state D, uninterruptible%s): a kill takes effect only when that call "
                   "returns (the GPU driver's, or a dead mount's); if it never does, the GPU needs a reset or the host "
                   "a reboot" % (", in its exit" if in_exit else ""))
        else:
            why = ("still in its exit (state %s)" if in_exit else "still alive after SIGKILL (state %s)") % state
        out.append({"pid": t["pid"], "state": state, "cmdline": t["cmdline"], "in_exit": in_exit,
                    "gpu_mib": h.get("gpu_mib") or t["gpu_mib"], "devices": h.get("devices") or t["devices"],
                    "why": why})
    return out


def _subscribe_watch():
    """The fork watch, subscribed before the scan (forkwatch.start walk=False); None when it
    cannot be had: the watch is an aid, /proc parentage still works without it."""
    try:
        return forkwatch.ForkWatch.start([], walk=False)
    except Exception:
        return None


def _begin_watch(watch, planned, procs):
    """The plan's targets as the watch's roots, and its first walk (`procs`: the scan's table);
    the watch, or None when it could not begin (closed: half a watch must not report)."""
    if watch is None:
        return None
    try:
        watch.begin([(t["pid"], t["start_time"]) for t in planned], listed=procs)
    except Exception:
        watch.close()
        return None
    return watch


def _plan_batch(settings, source, targets, batch, watch, timings, started, got, freezer):
    """The scan (its early batch sent from inside it), the plan, the fork watch's roots, and the
    plan's batch (_send_plan). Returns (doc, plan, planned, unapproved, {pid: target}, stops);
    `got["plan"]` is the plan as soon as it is built, for a caller whose later step failed."""
    sel = settings.selection
    doc = scan.collect(sel, source if settings.fake_gpus else gpuinfo.NoSource(), early=batch)
    query = plan.pending_query(sel)  # after the early signals; its commands never hold the plan's batch
    the_plan = got["plan"] = early.merge(plan.build(doc, sel, with_pending=False, pipes=batch.pipes,
                                                    keep_shm=settings.keep_shm), batch.rows)
    approved = batch.approved  # the operator's --approved (None: all of the plan)
    planned = [t for t in the_plan["targets"] if approved is None or (t["pid"], t["start_time"]) in approved]
    unapproved = [t for t in the_plan["targets"] if t not in planned]
    # a gone target the operator did not approve is not this teardown's, nor a supervisor of such
    # targets only: what they start (another job's launcher, say) is not watched as a respawn of
    # ours (a Slurm epilog's --approved teardown must never drain the node for another job's run)
    if approved is not None:
        the_plan["gone"] = [g for g in the_plan.get("gone", []) if (g["pid"], g["start_time"]) in approved]
        ours = planned + the_plan["gone"]
        mine = {t["pid"] for t in ours}
        # a starter related to none of the approved targets is another job's: left out; one the
        # operator did not see is named only (never frozen or ended)
        the_plan["starters"] = [s if s["fate"] == "watch" or (s["pid"], s["start_time"]) in approved
                                else dict(s, fate="watch", reason=s["reason"] + ", not in the approved plan")
                                for s in the_plan["starters"] if mine & set(s.get("wraps") or [])]
    timings["planned_s"] = _since(started)
    targets.chain = doc.chain | {os.getpid()}
    targets.watch = _begin_watch(watch, planned, doc.procs)
    freezer.settle_plan([s for s in the_plan["starters"] if s["fate"] in ("stop", "freeze")])  # before any SIGTERM
    by_pid, stops = _send_plan(targets, the_plan, planned, targets.audit, timings, started)
    stops += _stop_pending(the_plan, query, sel, approved, targets.audit)
    return doc, the_plan, planned, unapproved, by_pid, stops


def _stop_pending(the_plan, query, sel, approved, audit):
    """The restarts a manager has scheduled with no process yet (pending.py), once the query
    answers (after the plan's batch went out: a hung systemctl delays no signal): each added to
    the plan and stopped through its manager; with --approved named instead (exit 11), as no
    process the operator approved."""
    added = plan.add_pending(the_plan, query.get(), sel)
    if approved is not None:  # only those the operator saw in the plan (unit=NAME, container=ID)
        ok = {key: [u for u in added[key] if (key[:-1], u.get("unit") or u.get("id")) in approved]
              for key in ("units", "containers")}
        for key in ("units", "containers"):
            the_plan[key] = [u for u in the_plan[key] if not u.get("pending") or u in ok[key]]
        the_plan["pending_left"] = [u for key in ("units", "containers") for u in added[key] if u not in ok[key]]
        added = ok
    return _stop_units(dict(added, managers=[]), audit, {})

def _send_plan(targets, the_plan, planned, audit, timings, started):
    """The plan's batch: the manager stops of its units and containers, and SIGTERM to every
    planned target the early batch did not signal. Returns ({pid: target}, the stops)."""
    rest = targets.extend(planned)
    by_pid = {t["pid"]: t for t in planned}
    stops = _stop_units({key: [u for u in the_plan.get(key, []) if set(u["pids"]) & set(by_pid)]
                         for key in ("units", "containers", "managers")}, audit, by_pid)
    timings.setdefault("sigterm_s", _since(started))
    timings["plan_sigterm_s"] = _since(started)
    # a unit's or container's processes are its manager's to stop: a direct SIGTERM racing the
    # stop job makes Restart=always (or a docker restart policy) start it again
    targets.signal([t for t in rest if t.get("via", "signal") == "signal"], signal.SIGTERM, "SIGTERM")
    return by_pid, stops


def _early_batch(settings, audit, timings, started, source, freezer):
    """(Targets, early.Batch): the targets as yet none, and the scan's callback that adds and
    signals the early batch (agent/teardown/early.py). Only processes started after now are adopted
    (now, not this process's start: a respawn is what starts once the teardown has begun)."""
    since = procfs.ticks_now()
    sel = settings.selection
    targets = Targets([], audit, None, chain=early.own_chain(), protect=sel.protect, since_ticks=since,
                      scope_uid=sel.scope_uid)
    held: dict = {"shm": ([], [])}  # what the early batch's targets hold in /dev/shm, read before their signal
    def send(rows):
        _send_early(targets, rows, timings, started, source, lambda: _before_early(settings, held, freezer, rows))

    return targets, early.Batch(sel, settings.approved, send), held


def _before_early(settings, held, freezer, rows):
    """Before the early batch's signal: freeze what could start them again (freeze.py), and
    read what they hold in /dev/shm (shm.py: nothing says it once they are gone)."""
    freezer.freeze(early.starters(rows, settings.selection, settings.approved))
    if not settings.keep_shm:
        held["shm"] = shm.gather(rows)


def _send_early(targets, rows, timings, started, source, freeze_first):
    """The early batch (agent/teardown/early.py): SIGTERM, as soon as the scan has read every record;
    then the GPU source starts opening (NVML: ~0.13 s on an H200 host), while the scan reads
    the fd tables and maps. Opened only after the plan, it made "free at" wait for the plan
    plus NVML's opening (0.2 + 0.13 s on a host of 20,000 processes) rather than for the
    targets' exit alone."""
    targets.extend(rows)
    freeze_first()  # what could start them again starts nothing from here on (freeze.py)
    timings["sigterm_s"] = _since(started)
    timings["early_batch"] = len(rows)
    targets.signal(rows, signal.SIGTERM, "SIGTERM")
    try:
        source.start()
    except RuntimeError:  # no thread to be had now: execute() starts it after the plan
        return
    timings["source_start_s"] = _since(started)


class Recorder:
    """last.json writes that never stop a teardown: failures are kept and reported."""

    def __init__(self):
        self.errors = []

    def save(self, doc):
        try:
            lastrun.save(doc)
        except OSError as exc:
            self.errors.append("could not write last.json: %s" % exc)


def _since(started):
    return round(time.monotonic() - started, 3)


def _age_s():
    """Seconds since this process started (so: interpreter, bundle and imports are what
    `started` does not count). Clock-tick resolution (10 ms); None where it cannot be read."""
    try:
        ticks = procfs.read_stat(os.getpid())["start_time"]
        return round(time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / float(os.sysconf("SC_CLK_TCK")), 3)
    except (AttributeError, OSError, TypeError, ValueError):
        return None


def execute(settings, operator, started, source):
    """Lock held. `started`: when this agent began the teardown (monotonic); `source`: a
    gpuinfo.Opening. The plan needs no GPU source: every CUDA process holds and maps the
    device files, which the /proc scan finds by identity; NVML (0.1 s to import and init)
    is started after the SIGTERM batch and read first then: "before" is that read (the
    driver frees a target's memory only as it exits, 0.1 s and more later). The sandbox's
    fake source costs nothing and is read before the signals."""
    age, timings = _age_s(), {"lock_s": _since(started), "started_monotonic": round(started, 4)}
    timings["startup_s"] = None if age is None else round(age - timings["lock_s"], 3)
    record = {"started": time.strftime(defaults.TIME_FORMAT), "operator": operator, "state": "running",
              "host": socket.gethostname(), "exit_code": None, "agent": lastrun.agent_identity()}
    recorder = Recorder()
    watch = targets = freezer = None
    try:
        missing = [m for m in LATER if importlib.util.find_spec(m, __package__) is None]
        if missing:  # an incomplete agent must fail here, before any signal, not after them
            raise AgentIncomplete("the agent lacks module(s) %s (a broken bundle)"
                                  % ", ".join(m.lstrip(".").replace(".", "/") for m in missing))
        audit = Audit(operator)
        # every fork from here on is queued for the watch: the early batch's too
        freezer, watch = Freezer(audit), _subscribe_watch()
        targets, batch, held = _early_batch(settings, audit, timings, started, source, freezer)
        got: dict = {}  # what _plan_batch has made so far (the plan, once built)
        try:
            doc, the_plan, planned, unapproved, by_pid, stops = _plan_batch(settings, source, targets, batch, watch,
                                                                            timings, started, got, freezer)
        except Exception as exc:
            if not batch.rows and not targets.term_at:
                raise  # nothing was signalled: the error is the answer, as before any signal
            # signals went out (the early batch, maybe more): see them through and record them
            record.update(plan=got.get("plan") or early.as_plan(batch.rows, settings.selection), before=[],
                          unapproved=[])
            return unverified(settings, targets, started, record, recorder, audit, timings, {}, exc)
        watch = targets.watch
        recorder.errors.extend([batch.error] if batch.error else [])
        source.start()  # started already when an early batch went out
        timings.setdefault("source_start_s", _since(started))
        # What runs only after the signals is imported only now, while the driver releases the
        # targets' memory (0.3 s and more): health, Xid, MPS, MIG, the settle window, the verdict.
        try:
            from ..gpu import checkup
            from . import settle, verify
        except Exception as exc:  # present (checked before the signals) but not loadable here: see unverified()
            record.update(plan=the_plan, before=doc["gpus"], unapproved=unapproved)
            return unverified(settings, targets, started, record, recorder, audit, timings, doc, exc)

        before_gpus = doc["gpus"] if settings.fake_gpus else _read_gpus(source)
        timings["before_read_s"] = _since(started)
        doc["gpu_source_tried"] = source.tried
        health_start = checkup.teardown_start(source)  # Xids from here on count (checkup.py)
        # Right after the batch, not before it: nothing here changes what is signalled.
        record.update(plan=the_plan, before=before_gpus, unapproved=unapproved,
                      concurrent_teardowns=hostlock.concurrent_teardowns(doc.procs))
        recorder.save(record)
        settings.progress(phase="sigterm", elapsed_s=round(time.monotonic() - started, 2),
                          alive=[t["pid"] for t in planned], mib_left=_mib_left(source))
        unended, mps_quit, result = _stop_and_watch(settings, targets, source, started, timings, (stops, audit, by_pid),
                                                    freezer, (doc, the_plan, planned), (settle, checkup))
        after, free, problems = result["doc"], result["free"], result["problems"]
        aside = {(e["pid"], e["start_time"]) for e in result["exiting_without_gpu"]}  # exiting, no GPU: not stuck
        alive = [t for t in targets.alive() if (t["pid"], t["start_time"]) not in aside]
        code, starters, problems = _verdict(result, unended, after, settings.selection.max_used_mib, verify, freezer,
                                            the_plan.get("pending_left", []))
        if targets.failed:
            code = codes.EXIT_NOT_FREE
        timings.update(free_at_s=result["free_at_s"], settled_at_s=result["settled_at_s"],
                       scans=result.get("scans"), source_open_s=getattr(source, "open_s", None),
                       **result.get("first_free", {}))
        fields = dict(problems=problems, after=after["gpus"], actions=audit.records, stuck=stuck_report(alive, after),
                      still_holding=[] if free else verify.still_holding(after),
                      freed_mib=_freed(gpuinfo.total_used_mib(before_gpus), gpuinfo.total_used_mib(after["gpus"])),
                      signalled=sum(1 for a in audit.records
                                    if a["result"] == "sent" and a["signal"].startswith("SIG")),
                      signal_failures=targets.failed, adopted=targets.added, appeared=result["appeared"],
                      ignored=result["ignored"], settle_ended=result["settle_ended"],
                      free_at_s=result["free_at_s"], settled_at_s=result["settled_at_s"], settle_s=result["window_s"],
                      shm_removed=_remove_shm(settings, code, the_plan, held["shm"], targets, audit),
                      concurrent_teardowns=_merge(record["concurrent_teardowns"],
                                                  hostlock.concurrent_teardowns(after.procs)))
        ended = scan.public(after)  # the scan's document as it ended, before the health pass adds to it
        code = checkup.teardown_result(fields, after, source, health_start, code)  # health: after, stuck, mps
        fields["mps_quit"] = mps_quit
        record.update(state="finished", verdict=("free, starter alive" if starters else "free") if free else "not free",
                      starters_alive=starters, exiting_without_gpu=result["exiting_without_gpu"],
                      left_alone_only=result["left_alone_only"], uninspected=len(after.get("denied") or []),
                      fork_watch=getattr(watch, "mode", "proc"), fork_watch_note=getattr(watch, "note", "no watch"),
                      timings=timings, finished=time.strftime(defaults.TIME_FORMAT))
        out = _result(code, ended, record, fields, started)
        recorder.save(out)
        out["record_errors"] = recorder.errors + list(getattr(audit, "write_errors", []))
        return code, out
    finally:
        if freezer is not None:
            freezer.thaw()  # a failure half-way never leaves a process frozen
        if targets is not None:
            targets.close()
        if watch is not None:
            watch.close()


def _remove_shm(settings, code, the_plan, early_held, targets, audit):
    """FREED: the shared memory the targets left (shm.py), the early batch's and the plan's,
    removed and logged; [] with --keep-shm or another verdict (a live target may still use it)."""
    if settings.keep_shm or code != codes.EXIT_OK:
        return []
    stopped = {(t["pid"], t["start_time"]) for t in targets.items + targets.added}  # signalled: not unapproved ones
    files = [r for r in shm.merge(early_held[0], the_plan.get("shm", []))
             if r["kind"] == "file" and (r["pid"], r["start_time"]) in stopped]
    owners = [o for o in shm.merge(early_held[1], the_plan.get("shm_owners", []))
              if (o["pid"], o["start_time"]) in stopped]
    return shm.remove(files, owners, audit)  # segments: read again now (their last user is the target's exit)


def _stop_and_watch(settings, targets, source, started, timings, units_stop, freezer, planned_doc, modules):
    """From the first SIGTERM to the verdict's window: the grace, SIGKILL, the exits; then the
    job's own starters (frozen since before the first SIGTERM) ended, MPS, and the settle
    window. Returns (starters that outlived their end, MPS quits, the window's result)."""
    stops, audit, by_pid = units_stop
    doc, the_plan, planned = planned_doc
    settle, checkup = modules
    exit_wait = _until_exited(settings, targets, source, started, timings,
                              on_wake=lambda _alive: _finish_units(stops, audit, by_pid, targets=targets),
                              units_done=lambda alive: _finish_units(stops, audit, by_pid,
                                                                     wait_s=1.0 if not alive else 0.0))
    unended = freezer.end([s for s in the_plan["starters"] if s["fate"] == "stop"], settings.grace)
    freezer.interrupt([s for s in the_plan["starters"] if s.get("foreground")], targets.since_ticks)
    # clients gone: the MPS daemon next
    mps_quit = (checkup.mps_quit(settings.selection, audit, source,
                                 rescan=lambda: scan.collect(settings.selection, source))
                if settings.mps == "quit" else [])
    result = _watch_window(settings, source, targets, started, doc, the_plan, planned, settle,
                           timeout_s=max(0.0, settings.timeout - (time.monotonic() - exit_wait)))
    return unended, mps_quit, result


def _verdict(result, unended, after, max_used_mib, verify, freezer, pending_left=()):
    """Thaw what is still frozen (it runs again as it was, and is named), then (code, live
    starters, problem lines) of the window's result: FREED (0) only when no
    related starter lives, the middle verdict (11) when the GPUs are free but one does (each
    named with its stop), else verify's code (not free)."""
    freezer.thaw()
    problems = result["problems"]
    starters = result["starters_alive"] + [
        dict(u, why="is one of the job's own launchers and outlived SIGKILL", include="look at its state (D: stuck)")
        for u in unended if not any(s["pid"] == u["pid"] for s in result["starters_alive"])]
    if not result["free"]:
        return verify.exit_code(after, False, max_used_mib), starters, problems
    problems = problems + ["%s %s: %s; not in the approved plan, so not stopped: %s" % (
        "unit" if "unit" in p else "container", p.get("unit") or p.get("name"), p["pending"],
        " ".join(units.stop_argv(p))) for p in pending_left]
    if not starters and not pending_left:
        return codes.EXIT_OK, starters, problems
    return codes.EXIT_STARTER_ALIVE, starters, problems + [
        "pid %d (%s) %s; stop it: %s" % (r["pid"], r["cmdline"][:80], r["why"], r["include"]) for r in starters]


def _until_exited(settings, targets, source, started, timings, on_wake, units_done):
    """The grace, SIGKILL for what outlives it, then the exit itself, on the pidfds: no signal
    speeds it, and free needs it (NVML lists a process until its exit has ended; a process
    stuck in its exit may still hold a GPU open with its fds no longer visible). A target that
    runs after all (one procfs.exiting could not see for what it is) gets SIGKILL here once its
    grace is over. Returns when the exit wait began (the window's --timeout counts from it)."""
    progress = settings.progress
    alive = wait_gone(progress, targets, settings.grace, source, started, "grace", on_wake=on_wake)
    units_done(alive)
    if alive:
        targets.signal(alive, signal.SIGKILL, "SIGKILL")
        alive = wait_gone(progress, targets, min(5.0, settings.timeout), source, started, "sigkill", among=alive)
    timings["targets_exiting_s"] = None if alive else _since(started)
    exit_wait = time.monotonic()
    if not alive:
        def exit_wake(left):
            targets.escalate(settings.grace, among=targets.items)
            return _released(source, left, settings.selection.max_used_mib)

        wait_gone(progress, targets, settings.timeout, source, started, "exit", until_gone=True, on_wake=exit_wake)
    timings["targets_gone_s"] = None if targets.alive(targets.items + targets.added) else _since(started)
    return exit_wait


def _released(source, left, max_used_mib):
    """May the wait for these targets' exit end before it has? Yes when each is in its exit
    (it runs no code: it cannot take a GPU again) and the GPU source, one that lists the GPUs'
    processes (NVML), reads every GPU free with no process on it: a server unpinning a large
    host-memory pool spends seconds in its exit after that (settle._pending sets it aside and
    names it). Never with a source that lists no processes (nvidia-smi's costs a process per
    read, the sandbox's none)."""
    if getattr(source, "name", None) != "nvml" or gpuinfo.reads_free(source, max_used_mib) is not True:
        return False
    return all(procfs.exiting(t["pid"], t["start_time"]) for t in left)


def _watch_window(settings, source, targets, started, doc, the_plan, planned, settle, timeout_s):
    """The settle window (settle.watch), with the progress lines an operator sees: FREED at the
    moment the GPUs read free, then what is still waited on. `settle`: the module, imported by
    the caller only after the signals."""
    def on_free(free_at_s, window_s):
        settings.progress(phase="free", elapsed_s=free_at_s, free_at_s=free_at_s, settle_s=window_s, mib_left=0)

    def on_poll(d, problems):
        settings.progress(phase="verify", elapsed_s=round(time.monotonic() - started, 2), problems=problems[:5],
                          mib_left=gpuinfo.total_used_mib(d["gpus"]))

    # the targets that exited before the plan was made (plan's `gone`) are not signalled, but
    # what started them may start them again: their ancestry is watched as the others'
    lineage = settle.Lineage(doc, planned + the_plan.get("gone", []),
                             stopped={settle.manager_key(t) for t in planned if t.get("via", "signal") != "signal"},
                             starters=the_plan["starters"], patterns=the_plan["patterns"],
                             stops=the_plan.get("managers", []), unseen=the_plan.get("unseen", []))
    before = {(h["pid"], h["start_time"]) for h in doc["holders"]}
    window = settle.Window(settings.settle, settings.settle_auto, settings.grace, timeout_s)
    return settle.watch(settings.selection, window, source, targets, started, before, on_poll=on_poll, on_free=on_free,
                        lineage=lineage)


def unverified(settings, targets, started, record, recorder, audit, timings, doc, exc):
    """The signals went out but what follows them could not be loaded (a syntax this host's
    Python lacks, no memory): still see the targets through (grace, SIGKILL for what outlives
    it), then record and answer "not verified" (exit 3) instead of dying with the targets
    half-signalled and no record."""
    alive = wait_gone(settings.progress, targets, settings.grace, None, started, "grace")
    if alive:
        targets.signal(alive, signal.SIGKILL, "SIGKILL")
        alive = wait_gone(settings.progress, targets, min(5.0, settings.timeout), None, started, "sigkill", among=alive)
    timings["targets_exiting_s"] = None if alive else _since(started)
    error = "the agent could not load what checks the GPUs after the signals (%s: %s)" % (type(exc).__name__, exc)
    record.update(state="finished", verdict="not verified", still_alive=[t["pid"] for t in alive], timings=timings,
                  finished=time.strftime(defaults.TIME_FORMAT))
    out = _result(codes.EXIT_UNREACHABLE, doc, record,
                  dict(error=error, problems=[error], actions=audit.records, after=[]), started)
    recorder.save(out)
    return codes.EXIT_UNREACHABLE, out


def _merge(first, later):
    """Other users' teardowns seen at the start or the end (one that began meanwhile counts)."""
    seen = {c["pid"] for c in first}
    return first + [c for c in later if c["pid"] not in seen]


def _result(code, scan_doc, record, fields, started):
    """The result of a teardown that ran, built through its record (records.TeardownResult):
    `fields`, named as the record names them; the scan it ended on and the host's record
    (last.json: who, when, the plan, the GPUs before) give the others it names; and beside
    them what only a person or the host reads (the running record's state and timings, the
    scan's counts), kept as they are."""
    more = dict(scan_doc)
    more.update(record)
    return records.written(records.TeardownResult, more, code=code, wall_s=round(time.monotonic() - started, 3),
                           **fields)


def _not_started(exc):
    """(code, result) of a teardown that signalled nothing: another holds the lock (exit 4,
    `error` says who), or the state directory, the lock file or the agent itself is unusable
    (exit 3, `state_error`)."""
    if isinstance(exc, hostlock.Locked):
        return codes.EXIT_LOCKED, records.written(records.TeardownResult, {"holder": exc.holder},
                                                  code=codes.EXIT_LOCKED, locked=True, error=str(exc),
                                                  hostname=socket.gethostname())
    return codes.EXIT_UNREACHABLE, records.written(records.TeardownResult,
                                                   {"verdict": "not started: nothing was signalled"},
                                                   code=codes.EXIT_UNREACHABLE, state_error=str(exc), error=str(exc),
                                                   hostname=socket.gethostname())


def _declared_stops(texts):
    """The running phases' checkpoint stops the call declares (--checkpoint-stop: checkpoint.py),
    checked; [] and nothing imported without one."""
    if not texts:
        return []
    from . import checkpoint

    return checkpoint.declared(texts)


def _checkpoint_first(settings, operator, stops):
    """Lock held, before the scan: each running phase's signal and its wait for a checkpoint
    (checkpoint.py). Returns (outcomes, their audit)."""
    from . import checkpoint

    audit = Audit(operator)
    return checkpoint.run(stops, audit, settings.progress, settings.selection, settings.approved), audit


def _with_checkpoint(out, outcomes, audit):
    """The teardown's result with the checkpoint stops that came first: outcomes, audit records."""
    out["checkpoint_stops"] = outcomes
    out["actions"] = audit.records + list(out.get("actions") or [])
    out["record_errors"] = list(out.get("record_errors") or []) + list(audit.write_errors)
    return out


def run(opts: Options):
    signal.signal(signal.SIGHUP, signal.SIG_IGN)   # the ssh session may drop: finish anyway
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # a Ctrl-C on the operator's side: finish anyway
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # writes to a dead pipe fail quietly instead
    if opts.operator:
        operator = opts.operator
    else:
        import getpass  # the CLI always names the operator; a direct run may not

        operator = "%s@%s" % (getpass.getuser(), socket.gethostname())
    opts.device_set()  # a bad device glob is bad input: exit 2 before anything
    approved = parse_approved(opts.approved)
    hold.check_hold_flags(opts.hold_s, opts.hold_phase, opts.hold_token)
    # its waits (grace, timeout, settle, wait-lock) are checked with every subcommand's (options.check_values)
    stops = _declared_stops(opts.checkpoint_stop)  # a bad one is bad input: exit 2 before anything
    settings = Settings(selection=opts.selection, fake_gpus=opts.fake_gpus, approved=approved, grace=opts.grace,
                        timeout=opts.timeout, mps=opts.mps, keep_shm=opts.keep_shm, settle=opts.settle,
                        settle_auto=opts.settle_auto, progress=opts.emit_progress)
    started = time.monotonic()
    source = gpuinfo.Opening(opts.fake_gpus, opts.devices, start=False)  # started after the signals
    try:
        try:
            lastrun.preflight()
        except OSError as exc:
            return _not_started(exc)
        try:
            fd = hostlock.acquire(operator, opts.wait_lock)
        except (hostlock.Locked, OSError) as exc:  # the lock file itself refused (a link, not ours): as a state dir
            return _not_started(exc)
        try:
            first = _checkpoint_first(settings, operator, stops) if stops else None
            code, doc = execute(settings, operator, time.monotonic() if stops else started, source)  # after the wait
            if first is not None:
                doc = _with_checkpoint(doc, *first)
            if code == codes.EXIT_OK and opts.hold_s:  # FREED: the lock stays the pivot's until its phase is ready
                doc["hold"] = hold.hand_over(fd, opts.hold_s, opts.hold_phase, opts.hold_token, operator)
                fd = None
            return code, doc
        except AgentIncomplete as exc:  # as an unusable state dir: not started, nothing signalled
            return _not_started(exc)
        finally:
            if fd is not None:
                hostlock.release(fd)
    finally:
        source.close()
