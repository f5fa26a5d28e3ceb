"""Render a scan/verify document for people: a per-GPU table and a holder table.

Why separate: tasks stay thin, and the same views serve status, verify, plan, teardown.
"""
from __future__ import annotations

from .render import age, shorten, table


def _mib(v) -> str:
    return "?" if v is None else f"{v}"


def gpu_table(doc: dict) -> str:
    if not doc["gpus"]:
        tried = "; ".join(doc.get("gpu_source_tried") or [])
        return f"GPU memory: no source on this host ({tried or 'none tried'}); holders below come from /proc only"
    rows = []
    for g in doc["gpus"]:
        procs = ", ".join(f"{p['pid']}({_mib(p['used_mib'])})" for p in g["processes"]) or "-"
        rows.append([g["index"], shorten(g["name"], 24), _mib(g["used_mib"]), _mib(g["reserved_mib"]),
                     _mib(g["total_mib"]), procs])
    return f"GPU memory (source: {doc['gpu_source']}; MiB, used excludes reserved)\n" + \
        table(["gpu", "name", "used", "reserved", "total", "compute processes pid(MiB)"], rows, "  ")


def where(h: dict) -> str:
    if h.get("container"):
        return f"{h['container']['kind']}:{h['container']['id'][:12]}"
    return h.get("unit") or "-"


def holder_table(doc: dict) -> str:
    holders = doc["holders"]
    if not holders:
        seen = "no process it could inspect holds" if doc.get("denied") else "no process holds"
        return "\n".join([f"Holders: {seen} a GPU device" + (f" ({doc['devices_glob']})" if doc.get("devices_glob") else ""),
                          *_notes(doc, holders)])
    rows = []
    for h in holders:
        mib = sum(v for v in h["gpu_mib"].values() if v) if h["gpu_mib"] else None
        mark = f"PROTECTED: {h['protected']}" if h["protected"] else ""
        rows.append([h["pid"], h["user"], h["state"], age(h.get("age_s")), where(h), _mib(mib) if mib is not None else "-",
                     shorten(h["cmdline"], 56), mark])
    out = "Holders\n" + table(["pid", "user", "st", "age", "unit/container", "MiB", "cmdline", ""], rows, "  ")
    return "\n".join([out, *_notes(doc, holders)])


def _notes(doc: dict, holders: list) -> list:
    extra = []
    for h in holders:
        if h.get("write_files"):
            extra.append(f"  pid {h['pid']} has files open for writing: {', '.join(h['write_files'][:5])}")
    if doc.get("foreign_gpu_pids"):
        pids = ", ".join(str(p["pid"]) for p in doc["foreign_gpu_pids"])
        extra.append(f"  NVML reports pids not visible here (another PID namespace, e.g. the Proxmox node): {pids}")
    if doc.get("denied"):
        extra.append(f"  NOT INSPECTED: {len(doc['denied'])} process(es) whose open files this user cannot read "
                     f"({doc['denied'][:10]}): they may hold a GPU, so nothing is called free; run as root")
    return extra


def last_teardown(doc: dict) -> str:
    last = doc.get("last_teardown")
    if not last:
        return ""
    return (f"Last teardown on this host: {last.get('state')} {last.get('verdict') or ''} exit {last.get('exit_code')} "
            f"by {last.get('operator')} at {last.get('finished') or last.get('started')}")


def still_holding(doc: dict) -> str:
    rows = [[r["gpu"] if r["gpu"] is not None else "-", r["pid"], r["state"], _mib(r["used_mib"]), shorten(r["cmdline"], 60)]
            for r in doc.get("still_holding", [])]
    if not rows:
        return ""
    note = ""
    if any(r[2] == "D" for r in rows):
        note = "\n  state D = stuck in the driver (uninterruptible): see runbooks/gpu-memory-not-freed.md"
    return "Still holding\n" + table(["gpu", "pid", "st", "MiB", "cmdline"], rows, "  ") + note


def header(alias: str, doc: dict, sandbox: bool) -> str:
    label = "  [SANDBOX: fake GPUs on this machine]" if sandbox else ""
    return f"== {alias} ({doc['hostname']}){label}"
