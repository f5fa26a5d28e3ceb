"""Render scan, verify and ping results for people: a per-GPU table, a holder table, verdicts.

Why separate: tasks stay thin, and the same views serve status, verify, plan and teardown.
Each view takes the contract's record (AgentResult.result: contract.ScanResult,
VerifyResult, PingResult); an agent document (a dict, as --json prints it) is read through
the contract first, in `record`, so these views never read the agent's keys themselves.
"""
from __future__ import annotations

from .agent import contract
from .render import age, shorten, table


def record(x):
    """`x` as the contract's record: a record is returned as it is; an agent document (a dict,
    which names its command) is read with contract.read_document."""
    return contract.read_document(x) if isinstance(x, dict) else x


def scan_of(x) -> contract.ScanResult:
    """The scan in a scan, verify or plan result (a record or an agent document)."""
    x = record(x)
    return getattr(x, "scan", x)


def _mib(v) -> str:
    return "?" if v is None else f"{v}"


def gpu_table(x) -> str:
    scan = scan_of(x)
    if not scan.gpus:
        tried = "; ".join(scan.gpu_source_tried)
        return f"GPU memory: no source on this host ({tried or 'none tried'}); holders below come from /proc only"
    rows = []
    for g in scan.gpus:
        procs = ", ".join(f"{p['pid']}({_mib(p['used_mib'])})" for p in g["processes"]) or "-"
        rows.append([g["index"], shorten(g["name"], 24), _mib(g["used_mib"]), _mib(g["reserved_mib"]),
                     _mib(g["total_mib"]), procs])
    return f"GPU memory (source: {scan.gpu_source}; MiB, used excludes reserved)\n" + \
        table(["gpu", "name", "used", "reserved", "total", "compute processes pid(MiB)"], rows, "  ")


def where(h: dict) -> str:
    """A process row's unit or container, for a table column."""
    if h.get("container"):
        return f"{h['container']['kind']}:{h['container']['id'][:12]}"
    return h.get("unit") or "-"


def holder_table(x) -> str:
    scan = scan_of(x)
    if not scan.holders:
        seen = "no process it could inspect holds" if scan.denied else "no process holds"
        return "\n".join([f"Holders: {seen} a GPU device" + (f" ({scan.devices_glob})" if scan.devices_glob else ""),
                          *_notes(scan)])
    rows = []
    for h in scan.holders:
        mib = sum(v for v in h["gpu_mib"].values() if v) if h["gpu_mib"] else None
        mark = f"PROTECTED: {h['protected']}" if h["protected"] else ""
        rows.append([h["pid"], h["user"], h["state"], age(h.get("age_s")), where(h),
                     _mib(mib) if mib is not None else "-", shorten(h["cmdline"], 56), mark])
    out = "Holders\n" + table(["pid", "user", "st", "age", "unit/container", "MiB", "cmdline", ""], rows, "  ")
    return "\n".join([out, *_notes(scan)])


def _notes(scan: contract.ScanResult) -> list:
    extra = []
    for h in scan.holders:
        if h.get("write_files"):
            extra.append(f"  pid {h['pid']} has files open for writing: {', '.join(h['write_files'][:5])}")
    if scan.foreign_gpu_pids:
        pids = ", ".join(str(p["pid"]) for p in scan.foreign_gpu_pids)
        extra.append(f"  NVML reports pids not visible here (another PID namespace, e.g. the Proxmox node): {pids}")
    if scan.proc_hidden:
        extra.append(f"  NOT INSPECTED: {scan.proc_hidden}: a holder may be unseen, so nothing is called free; "
                     "run as root")
    if scan.denied:
        extra.append(f"  NOT INSPECTED: {len(scan.denied)} process(es) whose open files this user cannot read "
                     f"({scan.denied[:10]}): they may hold a GPU, so nothing is called free; run as root")
    return extra


def last_teardown(x) -> str:
    last = scan_of(x).last_teardown
    if not last:
        return ""
    return (f"Last teardown on this host: {last.get('state')} {last.get('verdict') or ''} exit {last.get('exit_code')} "
            f"by {last.get('operator')} at {last.get('finished') or last.get('started')}")


def verdict(x) -> str:
    """verify's answer: FREE, or NOT FREE and each problem on its own line."""
    v = record(x)
    return "FREE: every GPU is free" if v.free else "NOT FREE:\n  " + "\n  ".join(v.problems)


def still_holding(x) -> str:
    """What still holds each GPU after a verify or a teardown that did not free it."""
    x = record(x)
    rows = [[r["gpu"] if r["gpu"] is not None else "-", r["pid"], r["state"], _mib(r["used_mib"]),
             shorten(r["cmdline"], 60)] for r in x.still_holding]
    if not rows:
        return ""
    note = ""
    if any(r[2] == "D" for r in rows):
        note = "\n  state D = stuck in the driver (uninterruptible): see runbooks/gpu-memory-not-freed.md"
    return "Still holding\n" + table(["gpu", "pid", "st", "MiB", "cmdline"], rows, "  ") + note


def header(alias: str, x, sandbox: bool) -> str:
    """`== alias (hostname)`, before each host's views; x: a scan, verify, plan or teardown result."""
    x = record(x)
    hostname = x.scan.hostname if hasattr(x, "scan") else x.hostname
    label = "  [SANDBOX: fake GPUs on this machine]" if sandbox else ""
    return f"== {alias} ({hostname}){label}"


def ping_line(alias: str, x, wall_s: float) -> str:
    """One line per host for `invoke ping`: who answered and which GPU tools it has."""
    p = record(x)

    def yes(v) -> str:
        return "yes" if v else "no"

    return (f"{alias}: {p.hostname} python {p.python} pid {p.pid} nvml={yes(p.nvml)} nvidia-smi={yes(p.nvidia_smi)} "
            f"fuser={yes(p.fuser)} devices={len(p.devices)} ({wall_s * 1000:.0f} ms)")
