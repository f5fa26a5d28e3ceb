"""After the targets are gone: wait for the GPUs to read free, then answer one question:
can anything bring the targets back?

Why a settle window: a supervisor (`while true; do python3 -m sglang.launch_server; done`, a
Restart=always unit we could not stop through systemd) restarts the server 0.1 s after the
last target exits, and a check made at that instant says "FREED" while the GPU is being
taken again. So the GPUs are watched for a window (default 2 s) after they first read free.

The whole account: docs/design-notes.md (scripts/agent/teardown/settle.py)."""
import collections
import os
import time

from ..gpu import gpuinfo
from ..holders import scan
from ..policy import managers, program, relation, rules, wrappers
from ..procs import cgroup, procfs, procscan
from . import plan, verify

PROGRESS_EVERY_S = 0.5
FAST_WAIT_MAX_S = 0.2
IGNORED_KEPT = 20  # the seen-and-ignored list is for people: the first few say what happened


def reusable_records(lineage, since_ticks):
    """The plan's records a confirming scan may keep when the process looks the same (start
    time, name, parent, group, session, flags, where its argv begins): never one started
    during the teardown, a starter or a starter's other descendant. An exec moves arg_start,
    but /proc shows it as 0 where the reader may not trace the process, and then an exec under
    the same name (`python3 launcher.py` becoming `python3 -m server`) would look the same.
    Those are few; they are read whole on every scan."""
    return {pid: rec for pid, rec in lineage.procs.items() if rec["start_time"] < since_ticks
            and (pid, rec["start_time"]) not in lineage.starters and (pid, rec["start_time"]) not in lineage.near}


def _parent_text(procs, pid):
    info = procs.get(pid)
    if info is None:
        return "PID %s (gone)" % pid
    return "PID %d: %s" % (pid, info["cmdline"][:100])


class Lineage:
    """What could start the targets again, taken from the plan's scan before any signal:
    `starters` {(pid, start): cmdline}, the targets' ancestors up to their session leader (a
    shell loop, a wrapper, a terminal's shell; not PID 1, not this agent's chain, not a
    target), past a session leader that is itself a wrapper, plus every starter the plan
    related to them (relation.py: leaders, group members); and `managers` {owner key: hint},
    the units and containers the targets ran in. `related`: the plan's starter rows, by key,
    each with its fate. `stopped`: owner keys whose stop was run. `procs`: the plan's records
    (the confirming scans read again only what changed since: procscan.snapshot's `known`).
    `near`: the starters' other descendants, not targets (a watcher subshell beside the server
    that starts it again): what they start counts as the starter's."""

    def __init__(self, doc, planned, stopped=(), starters=(), patterns=(), stops=(), unseen=()):
        procs, chain = doc.procs, doc.chain | {os.getpid()}
        self.procs = procs
        # plan["managers"]: the other managers' stops, run or named only (`run` False: the
        # targets they run were not signalled, and while they live the GPUs are not freed)
        self.named = [m for m in stops if not m.get("run")]
        self.by_daemon = {m["daemon_pid"]: m for m in stops if m.get("daemon_pid")}
        mine = {t["pid"] for t in planned}
        self.related = {(s["pid"], s["start_time"]): s for s in starters}
        self.starters: dict = {k: s["cmdline"] for k, s in self.related.items()}
        self.managers: dict = {}
        mine_keys = {(t["pid"], t["start_time"]) for t in planned}
        self.unseen = [u for u in unseen if (u["pid"], u["start_time"]) in mine_keys]  # started from out of sight
        self.identities = plan.target_identities(
            planned, patterns, lambda t: t.get("devices") or any((t.get("gpu_mib") or {}).values()))
        for t in planned:
            self.starters.update(_ancestry(t["ppid"], procs, chain, mine))
            self.starters.update(_session_of_orphan(t, procs, chain, mine))
            key = manager_key(t)
            if key is not None and t.get("manager"):
                self.managers[key] = t["manager"]["stop_command"] or _manager_words(key)
            elif key is not None:
                managed = t.get("via", "signal") != "signal"
                self.managers[key] = plan.supervisor_hint(t) if managed else (
                    "%s runs other processes too, so it is not stopped: stop what starts the server there"
                    % _manager_words(key))
        self.stopped = set(stopped)
        self.near = _descendants(self.starters, procs, chain, mine)

    def surviving(self):
        """The starters still alive and not frozen (a frozen one starts nothing until it is
        thawed, after the verdict), what they started beside the targets (a watcher subshell),
        and the managers not stopped: what could restart a target within the window."""
        alive = [(k, cmd) for k, cmd in list(self.starters.items()) + list(self.near.items())
                 if procfs.same_process(*k) and self.related.get(k, {}).get("fate") != "freeze"]
        return alive, {k: v for k, v in self.managers.items() if k not in self.stopped}

    def live_starters(self, since_ticks, procs_now=None):
        """[{pid, start_time, cmdline, role, why, include}] of the related starters that could
        still start a target, by kernel facts alone (relation.py): a frozen one that is alive
        (thawed after the verdict), one of the job's own that could not be ended, an
        interactive shell that is neither idle at its prompt nor busy with its own older
        foreground job, one outside the scope; and the targets whose parent lies outside this
        agent's PID namespace (what started them cannot be seen)."""
        out = []
        for k, s in self.related.items():
            if not procfs.same_process(*k):
                continue
            why = None
            now = procscan.basic(k[0]) if s["fate"] == "stop" else None
            if now is not None and relation.role(now) == "terminal":  # exec'd someone's shell (`...; exec bash`)
                s = dict(s, role="terminal")
                if relation.terminal_state(s, since_ticks, procs_now) not in ("running", "unknown"):
                    continue
                why = "became an interactive shell that runs something new in its terminal: it may start the server"
            elif s["fate"] == "stop":
                why = "is one of the job's own launchers, and could not be ended"
            elif s["fate"] == "freeze":
                why = ("is %s, related to target(s) %s (%s): it may start one again; it was frozen during the stop "
                       "and is running again" % (_role_words(s), _joined(s.get("wraps") or []), s["reason"]))
            elif s.get("role") == "terminal":
                state = relation.terminal_state(s, since_ticks, procs_now)
                if state in ("running", "unknown"):
                    why = ("is an interactive shell that %s: a loop typed at its prompt may start the server again"
                           % ("runs something new in its terminal's foreground" if state == "running"
                              else "could not be seen at its prompt"))
            else:
                why = "is related to target(s) %s (%s), outside what this teardown may signal" % (
                    _joined(s.get("wraps") or []), s["reason"])
            if why:
                out.append({"pid": k[0], "start_time": k[1], "cmdline": s["cmdline"], "role": s.get("role"),
                            "why": why, "include": s.get("hint") or self.hint(self.procs.get(k[0], s))})
        for t in self.unseen:
            out.append({"pid": t["pid"], "start_time": t["start_time"], "cmdline": t.get("cmdline", ""),
                        "role": "unseen", "include": "look from the host or the container's node "
                                                     "(runbooks/starter-alive-after-teardown.md)",
                        "why": "was a target, and %s: what started it, and may start it again, cannot be seen "
                               "from here" % t["why"]})
        return out

    def named_left(self):
        """[(pid, the stop's problem line)] of the named-only managers' programs still alive: not
        signalled (their manager would start them again, or is their owner's to stop), so the
        GPUs are not freed while they run, whatever the GPUs read."""
        out = []
        for m in self.named:
            alive = [p for p in m["pids"] if p in self.procs and procfs.same_process(p, self.procs[p]["start_time"])]
            if alive:
                out.append((alive[0], "pid %s (%s %s) was not signalled: %s; stop it: %s" % (
                    _joined(alive), m["kind"], m["name"], m["why"], stop_words(m))))
        return out

    def hint(self, starter):
        """What stops a starter, exactly that process: the plan's own hint for a related one,
        its unit's, container's or manager's stop for one a manager runs, else a line that ends
        its pid while its start time is still its own."""
        k = (starter["pid"], starter["start_time"])
        if k in self.related and self.related[k].get("hint"):
            return self.related[k]["hint"]
        owned = _owned(starter)
        if starter["pid"] == 1:
            return plan.pid1_hint()
        if manager_key(owned) is not None:
            return plan.supervisor_hint(owned)
        if managers.is_manager_daemon(starter):  # a manager's daemon: its program is stopped through it
            stop = self.by_daemon.get(starter["pid"])
            if stop is not None and stop["command"]:
                return "%s (%s %s; PID %d is its daemon, never signalled)" % (
                    stop["command"], stop["kind"], stop["name"], starter["pid"])
            return ("stop the program through its manager, %s (PID %d: %s), with that manager's own stop command; "
                    "its daemon is never signalled" % (managers.daemon_name(starter), starter["pid"],
                                                       starter["cmdline"][:60]))
        return plan.starter_hint(dict(starter, role=relation.role(starter)), self.procs)


def _role_words(s):
    return {"launcher": "a launcher", "shell": "a shell running code", "starter": "a program that starts others",
            "unknown": "a process whose program cannot be read"}.get(s.get("role"), "a process")


def stop_words(stop):
    """The exact command that stops a named-only manager's program, with what comes first
    (`kubectl cordon NODE` for a pod), or what to ask when none can be printed."""
    if not stop.get("command"):
        return "ask %s which program it is (no command could be read: see why)" % stop["kind"]
    if stop.get("first"):
        return "`%s` first, then `%s`" % (stop["first"], stop["command"])
    return "`%s`" % stop["command"]


def _joined(pids):
    return ", ".join(map(str, pids[:8])) + (", ..." if len(pids) > 8 else "")


def _descendants(roots, procs, chain, mine):
    """{(pid, start): cmdline} of every process below `roots` in the plan's scan, but targets
    and this agent's chain (and what is below them); a child that started before its parent
    (a reused pid) is no descendant."""
    kids = procscan.children_map(procs)
    out: dict = {}
    todo = [(pid, start) for pid, start in roots]
    while todo:
        pid, start = todo.pop()
        for child in (procs[c] for c in kids.get(pid, ())):
            k = (child["pid"], child["start_time"])
            if child["start_time"] < start or k in out or k in roots or child["pid"] in mine or child["pid"] in chain:
                continue
            out[k] = child["cmdline"]
            todo.append(k)
    return out


def _session_of_orphan(t, procs, chain, mine):
    """{(pid, start): cmdline} of the session leader of a target left to PID 1 (`( server & )`
    in a watchdog's loop keeps the watchdog's session): what started the session started it."""
    if t["ppid"] not in (0, 1):
        return {}
    leader = procs.get(t.get("sid") or procs.get(t["pid"], {}).get("sid"))
    if leader is None or leader["pid"] in (0, 1) or leader["pid"] in chain or leader["pid"] in mine \
            or leader["start_time"] > t["start_time"]:
        return {}
    return {(leader["pid"], leader["start_time"]): leader["cmdline"]}


def _ancestry(pid, procs, chain, mine):
    """{(pid, start): cmdline} from `pid` up (wrappers.ancestry: through launchers, to the
    session leader a wrapper did not start), but targets."""
    return {(p, procs[p]["start_time"]): procs[p]["cmdline"] for p in wrappers.ancestry(pid, procs, chain)
            if p not in mine}


MANAGED_CONTAINERS = ("docker", "lxc", "kubernetes", "podman", "cri-containerd", "crio", "nerdctl")


def manager_key(info):
    """plan.owner_key, for the owners that start processes by themselves: another manager the
    plan found running it (supervisord, runit, podman...: ("manager", kind, name)), a service
    unit (not a login session's scope or a user's manager) or a container."""
    if info.get("manager"):
        return "manager", info["manager"]["kind"], info["manager"]["name"]
    container = info.get("container")
    if container and container.get("kind") in MANAGED_CONTAINERS:
        return plan.owner_key(info)
    return info.get("unit") if plan.stoppable_unit(info.get("unit")) else None


def _starter(info, procs, since_ticks):
    """The first process in `info`'s ancestry that was not started during the teardown."""
    seen = set()
    while info is not None and info["start_time"] >= since_ticks and info["pid"] not in seen:
        seen.add(info["pid"])
        info = procs.get(info["ppid"])
    return info


def _classify(doc, targets, sel, patterns, lineage, known):
    """({key: respawn record}, {key: ignored record}) for processes started during the
    teardown that are not ours: few, usually none."""
    procs = doc.procs
    context = {h["pid"] for h in doc["holders"]
               if h["gpu_mib"] or (not h["protected"] and not doc.get("context_source"))}
    respawns, ignored = {}, {}
    for pid, info in procs.items():
        k = (pid, info["start_time"])
        if info["start_time"] < targets.since_ticks or k in known or k in targets.keys or procfs.finished(info):
            continue
        if not plan.in_scope(info, sel) or rules.protect_reason(info, doc.chain, sel.protect):
            continue
        what = _what(info, patterns, lineage, pid in context)
        if not what:
            if any(h["pid"] == pid for h in doc["holders"]):
                ignored[k] = _ignored(info, "holds GPU device files, no CUDA context and no target program "
                                            "(a monitor or an NVML query)")
            continue
        by = _respawned_by(info, procs, targets.since_ticks, lineage, what)
        if by is None:
            ignored[k] = _ignored(info, "%s, but was not started by anything that started the targets "
                                        "(an unrelated job)" % what)
            continue
        started_by, hint = by
        respawns[k] = _respawn(info, what, doc["holders"], pid in context, started_by, hint)
    for k, what, before in _exec_in_place(procs, sel, patterns, lineage, known, doc.chain, context):
        info = procs[k[0]]
        respawns[k] = _respawn(info, what, doc["holders"], k[0] in context,
                               "itself: it ran `%s` and exec'd a target program in place (bash runs a -c "
                               "string's last command that way)" % before[:80],
                               "it is the server now (PID %d): run the teardown again, which stops it" % k[0])
    return respawns, ignored


def _what(info, patterns, lineage, context):
    """Why a process started during the teardown may be a target started again, or None: a
    target pattern names it, it has a CUDA context, or it runs a program that a target a
    pattern named or that held a GPU ran (not a helper of a target's tree, not a package)."""
    return rules.target_reason(info, patterns) or (context and "has a CUDA context") or (
        program.identity(info) & lineage.identities and "runs the same program as a target")


def _respawn(info, what, holders, context, started_by, hint):
    """The record of one respawn: what it runs, the devices it holds (from the scan's
    holders), who started it and what would stop that."""
    held: list = next((h["devices"] for h in holders if h["pid"] == info["pid"]), [])
    return {"pid": info["pid"], "start_time": info["start_time"], "cmdline": info["cmdline"], "devices": held,
            "ppid": info["ppid"], "started_by": started_by, "include": hint,
            "why": "a target started again during the teardown (%s), %s; started by %s"
                   % (what, "holding a GPU" if held or context else "not holding a GPU yet", started_by)}


def _exec_in_place(procs, sel, patterns, lineage, known, chain, context):
    """[((pid, start), why, the command line it ran)] of the surviving starters (and their
    other descendants) that exec'd a target program: a process keeps its pid and start time
    across exec, so `bash -c "SERVER; SERVER"` becomes the second server in place, and a
    standby that execs the server is no new process either. A title rewritten in place
    (setproctitle) is no exec: the argv area, where stat's arg_start says it begins, stays
    where it was in the plan's scan."""
    out = []
    for k, cmdline in list(lineage.starters.items()) + list(lineage.near.items()):
        info, then = procs.get(k[0]), lineage.procs.get(k[0], {})
        if (info is None or info["start_time"] != k[1] or info["cmdline"] == cmdline or k in known
                or info.get("arg_start") == then.get("arg_start") or procfs.finished(info)
                or not plan.in_scope(info, sel) or rules.protect_reason(info, chain, sel.protect)):
            continue
        what = _what(info, patterns, lineage, k[0] in context)
        if what:
            out.append((k, what, cmdline))
    return out


def _respawned_by(info, procs, since_ticks, lineage, what):
    """(who started it, what stops that) when `info` was started by a survivor of the
    targets' ancestry or by a target's unit or container manager, or - a target by program
    identity - by something that left at once (a watchdog's double fork: `( server & )`
    reparents it to PID 1); else None."""
    m = managers.manager_of(info, procs)
    key = ("manager", m["kind"], m["name"]) if m else None
    if key in lineage.managers:  # one of the targets' managers started it again, stopped or not
        return "its %s" % _manager_words(key), lineage.managers[key]
    starter = _starter(info, procs, since_ticks)
    if starter is not None:
        k = (starter["pid"], starter["start_time"])
        if k in lineage.starters or k in lineage.near:
            return _parent_text(procs, k[0]), lineage.hint(starter)
    key = manager_key(_owned(info))
    if key is not None and key in lineage.managers and key not in lineage.stopped:  # a stop job's own ExecStop
        return "its %s" % _manager_words(key), lineage.managers[key]
    if (starter is None or starter["pid"] == 1) and what != "has a CUDA context":
        if (1, procs.get(1, {}).get("start_time")) in lineage.related and (starter is None or info["ppid"] == 1):
            return "PID 1: %s" % procs[1]["cmdline"][:100], plan.pid1_hint()
        return ("a process that left at once (it was reparented to PID 1: a double fork, as a watchdog does)",
                "find what starts it: nothing the teardown saw does")
    return None


def _owned(info):
    """The process with its unit and container, as manager_key and plan.supervisor_hint read them."""
    cg = cgroup.read(info["pid"])
    return dict(info, unit=cg["unit"], container=cgroup.with_pids(cg["container"], info["pid"]))


def _manager_words(key):
    if isinstance(key, tuple) and key[0] == "manager":
        return "%s %s" % (key[1], key[2])
    if isinstance(key, tuple):
        return "unit %s in container %s" % (key[2], key[1])
    return ("container %s" % key[:12]) if len(key) == 64 and "." not in key else "unit %s" % key


def _ignored(info, why):
    return {"pid": info["pid"], "cmdline": info["cmdline"][:200], "why": why}


# The settle window's flags: `seconds` (--settle, or the default), `auto` (no --settle given:
# the window may end at once), `grace` (SIGTERM to SIGKILL), `timeout` (the teardown's).
Window = collections.namedtuple("Window", "seconds auto grace timeout")


class _Seen:
    """What one settle window has seen: the respawns, the processes it set aside, and the
    first free stretch's steps (for the teardown's timings)."""

    def __init__(self, sel, window, targets, lineage, before):
        self.sel, self.window_flags, self.targets = sel, window, targets
        self.lineage, self.before = lineage, set(before)
        self.patterns = plan.patterns_of(sel)
        self.known = reusable_records(lineage, targets.since_ticks)
        self.respawned: dict = {}
        self.ignored: dict = {}
        self.first_free: dict = {}
        self.first_respawn = None
        self.scans = 0

    def look(self, source):
        """One scan: adopt what targets forked, SIGKILL what outlived its grace, classify what
        started meanwhile, and evaluate. Returns (doc, free, problems, new respawns)."""
        sel, targets, grace = self.sel, self.targets, self.window_flags.grace
        doc = scan.collect(sel, source, confirm=True, known=self.known)
        self.scans += 1
        targets.adopt_new(doc.procs)
        targets.escalate(min(grace, 2.0))
        targets.escalate(grace, among=targets.items)  # one that runs after all (wait_gone's exit wait)
        new, seen = _classify(doc, targets, sel, self.patterns, self.lineage, set(self.respawned) | self.before)
        self.respawned.update(new)
        for k, rec in seen.items():  # looked at again each scan: a process set aside may turn out a respawn
            if k in self.ignored or len(self.ignored) < IGNORED_KEPT:
                self.ignored[k] = rec
        for k in new:
            self.ignored.pop(k, None)
        if new:
            self.first_respawn = self.first_respawn or time.monotonic()
        free, problems = verify.evaluate(doc, sel.max_used_mib)
        if targets.failed:
            free = False
            problems = problems + ["could not signal pid %s (%s: %s); it was not stopped"
                                   % (f["pid"], f["signal"], f["result"]) for f in targets.failed]
        return doc, free, problems, new

    def window(self, doc):
        """(seconds to watch once free, why it ends at once or None): none when the agent's own
        rule applies (no --settle), nothing that could restart a target survives, and no
        process started during the teardown was left to PID 1 (a target that forked and
        exited, the child in a session of its own: where no fork event ties it to the
        target, only the window shows what it starts)."""
        if self.window_flags.auto and not self.respawned and not any(self.lineage.surviving()) \
                and not self._orphans(doc.procs):
            return 0.0, "nothing left that could restart a target"
        return self.window_flags.seconds, None

    def _orphans(self, procs):
        """Processes started during the teardown whose parent is PID 1 (or none), not ours,
        alive and in scope; none to look for when the kernel's fork events are read (the
        connector: root in the host's PID namespace), which tie a target's child to it however
        soon it is left to PID 1 (it is adopted and stopped), so a host whose units and timers
        start processes under PID 1 all the time keeps its window ending at once."""
        since, targets = self.targets.since_ticks, self.targets
        if getattr(targets.watch, "mode", "proc") == "connector":
            return []
        return [info for info in procs.values() if info["start_time"] >= since and info["ppid"] in (0, 1)
                and (info["pid"], info["start_time"]) not in targets.keys and not procfs.finished(info)
                and plan.in_scope(info, self.sel)]

    def only_left(self, doc):
        """Is all that keeps the GPUs from free what the plan left alone (--only-matching, out of
        the scope, protected with a context): holders the plan saw, none new, and no GPU process
        but theirs? Then the verdict, NOT FREE, needs no waiting for --timeout: nothing this
        teardown does will move them."""
        if doc.get("denied") or doc.get("proc_hidden"):
            return False
        lists = doc.get("context_source")
        obstacles = [h for h in doc["holders"] if not h["protected"] or verify.has_context(h, lists)]
        if not obstacles or any((h["pid"], h["start_time"]) not in self.before for h in obstacles):
            return False
        listed = {p["pid"] for g in doc["gpus"] for p in g["processes"]}
        return listed <= {h["pid"] for h in obstacles}

    def problems(self, problems, pending):
        """The verdict's problem lines: every respawn, and targets that have not exited."""
        out = problems + ["pid %d (%s): %s%s" % (a["pid"], verify.who(a), a["why"], "" if procfs.same_process(
            *k) else "; gone by the end of the window") for k, a in self.respawned.items()]
        return out + ["pid %d (%s) has not exited (%s)" % (
            t["pid"], verify.who(t),
            "in its exit" if procfs.exiting(t["pid"], t["start_time"]) else "still running") for t in pending]


def _pending(targets, doc):
    """(targets not exited, [those of them set aside]): a target in its exit (procfs.exiting:
    it runs no code, it cannot take a GPU again) that the GPU source lists on no GPU and that
    holds no GPU memory is set aside, where the source lists the GPUs' processes
    (context_source): a server unpinning a large host-memory pool takes seconds in its exit
    after the GPU reads free. Named in the result as "exiting, holds no GPU memory"."""
    alive = targets.alive(targets.items + targets.added)
    if not alive or not doc.get("context_source"):
        return alive, []
    listed = {p["pid"] for g in doc["gpus"] for p in g["processes"]}
    held = {h["pid"] for h in doc["holders"] if h["gpu_mib"]}
    aside = [t for t in alive if t["pid"] not in listed and t["pid"] not in held
             and procfs.exiting(t["pid"], t["start_time"])]
    keys = {(t["pid"], t["start_time"]) for t in aside}
    return ([t for t in alive if (t["pid"], t["start_time"]) not in keys],
            [{"pid": t["pid"], "start_time": t["start_time"], "cmdline": t.get("cmdline", ""),
              "why": "exiting, holds no GPU memory"} for t in aside])


def watch(sel, window_flags, source, targets, started, before=(), on_poll=None, on_free=None, lineage=None):
    """Poll until the GPUs have read free for the window (`window_flags`, a Window: its seconds;
    none when it is auto and nothing that could restart a target survives), or its timeout
    passes, or a respawn has been seen for a whole window. Free also needs every target,
    adopted ones included, to have exited (see the module's docstring).
    `before`: (pid, start) of the holders the plan already saw (left alone or out of scope).
    `lineage`: a Lineage (what could restart the targets). `on_free(free_at_s, window_s)` is
    called when the GPUs first read free, and again only after a respawn broke that."""
    t0 = time.monotonic()
    timeout = window_flags.timeout
    seen = _Seen(sel, window_flags, targets, lineage or Lineage(scan.Scan({}, {}, set()), []), before)
    free_at, announced, last_progress = None, False, 0.0
    stable = None  # ("free" or "left", since when): the state whose window is being watched
    window, ended_early = window_flags.seconds, None
    exiting: list = []
    while True:
        if free_at is None and not targets.alive(targets.items + targets.added):
            gpuinfo.until_reads_free(source, sel.max_used_mib,
                                     min(FAST_WAIT_MAX_S, max(0.0, t0 + timeout - time.monotonic())))
        scanned_at = time.monotonic()
        doc, free, problems, new = seen.look(source)
        now = time.monotonic()
        pending, exiting = _pending(targets, doc)
        state = "free" if free else ("left" if not pending and not new and seen.only_left(doc) else None)
        if state and not pending and not new:
            if stable is None or stable[0] != state:
                stable = (state, scanned_at)
                window, ended_early = seen.window(doc)
                if state == "free":
                    free_at = scanned_at
                    seen.first_free = seen.first_free or {
                        "confirm_proc_ms": doc.get("proc_scan_ms"), "confirm_gpu_ms": doc.get("gpu_read_ms"),
                        "confirmed_s": round(time.monotonic() - started, 3)}
                    if on_free and not announced:
                        announced = True
                        on_free(round(free_at - started, 3), window)
            if now - stable[1] >= window:
                break
        elif new or pending or stable is None:
            free_at = stable = None  # a respawn (or a target not yet gone) starts the window again
            announced = announced and not new  # the verdict changed: the next free is news again
        # a free stretch already begun is watched to its whole window even past --timeout (cut
        # short, a respawn at 1 s of a 5 s window would go unseen)
        if now - t0 >= timeout and (stable is None or not state):
            break
        if seen.first_respawn and not pending and now - seen.first_respawn >= window_flags.seconds:
            free = False
            break
        if on_poll and now - last_progress >= PROGRESS_EVERY_S:  # a line a second is news; 20 are noise
            last_progress = now
            on_poll(doc, problems)
        time.sleep(verify.POLL_S)
    problems = seen.problems(problems, pending if free else [])  # free, but a target not exited: not enough
    free = free and not pending and not seen.respawned
    if stable is not None and stable[0] == "left" and not free:
        problems = problems + ["only what the plan left alone still holds a GPU: nothing this teardown does "
                               "moves it, so the verdict did not wait for --timeout"]
    # alive now: whatever the window saw, a starter's next turn may come after it (the middle verdict)
    starters = seen.lineage.live_starters(targets.since_ticks, doc.procs) if free else []
    named = seen.lineage.named_left()  # a target its manager would restart was named, not signalled
    if named:
        free = False
        problems = problems + [line for _, line in named]
    return {"free": free, "doc": doc, "problems": problems, "starters_alive": starters,
            "left_alone_only": stable is not None and stable[0] == "left",
            "exiting_without_gpu": exiting if free else [],
            "appeared": list(seen.respawned.values()), "ignored": list(seen.ignored.values()), "scans": seen.scans,
            "first_free": seen.first_free, "settle_ended": ended_early if free else None, "window_s": window,
            "free_at_s": None if free_at is None else round(free_at - started, 3),
            "settled_at_s": round(time.monotonic() - started, 3) if free else None}
