"""Who holds each GPU: /proc device holders merged with NVML's compute processes.

The one scan engine: the scan subcommand prints it, and verify, the teardown's plan, settle
and reset, and a phase's intruder and lint checks read the same document, so each of them
tells a holder, a protected process and an unreadable one alike.
"""
import os
import time

from ..gpu import gpuinfo
from ..policy import rules
from ..procs import procfs, procscan


class Scan(dict):
    """One scan: the document (what `scan` prints, and the base of verify's, plan's and
    teardown's results) and, beside it, what the plan, the settle window and MPS read of the
    same moment: `procs`, the process table ({pid: record}), and `chain`, the agent's own
    ancestry. Attributes, not keys: they never reach the JSON, and a copy (dict(scan)) is the
    document alone."""

    __slots__ = ("procs", "chain")

    def __init__(self, doc, procs, chain):
        super().__init__(doc)
        self.procs = procs
        self.chain = chain


def collect(sel, source=None, confirm=False, early=None, known=None):
    """One scan (a Scan: the document, and the process table beside it). `source` (an open
    GPU reader) is reused by callers that poll. `early`: called
    with the records a target pattern names once every record is read (procscan.snapshot).

    `confirm`: the scan that confirms FREED once the GPUs read free. Where the GPU source
    lists the GPUs' processes (context_source) and lists none, and no GPU memory is used, no
    process has a CUDA context, so no fd table or mapping can change the answer: the GPUs are
    read first, and then only the process records are (what a respawn is told by). On a host of
    20,000 processes that is half the scan between "free" and the FREED line. `known`: the
    plan's records ({pid: record}); a process still the same costs one read (procscan.snapshot):
    most of a busy host, between "free" and the FREED line again."""
    started = time.monotonic()
    gpus = None
    if confirm or early is not None:  # with an early batch: before it goes out, not while the targets release
        with gpuinfo.reader(sel.gpus, source) as (source, tried):
            gpus = source.read()
    idle = confirm and gpus is not None and context_source(source.name, []) and not any(
        g["processes"] or g["used_mib"] is None or g["used_mib"] > sel.max_used_mib or g.get("unread") for g in gpus)
    mark = _target_mark(sel)
    snap = procscan.snapshot(sel.gpus.device_set(), fds=not idle, mark=mark, early=early, known=known)
    procs_done = time.monotonic()
    if gpus is None or (confirm and not idle):  # read (again) after the processes: what they hold now
        with gpuinfo.reader(sel.gpus, source) as (source, tried):
            gpus = source.read()
    gpus_done = time.monotonic()
    procs = snap["procs"]
    chain = procscan.self_chain(procs)
    me = os.getpid()
    _without_own_probe(gpus, procs, me)
    gpu_mib: dict = {}
    foreign = []
    for g in gpus:
        for p in g["processes"]:
            if p["pid"] in procs:
                gpu_mib.setdefault(p["pid"], {})[str(g["index"])] = p["used_mib"]
            else:  # NVML reports host PIDs; inside a container they are not in our /proc
                foreign.append({"pid": p["pid"], "gpu": g["index"], "used_mib": p["used_mib"]})
    holder_pids = (set(snap["holders"]) | set(gpu_mib)) - {me} - own_probes(procs, me)  # our own NVML handle,
    # our own CUDA probe's short-lived context: neither is a holder
    if known:
        _reread(procs, holder_pids, known, mark)
    now = procfs_now_ticks()
    holders = []
    lists = context_source(source.name, foreign)
    for pid in sorted(holder_pids):
        rec = procscan.detail(procs[pid], snap["holders"].get(pid, []), now_ticks=now, mapped=snap["mapped"].get(pid))
        rec["gpu_mib"] = gpu_mib.get(pid, {})
        rec["protected"] = rules.protect_reason(rec, chain, sel.protect) or _no_context(rec, lists)
        holders.append(rec)
    related = _related(procs, holder_pids, chain | {me})
    # An unreadable process might be a holder we cannot see: it blocks FREE (exit 6). Only
    # where NVML (or nvidia-smi) vouches - a CUDA context would show in its compute processes
    # - may a PROTECTED one (never signalled) be set aside; a protected name is easy to take,
    # so without such a source only PID 1 is (init: never signalled, and on some machines
    # unreadable even to root).
    vouched = source.name in ("nvml", "nvidia-smi")
    denied: list = []
    denied_protected: list = []
    for pid in snap["denied"]:
        spared = pid == 1 or (vouched and rules.protect_reason(procs[pid], chain, sel.protect))
        (denied_protected if spared else denied).append(pid)
    return Scan({
        "hostname": os.uname().nodename,  # gethostname()'s answer, without importing socket (~3 ms a call)
        "devices_glob": sel.gpus.devices,
        "devices": snap["devices"],
        "gpu_source": source.name,
        "gpu_source_tried": tried,
        "gpus": gpus,
        "holders": holders,
        "related": related,
        "foreign_gpu_pids": foreign,
        "context_source": lists,
        "denied": denied,
        "denied_protected": denied_protected,
        "proc_hidden": snap["hidden"],
        "processes_scanned": len(procs),
        "holders_read": not idle,
        "scan_workers": snap["workers"],
        "scan_ms": round((time.monotonic() - started) * 1000, 2),
        "proc_scan_ms": round((procs_done - started) * 1000, 2),
        "gpu_read_ms": round((gpus_done - procs_done) * 1000, 2),
    }, procs, chain)


def own_probes(procs, me):
    """The CUDA probe's child of this agent while it runs (procfs.OWN_PROBES, parent checked:
    a reaped pid is anyone's)."""
    return {p for p in procfs.OWN_PROBES if (procs.get(p) or {}).get("ppid") == me}


def _without_own_probe(gpus, procs, me):
    """NVML's rows without this agent's own CUDA probe: its compute process and its memory."""
    own = own_probes(procs, me)
    for g in gpus if own else ():
        mine = [p for p in g["processes"] if p["pid"] in own]
        g["processes"] = [p for p in g["processes"] if p["pid"] not in own]
        for p in mine:
            if g["used_mib"] is not None and p["used_mib"] is not None:
                g["used_mib"] = max(0, g["used_mib"] - p["used_mib"])


def _reread(procs, pids, known, mark):
    """The holders among `pids` whose record the scan took from the plan's (`known`), read
    whole again: one may have exec'd another program under the same name since (python ->
    python) or rewritten its argv, and what it runs now decides whether it is protected and
    how it is shown. Holders are few; gone by now, a holder keeps the record it was seen with."""
    for pid in pids:
        if pid in procs and procs[pid] is known.get(pid):
            procs[pid] = procscan.record_of(pid, mark) or procs[pid]


def _target_mark(sel):
    """The target patterns tried on each process where its record is read (in the scan's
    workers, on a big host: 20,000 pattern matches before the first signal are ~60 ms on one
    core); plan.build takes the answer from the record. None where the selection names no patterns."""
    if sel.match is None:
        return None
    patterns = rules.patterns_of(sel)
    return lambda info: rules.target_reason(info, patterns)


def context_source(source_name, foreign):
    """Which source says who has a CUDA context: NVML's or nvidia-smi's process lists, when
    every process they list is one of ours (in a container that does not share the node's PID
    namespace, NVML's pids are the node's and cannot be told apart: then nobody is vouched
    for, and the GPU those pids are on is not free anyway). None: no such source (fake
    devices, no driver), and a device mapping is taken for a context as before."""
    return source_name if source_name in ("nvml", "nvidia-smi") and not foreign else None


def _no_context(rec, lists):
    """A holder of real GPU nodes with no CUDA context does not keep memory from the next job:
    nvidia-smi, DCGM and every NVML client open and map the device files. With a process list
    to ask (context_source), no context means not listed on any GPU; without one, nothing
    mapped and no GPU memory."""
    if rec["gpu_mib"] or not procscan.real_devices(rec["devices"]):
        return None
    if lists:
        return "no CUDA context (%s lists no GPU process for it: a device handle, as every NVML client has)" % lists
    if rec["mapped_devices"] != []:
        return None
    return "NVML/driver handle only (no CUDA context: device files not mapped, no GPU memory)"


def _related(procs, holder_pids, skip):
    """Descendants of holders that hold no GPU themselves (e.g. a zombie or a tokenizer)."""
    kids = procscan.children_map(procs)
    out, stack = [], list(holder_pids)
    seen = set(holder_pids)
    while stack:
        for child in kids.get(stack.pop(), []):
            if child in seen or child in skip:
                continue
            seen.add(child)
            stack.append(child)
            info = procs[child]
            out.append({k: info[k] for k in ("pid", "ppid", "pgid", "state", "comm", "cmdline", "start_time")})
    return sorted(out, key=lambda r: r["pid"])


def procfs_now_ticks():
    return procscan.uptime_s() * procscan.clock_ticks()


def public(doc):
    """The document alone (a Scan's table and chain left behind), for a result to add to."""
    return dict(doc)
