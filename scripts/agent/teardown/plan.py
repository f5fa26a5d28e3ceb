"""Plan a teardown: which processes are targets and which are protected, each with why.

Targets are PROGRAMS named by a pattern (program.py: the executable, the module or script
an interpreter runs, or a process title - never an argument of another program, so `tail
-f sglang.launch_server.log`, `grep "vllm serve"` or a tmux session named `torchrun` are
not targets), then the processes those programs started (their trees by parent pid; a
shared process group proves nothing, since a shell puts pipeline siblings such as `| tee
log` in the server's group; but every member of a SESSION a target leads was started by
it, e.g. a double-forked helper), then every other
non-protected holder of a GPU device (orphans reparented to PID 1, renamed titles).

The whole account: docs/design-notes.md (scripts/agent/teardown/plan.py)."""
import os

from ..holders import scan
from ..options.record import Options
from ..policy import managers, program, relation, rules, wrappers
from ..procs import cgroup, procfs, procscan
from ..wire import codes, records
from . import pending, shm, units

UNIT_NEVER_STOPPED = ("ssh.service", "sshd.service", "docker.service", "containerd.service", "init.scope")


def add_arguments(parser):
    """plan's own flags (teardown takes them too); the selection flags are cli.py's to add."""
    parser.add_argument("--only-matching", action="store_true",
                        help="signal only pattern matches and their trees; report other GPU holders")
    parser.add_argument("--stop-starters", action="store_true",
                        help="also stop a free-standing supervisor of the targets (a `bash -c` or script that "
                             "waits for them or restarts them in a loop, outside any unit or container)")
    parser.add_argument("--all-users", action="store_true",
                        help="also stop another person's copy of a target program that holds no GPU of this host "
                             "(by default it is left and named)")
    parser.add_argument("--disable", action="store_true",
                        help="also disable what is stopped: `systemctl disable` a unit, "
                             "`docker update --restart=no` a container")
    parser.add_argument("--checkpoint-stop", action="append", default=[], metavar="SPEC",
                        help="a phase's checkpoint stop (base64 JSON: phase, signal, checkpoint, idle, deadline_s), "
                             "run first while that phase runs (teardown/checkpoint.py; repeatable)")


def on_path(program):
    """shutil.which, with shutil imported only when a target needs it: shutil (with bz2 and
    lzma) would otherwise cost every teardown ~3 ms before its first signal."""
    import shutil
    return shutil.which(program) is not None


def systemd_running():
    try:
        with open("/proc/1/comm") as f:
            return f.read().strip() == "systemd" and on_path("systemctl")
    except OSError:
        return False




def stoppable_unit(unit):
    """The unit, when it is a system service the plan may stop (not sshd, docker, a login scope
    or a user's manager); else None."""
    if not unit or not unit.endswith(".service") or unit in UNIT_NEVER_STOPPED or unit.startswith("user@"):
        return None
    return unit


def _wholly_targeted(targets, procs, extra=frozenset()):
    """Units and containers whose every process is a target, a wrapper of targets or a log
    filter of theirs (`extra`, wrappers.py): only those may be stopped through their manager.
    A GPU job started from cron, supervisord or a notebook server lives in that daemon's unit;
    `systemctl stop` would end the daemon and everything else in it, none of which the plan
    lists. A unit under a user manager (user@UID.service) is not the system manager's to
    stop. Reads /proc/*/cgroup only when there is a candidate."""
    wanted = {owner_key(t) for t in targets if t["container"] or stoppable_unit(t["unit"])} - {None}
    wanted.discard(owner_key(cgroup.read(os.getpid())))  # the agent's own container: never ours to stop
    if not wanted:
        return set()
    members: dict = {}
    user_units: set = set()
    for pid in procs:
        cg = cgroup.read(pid)
        key = owner_key(cg)
        if key in wanted:
            members.setdefault(key, set()).add(pid)
            if "/user@" in (cg["path"] or ""):
                user_units.add(key)
    mine = {t["pid"] for t in targets} | set(extra)
    return {key for key, pids in members.items() if pids <= mine and key not in user_units}


def owner_key(info):
    """What stops this process through a manager: its unit, its docker container, or (on a
    Proxmox node) the unit inside its LXC container; None when nothing does."""
    container, unit = info["container"], info["unit"]
    if container and container["kind"] == "lxc":
        return ("lxc", container["id"], unit) if unit and unit != "init.scope" else None
    if container:
        return container["id"]
    return unit


def patterns_of(sel):
    return rules.patterns_of(sel)


def in_scope(info, sel):
    """Does --scope / --scope-uid allow this process to be a target?"""
    if sel.scope_uid is not None and info.get("uid") != sel.scope_uid:
        return False
    return not sel.scope or sel.scope in (info.get("cmdline") or "")


RULES = (
    "targets: programs named by the patterns, the processes they started, and other unprotected GPU holders",
    "processes a target forks during the teardown (its new descendants) are signalled too",
    "what a target left in the process group or session it leads is stopped with it",
    "a unit or container holding only targets and their wrappers is stopped through its manager",
    "a program another manager restarts (supervisord, runit, podman...) is stopped through it when it runs only "
    "targets and their wrappers; else it is named with the command that stops it and not signalled",
    "anything else that holds a GPU after the targets are gone is reported, never signalled",
)


class _Picked:
    """The targets of a plan as they are found: {pid: why}, and who is protected (asked once)."""

    def __init__(self, procs, chain, sel):
        self.procs, self.chain, self.sel = procs, chain, sel
        self.reasons: dict = {}
        self.protected: dict = {}
        self.left: set = set()  # another person's idle copies: never made targets

    def protect(self, pid):
        if pid not in self.protected:
            self.protected[pid] = rules.protect_reason(self.procs[pid], self.chain, self.sel.protect)
        return self.protected[pid]

    def add(self, pid, why):
        """Make pid a target, unless it is one already, gone, protected or not the scope's uid."""
        procs = self.procs
        if pid in self.reasons or pid in self.left or pid not in procs or self.protect(pid) \
                or procfs.finished(procs[pid]):
            return False
        if self.sel.scope_uid is not None and procs[pid]["uid"] != self.sel.scope_uid:
            return False
        self.reasons[pid] = why
        return True

    def trees(self, roots, kids):
        """What each root started: its whole tree (a torn snapshot, a pid reused between
        reads, can show a cycle: each process is walked once). A "child" that started before
        its parent is not its child: its real parent died, it was moved to another, and the
        dead parent's pid went to this one (a reused pid must never hand over a tree)."""
        walked: set = set()
        procs = self.procs
        for root in roots:
            stack = [root]
            while stack:
                parent = stack.pop()
                if parent in walked:
                    continue
                walked.add(parent)
                for child in kids.get(parent, []):
                    if child in procs and parent in procs and \
                            procs[child]["start_time"] < procs[parent]["start_time"]:
                        continue
                    if self.add(child, "started by target %d" % root) or child in self.reasons:
                        stack.append(child)


def pending_query(sel):
    """The pending restarts' query (pending.py), started now: a unit or container whose command
    the target patterns and scope pick, with a restart scheduled and no process yet."""
    patterns = patterns_of(sel)
    return pending.Query(lambda info: in_scope(info, sel) and rules.target_reason(info, patterns),
                         systemd_running, lambda: on_path("docker"))


def add_pending(built, found, sel):
    """The pending units and containers, to be stopped through their managers like the others;
    returns {units, containers} of those added."""
    have = {u["unit"] for u in built["units"] if not u.get("ctid")}
    added = {"units": [{"unit": u["unit"], "ctid": None, "pids": [], "disable": bool(sel.disable),
                        "pending": u["why"]} for u in found["units"] if u["unit"] not in have]}
    have = {c["id"] for c in built["containers"]}
    added["containers"] = [{"id": c["id"], "name": c["name"], "pids": [], "disable": bool(sel.disable),
                            "pending": c["why"]} for c in found["containers"] if c["id"] not in have]
    built["units"] += added["units"]
    built["containers"] += added["containers"]
    return added


def build(doc, sel, with_pending=True, pipes=None, keep_shm=False):
    """The plan from a scan (scan.Scan: the document and its process table), with the pending
    restarts (pending.py) queried on a thread meanwhile; a teardown adds those itself, after
    its plan's batch went out (with_pending False). `pipes`: early.Batch's, read before its
    SIGTERM."""
    pending_restarts = pending_query(sel) if with_pending else None
    procs, chain = doc.procs, doc.chain | {os.getpid()}
    holders = {h["pid"]: h for h in doc["holders"]}
    patterns = patterns_of(sel)
    kids = procscan.children_map(procs)
    picked = _Picked(procs, chain, sel)
    matched = []
    others: dict = {}  # pid -> why it is left (another person's idle copy)
    for pid, info in procs.items():
        why = info["mark"] if "mark" in info else rules.target_reason(info, patterns)  # scan.collect tried them
        if not why or not in_scope(info, sel):
            continue
        whose = _someone_elses_idle(info, procs, kids, holders, sel)
        if whose:
            others[pid] = whose
            picked.left.add(pid)  # nor taken into a target's tree, group or session
            continue
        if picked.add(pid, why):
            matched.append(pid)
    picked.trees(matched, kids)
    for pid, why in _left_in_group(picked.reasons, procs):
        picked.add(pid, why)
    now = scan.procfs_now_ticks()
    left_alone = _other_holders(holders, picked, sel) + [
        _row(procscan.detail(procs[pid], [], now_ticks=now), why) for pid, why in others.items()]
    wrapped, filters = wrappers.find(picked.reasons, procs, kids, never=chain)
    related = relation.Relation([procs[pid] for pid in picked.reasons], procs, chain,
                                tree=set(picked.reasons) | set(filters), pipes=pipes)
    starters = {}
    for link in related.links.values():
        pid = link["pid"]
        if picked.protect(pid):  # related all the same, and never signalled: named while it lives
            link = dict(link, fate="watch", foreground=False, relation="%s, protected: %s" % (
                link["relation"], picked.protect(pid)))
        elif link["fate"] == "freeze" and sel.stop_starters and link["role"] != "terminal":
            link = dict(link, fate="stop", relation=link["relation"] + ", stopped too (--stop-starters)")
        if not in_scope(procs[pid], sel) or another_persons(procs[pid], sel):
            link = dict(link, fate="watch", foreground=False,
                        relation=link["relation"] + ("" if link["role"] == "terminal" else
                                                     ", outside the scope: never signalled"))
        starters[pid] = link
    wrapped = {pid: sorted(set(pids) & set(picked.reasons)) for pid, pids in wrapped.items()
               if pid not in starters and not picked.protect(pid) and in_scope(procs[pid], sel)
               and not managers.is_manager_daemon(procs[pid])}  # an init (tini) whose container is stopped
    for pid, link in starters.items():
        if link["fate"] == "stop":
            wrapped[pid] = sorted(set(link["of"]))
    built = _assemble(doc, picked.reasons, holders, procs, left_alone, sel, wrapped, filters, starters)
    built["unseen"] = [{"pid": pid, "start_time": procs[pid]["start_time"], "cmdline": procs[pid].get("cmdline", ""),
                        "why": why} for pid, why in sorted(related.unseen.items())]
    if not keep_shm:  # read before the plan's signals: gone after them (shm.py)
        built["shm"], built["shm_owners"] = shm.gather(built["targets"])
    if pending_restarts is not None:
        add_pending(built, pending_restarts.get(), sel)
    return built


def operator_uid():
    """Who runs this teardown: the uid sudo was called by (SUDO_UID, GPU1_BECOME=sudo), else
    this agent's own."""
    uid = os.environ.get("SUDO_UID", "") if os.getuid() == 0 else ""
    return int(uid) if uid.isdigit() else os.getuid()


def another_persons(info, sel):
    """Is this process another person's: a uid of UID_MIN or more that is not the operator's,
    where neither --all-users nor --scope-uid (which names whose processes are meant) is given?"""
    uid = info.get("uid")
    return not (sel.all_users or sel.scope_uid is not None or uid is None
                or uid < rules.uid_min() or uid == operator_uid())


def _someone_elses_idle(info, procs, kids, holders, sel):
    """Why a target program is left, or None: it is another person's (another_persons) and
    neither it nor anything it started holds a GPU of this host (a client, a copy waiting for
    its turn). Freeing the GPUs needs none of that; --all-users takes it."""
    if not another_persons(info, sel):
        return None
    tree = procscan.descendants(info["pid"], kids) | {info["pid"]}
    if any(_holds_a_gpu(holders[pid]) for pid in tree & set(holders)):
        return None
    uid = info["uid"]
    return ("a target program of another person (%s, uid %d) that holds no GPU of this host: left (--all-users "
            "stops it)" % (procscan.user_name(uid), uid))


def target_identities(targets, patterns, holds):
    """The programs (program.identity) of the targets a pattern names or that hold a GPU
    (`holds(target)`): what "the same program as a target" compares, and what a loop's code may
    start under another name than a pattern's. Never a helper of a target's tree (`sleep`)."""
    out: set = set()
    for t in targets:
        if holds(t) or rules.target_reason(t, patterns):
            out |= program.identity(t)
    return out


def _holds_a_gpu(holder):
    """GPU memory, or a GPU's own device file (nvidiaN): not nvidiactl or nvidia-uvm alone,
    which every NVML or CUDA client opens (`nvidia-smi` run by a client, a library's probe)."""
    return bool(holder.get("gpu_mib")) or any(os.path.basename(d)[len("nvidia"):].isdigit()
                                               for d in holder.get("devices") or [])


def _other_holders(holders, picked, sel):
    """Every other unprotected GPU holder is a target (orphans, renamed workers), unless
    --only-matching or the scope keeps it out: those are returned, to be reported."""
    left_alone = []
    for pid, h in holders.items():
        if pid in picked.reasons or h["protected"]:
            continue
        if sel.only_matching:
            left_alone.append(_row(h, "holds a GPU but matches no target pattern (--only-matching)"))
        elif not in_scope(h, sel):
            left_alone.append(_row(h, "holds a GPU but is outside the scope (--scope/--scope-uid)"))
        else:
            picked.add(pid, "holds a GPU (orphan of PID 1)" if h["ppid"] == 1 else "holds a GPU")
    return left_alone


PIPELINE_SIBLING_S = 0.1  # a shell forks a pipeline's members together; a server's helper comes later


def _left_in_group(reasons, procs):
    """(pid, why) for what a target left in the session or process group it leads: a
    double-forked helper, reparented to PID 1 or a subreaper. Everything in a session a target
    leads was started by it. A server started from an interactive shell leads its job's
    process group, not the session (the shell leads that), so the group is looked at too; but
    a shell puts a pipeline's other members in it (`server | tee log`), and they are the
    shell's, with whatever they start: see _beside_leader."""
    leaders = {pid for pid in reasons if procs[pid]["sid"] == pid or procs[pid]["pgid"] == pid}
    if not leaders:
        return []
    out = []
    lineage: dict = {}
    for pid, info in procs.items():
        if pid in reasons:
            continue
        if info["sid"] in leaders and procs[info["sid"]]["sid"] == info["sid"]:
            out.append((pid, "in the session of target %d (started by it, then reparented)" % info["sid"]))
            continue
        leader = info["pgid"]
        if leader not in leaders:
            continue
        if leader not in lineage:
            lineage[leader] = set(procscan.ancestors(procs[leader]["ppid"], procs)) - {1} - set(reasons)
        if not _beside_leader(pid, procs[leader], lineage[leader], procs, reasons):
            out.append((pid, "in the process group of target %d (left there by it)" % leader))
    return out


def _beside_leader(pid, leader, lineage, procs, reasons):
    """Was this member of a target's process group started beside the target rather than by
    it? Its line of parents is followed up: reaching a target, it is the target's; reaching the
    leader's own ancestry (the shell that started both, not PID 1), it is that shell's, as is
    all a pipeline's member starts; reaching PID 1 (or a parent /proc no longer shows: it was
    reparented), its top is the target's unless it was started within PIPELINE_SIBLING_S of
    the leader (forked with it by a shell that has left since)."""
    together = PIPELINE_SIBLING_S * procscan.clock_ticks()
    seen = set()
    while pid in procs and pid not in seen:
        seen.add(pid)
        parent = procs[pid]["ppid"]
        if parent in reasons:
            return False
        if parent in lineage:
            return True
        if parent in (0, 1) or parent not in procs:
            return procs[pid]["start_time"] - leader["start_time"] <= together
        pid = parent
    return False


def _row(info, why):
    keys = ("pid", "start_time", "ppid", "pgid", "state", "user", "comm", "argv", "cmdline", "unit", "container",
            "gpu_mib", "devices", "write_files", "protected")
    out = {k: info.get(k) for k in keys}
    out["reason"] = why
    return out


def _assemble(doc, reasons, holders, procs, left_alone, sel, wrapped, filters, starters):
    now = scan.procfs_now_ticks()

    gone: list = []

    def rows(pids, why):  # a process that exited since the scan is nobody's to stop: kept apart, in `gone`
        out: list = []
        for pid in sorted(pids):
            info = holders.get(pid) or procscan.detail(procs[pid], [], now_ticks=now)
            info.setdefault("gpu_mib", {})
            (gone if info.get("gone") else out).append(_row(info, why(pid)))
        return out

    targets = rows(reasons, reasons.get)
    wrapper_rows = rows(wrapped, lambda pid: _wrapper_why(pid, wrapped[pid], procs))
    units: dict = {}
    containers: dict = {}
    found: dict = {}

    def have(manager):  # looked up once, and only when a target is run by such a manager (PATH stats before the signal)
        if manager not in found:
            found[manager] = systemd_running() if manager == "systemd" else on_path(manager)
        return found[manager]

    whole = _wholly_targeted(targets + wrapper_rows, procs, set(filters))
    for t in targets + wrapper_rows:
        _via_unit_or_container(t, whole, units, containers, have)
    stops, named = _via_managers(targets + wrapper_rows, procs, whole, set(filters), have)
    if named:  # not signalled: its manager would start it again (named, with its stop, in `managers`)
        targets = [t for t in targets if t["via"] != "named"]
        wrapper_rows = [t for t in wrapper_rows if t["via"] != "named"]
    starter_rows = []
    for t in wrapper_rows:
        t["wraps"] = list(wrapped[t["pid"]])  # the targets it runs (an --approved teardown keeps its own)
        if t["via"] != "signal":
            targets.append(t)  # stopped through its unit, container or manager with the targets
        elif t["pid"] in starters:
            starter_rows.append(t)  # the job's own: frozen before the targets' signal, ended after
    starter_rows += [row for row in rows([p for p, link in starters.items() if link["fate"] != "stop"], str)]
    names = _container_names([t for t in targets if t["via"].startswith("docker stop")], have)
    for t in targets:
        _name_container(t, names)
    for t in starter_rows:
        link = starters[t["pid"]]
        t.update(reason=link["relation"], fate=link["fate"], role=link["role"], wraps=sorted(set(link["of"])))
        if link.get("foreground"):
            t["foreground"] = True  # a loop typed at its prompt gets Ctrl-C (relation.interrupt_loop)
        t["hint"] = starter_hint(t, procs)
    protected = [_row(h, h["protected"]) for h in doc["holders"] if h["protected"]]
    return {
        "targets": sorted(targets, key=lambda t: t["pid"]),
        "protected": protected,
        "left_alone": left_alone + named,
        "starters": sorted(starter_rows, key=lambda t: t["pid"]),
        "units": [{"unit": u, "ctid": ct, "pids": p, "disable": bool(sel.disable)}
                  for (u, ct), p in sorted(units.items(), key=lambda kv: (kv[0][0], kv[0][1] or ""))],
        "containers": [{"id": c, "name": names.get(c), "pids": p, "disable": bool(sel.disable)}
                       for c, p in sorted(containers.items())],
        "managers": stops,
        "patterns": patterns_of(sel),
        "scope": {"text": sel.scope, "uid": sel.scope_uid},
        "rules": list(RULES),
        "will_free_mib": _will_free(targets),
        "writing": [{"pid": t["pid"], "files": t["write_files"]} for t in targets if t["write_files"]],
        "gone": gone,
    }


def _will_free(targets):
    """MiB the targets hold, or None when a target holds a GPU whose share is unknown (no NVML:
    "about 0 MiB" read as nothing to free)."""
    if any(v is None for t in targets for v in t["gpu_mib"].values()) or any(
            t.get("devices") and not t["gpu_mib"] for t in targets):
        return None
    return sum(v for t in targets for v in t["gpu_mib"].values() if v)


def _via_unit_or_container(t, whole, units, containers, have):
    """t["via"]: its unit's or docker container's stop when that runs ours only (`whole`), else
    "signal"; the unit or container noted in `units` / `containers`."""
    # a unit or container that runs other processes too (cron, a notebook server): signal ours only
    key = owner_key(t) if owner_key(t) in whole else None
    container = t["container"]
    unit = stoppable_unit(t["unit"]) if key else None
    if unit and container is None and have("systemd"):
        units.setdefault((unit, None), []).append(t["pid"])
        t["via"] = "systemctl stop %s" % unit
    elif unit and container and container["kind"] == "lxc" and have("pct"):
        units.setdefault((unit, container["id"]), []).append(t["pid"])
        t["via"] = "pct exec %s -- systemctl stop %s" % (container["id"], unit)
    elif key and container and container["kind"] == "docker" and have("docker"):
        containers.setdefault(container["id"], []).append(t["pid"])
        t["via"] = "docker stop %s" % container["id"][:12]
    else:
        t["via"] = "signal"


# containers a manager (policy/managers.py) stops: only one that holds targets and their wrappers alone
MANAGED_CONTAINERS = ("podman", "cri-containerd", "crio", "nerdctl", "kubernetes")


def _via_managers(rows, procs, whole, filters, have=on_path):
    """([stop], [named row]) for the rows still to be signalled that a manager restarts
    (managers.manager_of). Each such row gets `manager` {kind, name, stop_command}. Its stop
    {kind, name, command, argv, pids, comes_back, first, run, why, daemon_pid} is run (`run`;
    the row's via: the command) when the manager may run it by default and everything it runs
    for that program is a target, a wrapper or a filter of theirs; else (`run` False) the row
    is taken out of the signalled ones (via "named"), with what is below it: signalling what a
    manager restarts only starts it again, and a Kubernetes pod, a CRI container or Ray is
    their owner's to stop. A stop whose tool is not on PATH (`have`) is named too."""
    mine = {t["pid"] for t in rows} | set(filters)
    stops: dict = {}
    named: dict = {}
    by_pid = {}
    for t in rows:
        if t["via"] != "signal":
            continue
        m = managers.manager_of(t, procs)
        if m is None:
            continue
        container = t.get("container") or {}
        runs_ours = ((container.get("kind") not in MANAGED_CONTAINERS or owner_key(t) in whole)
                     and managers.managed_pids(m, procs) <= mine)
        key = _key(m)
        tool = bool(m["stop_argv"]) and have(m["stop_argv"][0])
        run = bool(m["stops_by_default"] and runs_ours and tool)
        item = (stops if run else named).setdefault(key, _stop_item(m, run, runs_ours, procs, mine, tool))
        _managed_row(t, item)
        by_pid[t["pid"]] = item
    for t in rows:  # what a named target started goes with it (its manager restarts the tree)
        if t["via"] == "signal":
            above = next((by_pid[a] for a in procscan.ancestors(t["ppid"], procs) if a in by_pid), None)
            if above is not None and not above["run"]:
                _managed_row(t, above)
    out = [t for t in rows if t["via"] == "named"]
    for t in out:
        item = by_pid.get(t["pid"]) or named[_key(t["manager"])]
        t["reason"] = "%s; not signalled: %s %s runs it and would start it again (its stop: %s)" % (
            t["reason"], item["kind"], item["name"], item["command"] or "none could be read")
    return list(stops.values()) + list(named.values()), out


def _key(manager):
    return manager["kind"], manager["name"], manager["stop_command"]


def _managed_row(row, item):
    row["manager"] = {"kind": item["kind"], "name": item["name"], "stop_command": item["command"]}
    row["via"] = item["command"] if item["run"] else "named"
    item["pids"].append(row["pid"])


def _stop_item(m, run, runs_ours, procs, mine, tool=True):
    """A manager's stop as the plan lists it (`run`: the teardown runs it), with why not."""
    if run:
        why = "stopped through it"
    elif m["stops_by_default"] and runs_ours and not tool:
        why = "`%s` is not on this agent's PATH, so the teardown cannot run the stop" % m["stop_argv"][0]
    elif not runs_ours:
        others = sorted(managers.managed_pids(m, procs) - mine)
        why = ("it runs other processes too (PID %s), so stopping it is not the teardown's: %s"
               % (_pids(others) or "s of its container", m["note"]))
    else:
        why = m["note"]
    return {"kind": m["kind"], "name": m["name"], "command": m["stop_command"], "argv": m["stop_argv"],
            "pids": [], "comes_back": m.get("comes_back"), "first": m.get("first"), "run": run, "why": why,
            "daemon_pid": m.get("pid"), "main_pid": m.get("main_pid")}


def _pids(pids):
    return ", ".join(map(str, pids[:8])) + (", ..." if len(pids) > 8 else "")


def _wrapper_why(pid, wrapped_pids, procs):
    if not wrapped_pids:
        return "a loop whose code starts a target program again (none runs now: it is between its turns)"
    what = "an init" if wrappers.kind(procs[pid]) == "init" else "a shell"
    return "wraps target(s) %s (%s that waits for them, or starts them again)" % (_pids(wrapped_pids), what)


def supervisor_hint(info, managed=True, procs=None):
    """What stops a process that restarts targets, in words an operator can run: its unit's
    or container's stop, never its PID (a unit's main process is restarted by systemd), the
    stop of the manager that runs it (`procs`: the scan's table, to find it: supervisorctl,
    sv down, podman stop...), else the teardown flag that includes it. `managed` False: its
    unit or container runs other processes too (cron.service and its other jobs), and stopping
    it is not ours to suggest."""
    m = managers.manager_of(info, procs) if procs is not None and info.get("pid") in procs else None
    if m is not None and m["stop_command"]:  # signalled, its manager would start it again
        return "%s (%s %s runs it and would start it again)" % (m["stop_command"], m["kind"], m["name"])
    if not managed:
        return starter_hint(info, procs)
    container, unit = info.get("container"), info.get("unit")
    if container and container.get("kind") == "docker":
        return "docker stop %s" % container_label(container)
    if container and container.get("kind") == "lxc":
        return "pct exec %s -- systemctl stop %s" % (container["id"], unit) if unit and unit != "init.scope" \
            else "pct stop %s" % container["id"]
    if stoppable_unit(unit):
        return "systemctl stop %s" % unit
    return starter_hint(info, procs)


def starter_hint(info, procs=None):
    """What stops a related starter, exactly that process: its manager's stop where one runs
    it, else a line that ends its pid only while the start time is still its own (a reused pid
    gets nothing), and the teardown flag that stops it with the targets."""
    m = managers.manager_of(info, procs) if procs is not None and info.get("pid") in procs else None
    if m is not None and m["stop_command"]:
        return "%s (%s %s runs it)" % (m["stop_command"], m["kind"], m["name"])
    if info.get("pid") == 1:
        return pid1_hint()
    if info.get("role") == "terminal":
        return "it is never signalled (an interactive shell): stop what it runs in its terminal yourself"
    return "`%s`, or teardown --stop-starters" % relation.pinned_kill(info["pid"], info["start_time"])


def pid1_hint():
    """PID 1 is never signalled: where it is a shell loop this is a container (or a PID
    namespace) whose main process restarts the server; stopping the container does."""
    where = _container_runtime()
    host = _hostname()
    if where == "docker":  # a PID namespace made inside a docker container sees /.dockerenv too
        return ("PID 1 is never signalled: stop its container from the host (`docker stop %s`, where this PID "
                "namespace is docker's container of that hostname), else end this namespace's PID 1 from the one "
                "above it" % host)
    if where == "podman":
        return "stop the container from its host: `podman stop %s`" % (_containerenv("name") or host)
    if where == "lxc":
        return "stop the container from its node: `pct stop CTID` / `lxc-stop -n NAME` (hostname %s)" % host
    return ("stop the container or PID namespace whose PID 1 this loop is, from outside it (hostname %s): "
            "PID 1 is never signalled" % host)


def _hostname():
    import socket
    return socket.gethostname()


def _containerenv(key):
    """A field of podman's /run/.containerenv (name=..., id=...), or None."""
    try:
        with open("/run/.containerenv") as f:
            for line in f:
                k, _, v = line.strip().partition("=")
                if k == key:
                    return v.strip('"') or None
    except OSError:
        pass
    return None


def _container_runtime():
    """docker, podman, lxc or None: which runtime this agent runs inside, from the files and the
    `container=` variable the runtimes leave in PID 1's environment."""
    if os.path.exists("/.dockerenv"):
        return "docker"
    if os.path.exists("/run/.containerenv"):
        return "podman"
    try:
        with open("/proc/1/environ", "rb") as f:
            env = f.read(1 << 16).split(b"\0")
    except OSError:
        env = []
    for item in env:
        if item.startswith(b"container="):
            return item[len(b"container="):].decode("ascii", "replace") or None
    return None


def container_label(container):
    """`vllm (3f2a1b4c5d6e)`: a docker container by name and short id; the id alone when no
    name is known."""
    short = (container.get("id") or "")[:12]
    return "%s (%s)" % (container["name"], short) if container.get("name") else short


def _container_names(rows, have):
    ids = sorted({r["container"]["id"] for r in rows if r.get("container") and r["container"]["kind"] == "docker"})
    if not ids or not have("docker"):
        return {}
    return units.container_names(ids)


def _name_container(row, names):
    container = row.get("container")
    if container and container.get("kind") == "docker" and names.get(container["id"]):
        row["container"] = dict(container, name=names[container["id"]])
        if row.get("via", "").startswith("docker stop"):
            row["via"] = "docker stop %s" % container_label(row["container"])


def run(opts: Options):
    from . import checkpoint  # only here and in a teardown that declares a stop

    sel = opts.selection
    stops = checkpoint.planned(opts.checkpoint_stop, sel)  # a bad stop is bad input: exit 2 before the scan
    doc = scan.collect(sel)
    built = build(doc, sel)
    built["checkpoint_stops"] = stops
    return codes.EXIT_OK, records.written(records.PlanResult, scan.public(doc), code=codes.EXIT_OK, plan=built)
