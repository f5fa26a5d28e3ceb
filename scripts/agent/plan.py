"""Plan a teardown: which processes are targets and which are protected, each with why.

Targets: processes matching the target patterns (never a bare `python`), their whole
trees, the members of process groups they lead, and every other non-protected holder of
a GPU device file (orphans reparented to PID 1, renamed titles). `--only-matching`
leaves the other holders alone and reports them. Protected processes are never
signalled, even inside a target's tree. A process that matches no pattern and holds no
GPU is never touched. Units and containers are stopped through their manager.
"""
import os
import shutil

from . import options, procscan, rules, scan

UNIT_NEVER_STOPPED = ("ssh.service", "sshd.service", "docker.service", "containerd.service", "init.scope")


def add_arguments(parser):
    options.add_selection(parser)
    parser.add_argument("--only-matching", action="store_true",
                        help="signal only pattern matches and their trees; report other GPU holders")
    parser.add_argument("--disable", action="store_true", help="also `systemctl disable` units that are stopped")


def systemd_running():
    try:
        with open("/proc/1/comm") as f:
            return f.read().strip() == "systemd" and shutil.which("systemctl") is not None
    except OSError:
        return False


def _unit_to_stop(unit):
    if not unit or not unit.endswith(".service") or unit in UNIT_NEVER_STOPPED or unit.startswith("user@"):
        return None
    return unit


def build(doc, args):
    """The plan from a scan document (scan.collect output, with its private fields)."""
    procs, chain = doc["_procs"], doc["_chain"] | {os.getpid()}
    holders = {h["pid"]: h for h in doc["holders"]}
    patterns = list(args.target or rules.DEFAULT_TARGETS) + list(args.match)
    kids = procscan.children_map(procs)
    reasons, protected = {}, {}

    def protect(pid):
        if pid not in protected:
            protected[pid] = rules.protect_reason(procs[pid], chain, args.protect)
        return protected[pid]

    def add(pid, why):
        if pid in reasons or pid not in procs or protect(pid) or procs[pid]["state"] in ("Z", "X"):
            return False
        reasons[pid] = why
        return True

    matched = []
    for pid, info in procs.items():
        why = rules.target_reason(info, patterns)
        if why and add(pid, why):
            matched.append(pid)
    for root in list(matched):  # whole trees
        stack = [root]
        while stack:
            for child in kids.get(stack.pop(), []):
                if add(child, "in the tree of target %d" % root) or child in reasons:
                    stack.append(child)
    leaders = {pid for pid in reasons if procs[pid]["pgid"] == pid}
    for pid, info in procs.items():  # process groups led by a target
        if info["pgid"] in leaders and pid not in reasons:
            add(pid, "in process group %d of a target" % info["pgid"])
    left_alone = []
    for pid, h in holders.items():
        if pid in reasons or h["protected"]:
            continue
        why = "holds a GPU (orphan of PID 1)" if h["ppid"] == 1 else "holds a GPU"
        if args.only_matching:
            left_alone.append(_row(h, "holds a GPU but matches no target pattern (--only-matching)"))
        else:
            add(pid, why)
    return _assemble(doc, reasons, holders, procs, left_alone, args)


def _row(info, why):
    keys = ("pid", "start_time", "ppid", "pgid", "state", "user", "comm", "cmdline", "unit", "container", "gpu_mib",
            "devices", "write_files", "protected")
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
    units, containers = {}, {}
    use_systemd = systemd_running()
    docker = shutil.which("docker")
    for t in targets:
        unit = _unit_to_stop(t["unit"]) if not t["container"] else None
        if unit and use_systemd:
            units.setdefault(unit, []).append(t["pid"])
            t["via"] = "systemctl stop %s" % unit
        elif t["container"] and t["container"]["kind"] == "docker" and docker:
            containers.setdefault(t["container"]["id"], []).append(t["pid"])
            t["via"] = "docker stop %s" % t["container"]["id"][:12]
        else:
            t["via"] = "signal"
    protected = [_row(h, h["protected"]) for h in doc["holders"] if h["protected"]]
    return {
        "targets": targets,
        "protected": protected,
        "left_alone": left_alone,
        "units": [{"unit": u, "pids": p, "disable": bool(args.disable)} for u, p in sorted(units.items())],
        "containers": [{"id": c, "pids": p} for c, p in sorted(containers.items())],
        "patterns": list(args.target or rules.DEFAULT_TARGETS) + list(args.match),
        "will_free_mib": sum(v for t in targets for v in t["gpu_mib"].values() if v),
        "writing": [{"pid": t["pid"], "files": t["write_files"]} for t in targets if t["write_files"]],
    }


def run(args):
    doc = scan.collect(args)
    out = scan.public(doc)
    out["plan"] = build(doc, args)
    return 0, out
