"""Plan a teardown: which processes are targets and which are protected, each with why.

Targets are PROGRAMS named by a pattern (program.py: the executable, the module or script
an interpreter runs, or a process title - never an argument of another program, so `tail
-f sglang.launch_server.log`, `grep "vllm serve"` or a tmux session named `torchrun` are
not targets), then the processes those programs started (their trees by parent pid; a
shared process group proves nothing, since a shell puts pipeline siblings such as `| tee
log` in the server's group; but every member of a SESSION a target leads was started by
it, e.g. a double-forked helper), then every other
non-protected holder of a GPU device (orphans reparented to PID 1, renamed titles).
`--only-matching` leaves the other holders alone and reports them; `--scope TEXT` /
`--scope-uid UID` narrow every target to processes with TEXT in their command line / owned
by UID (the sandbox and the tests use them to touch only what they started). Never above a
target: the shell, multiplexer or terminal that contains a server is not signalled.
Protected processes are never signalled, even inside a target's tree. A process that
matches no pattern and holds no GPU is never touched. Units and containers are stopped
through their manager.
"""
import os

from . import cgroup, contract, procfs, procscan, rules, scan

UNIT_NEVER_STOPPED = ("ssh.service", "sshd.service", "docker.service", "containerd.service", "init.scope")


def add_arguments(parser):
    """plan's own flags (teardown takes them too); the selection flags are cli.py's to add."""
    parser.add_argument("--only-matching", action="store_true",
                        help="signal only pattern matches and their trees; report other GPU holders")
    parser.add_argument("--disable", action="store_true",
                        help="also disable what is stopped: `systemctl disable` a unit, "
                             "`docker update --restart=no` a container")


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




def _unit_to_stop(unit):
    if not unit or not unit.endswith(".service") or unit in UNIT_NEVER_STOPPED or unit.startswith("user@"):
        return None
    return unit


def _wholly_targeted(targets, procs):
    """Units and containers whose every process is a target: only those may be stopped
    through their manager. A GPU job started from cron, supervisord or a notebook server
    lives in that daemon's unit; `systemctl stop` would end the daemon and everything else
    in it, none of which the plan lists. A unit under a user manager (user@UID.service) is
    not the system manager's to stop. Reads /proc/*/cgroup only when there is a candidate."""
    wanted = {owner_key(t) for t in targets} - {None}
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
    mine = {t["pid"] for t in targets}
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


def patterns_of(args):
    return list(args.target or rules.DEFAULT_TARGETS) + list(args.match)


def in_scope(info, args):
    """Does --scope / --scope-uid allow this process to be a target?"""
    if args.scope_uid is not None and info.get("uid") != args.scope_uid:
        return False
    return not args.scope or args.scope in (info.get("cmdline") or "")


RULES = (
    "targets: programs named by the patterns, the processes they started, and other unprotected GPU holders",
    "processes a target forks during the teardown (its new descendants) are signalled too",
    "anything else that holds a GPU after the targets are gone is reported, never signalled",
)


def build(doc, args):
    """The plan from a scan document (scan.collect output, with its private fields)."""
    procs, chain = doc["_procs"], doc["_chain"] | {os.getpid()}
    holders = {h["pid"]: h for h in doc["holders"]}
    patterns = patterns_of(args)
    kids = procscan.children_map(procs)
    reasons, protected = {}, {}

    def protect(pid):
        if pid not in protected:
            protected[pid] = rules.protect_reason(procs[pid], chain, args.protect)
        return protected[pid]

    def add(pid, why):
        if pid in reasons or pid not in procs or protect(pid) or procfs.finished(procs[pid]):
            return False
        if args.scope_uid is not None and procs[pid]["uid"] != args.scope_uid:
            return False
        reasons[pid] = why
        return True

    matched = []
    for pid, info in procs.items():
        why = rules.target_reason(info, patterns)
        if why and in_scope(info, args) and add(pid, why):
            matched.append(pid)
    for root in list(matched):  # what the server started: its whole tree
        stack = [root]
        while stack:
            for child in kids.get(stack.pop(), []):
                if add(child, "started by target %d" % root) or child in reasons:
                    stack.append(child)
    leaders = {pid for pid in reasons if procs[pid]["sid"] == pid}
    for pid, info in procs.items():  # a session a target leads holds only what it started
        if info["sid"] in leaders and pid not in reasons:
            add(pid, "in the session of target %d (started by it, then reparented)" % info["sid"])
    left_alone = []
    for pid, h in holders.items():
        if pid in reasons or h["protected"]:
            continue
        why = "holds a GPU (orphan of PID 1)" if h["ppid"] == 1 else "holds a GPU"
        if args.only_matching:
            left_alone.append(_row(h, "holds a GPU but matches no target pattern (--only-matching)"))
        elif not in_scope(h, args):
            left_alone.append(_row(h, "holds a GPU but is outside the scope (--scope/--scope-uid)"))
        else:
            add(pid, why)
    return _assemble(doc, reasons, holders, procs, left_alone, args)


def _row(info, why):
    keys = ("pid", "start_time", "ppid", "pgid", "state", "user", "comm", "argv", "cmdline", "unit", "container",
            "gpu_mib", "devices", "write_files", "protected")
    out = {k: info.get(k) for k in keys}
    out["reason"] = why
    return out


def _assemble(doc, reasons, holders, procs, left_alone, args):
    now = scan.procfs_now_ticks()
    targets = []
    for pid in sorted(reasons):
        info = holders.get(pid) or procscan.detail(procs[pid], [], now_ticks=now)
        info.setdefault("gpu_mib", {})
        targets.append(_row(info, reasons[pid]))
    units: dict = {}
    containers: dict = {}
    found: dict = {}

    def have(manager):  # looked up once, and only when a target is run by such a manager (PATH stats before the signal)
        if manager not in found:
            found[manager] = systemd_running() if manager == "systemd" else on_path(manager)
        return found[manager]

    whole = _wholly_targeted(targets, procs)
    for t in targets:
        # a unit or container that runs other processes too (cron, a notebook server): signal ours only
        key = owner_key(t) if owner_key(t) in whole else None
        container = t["container"]
        unit = _unit_to_stop(t["unit"]) if key else None
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
    protected = [_row(h, h["protected"]) for h in doc["holders"] if h["protected"]]
    return {
        "targets": targets,
        "protected": protected,
        "left_alone": left_alone,
        "units": [{"unit": u, "ctid": ct, "pids": p, "disable": bool(args.disable)}
                  for (u, ct), p in sorted(units.items(), key=lambda kv: (kv[0][0], kv[0][1] or ""))],
        "containers": [{"id": c, "pids": p, "disable": bool(args.disable)} for c, p in sorted(containers.items())],
        "patterns": patterns_of(args),
        "scope": {"text": args.scope, "uid": args.scope_uid},
        "rules": list(RULES),
        "will_free_mib": sum(v for t in targets for v in t["gpu_mib"].values() if v),
        "writing": [{"pid": t["pid"], "files": t["write_files"]} for t in targets if t["write_files"]],
    }


def run(args):
    doc = scan.collect(args)
    out = scan.public(doc)
    out["plan"] = build(doc, args)
    return contract.EXIT_OK, out
