"""Render GPU health, MIG and CUDA MPS for people: status, verify and teardown reports.

Why apart from status_view: the same per-GPU health lines end status, verify and a
teardown's report, and they name the next step (reset, reboot, drain) and the runbook; the
verdict of a GPU row is read in one place here (gpu_health), for these lines and the fleet's.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..agent.wire import records
from .render import Col, record, shorten, table

if TYPE_CHECKING:
    from typing import Any

    from ..agent.wire.rows import GpuRow, Health, Mps, MpsQuit

RUNBOOK = "runbooks/gpu-unusable-after-teardown.md"
NEXT = {"reset needed": "invoke reset --host {alias} --gpu {gpu}", "reboot needed": "reboot the node",
        "drain": "drain peer-to-peer (NVLink) traffic, then look again",
        "not ready": "wait for the NVLink fabric (nvidia-fabricmanager), then invoke verify --probe"}


def gpu_health(row: GpuRow) -> Health:
    """{verdict, reasons} of one GPU row of a scan, verify or teardown result; 'unknown' when
    the agent did not assess it (an older agent, or a row from before the teardown)."""
    h: Health | dict[str, Any] = row.get("health") or {}
    return {"verdict": h.get("verdict") or "unknown", "reasons": list(h.get("reasons") or [])}


def _gpus(x) -> list[GpuRow]:
    """The GPU rows that carry the verdict: a teardown's after, else the scan's."""
    x = record(x)
    if isinstance(x, records.TeardownResult):
        return x.after
    return getattr(x, "scan", x).gpus


def health(x, alias: str = "HOST") -> str:
    """One row per GPU: its verdict and first reasons; the next step when it is not ok."""
    gpus = [g for g in _gpus(x) if g.get("health")]
    if not gpus:
        return ""
    rows, steps = [], []
    for g in gpus:
        h = gpu_health(g)
        rows.append([g["index"], h["verdict"].upper() if h["verdict"] not in ("ok", "unknown") else h["verdict"],
                     "; ".join(h["reasons"][:2]) or "-"])  # wrapped by the table, never cut
        if h["verdict"] in NEXT:
            steps.append(f"  GPU {g['index']}: {NEXT[h['verdict']].format(alias=alias, gpu=g['index'])}")
    out = "GPU health\n" + table(["gpu", "verdict", Col("why", "wrap", 24)], rows, "  ")  # fits COLUMNS
    if steps:
        out += "\n" + "\n".join(steps) + f"\n  see {RUNBOOK}"
    return out


def fabric(x) -> str:
    """Each GPU's NVLink fabric state where NVML read one; one line when none has a fabric."""
    read = [g for g in _gpus(x) if g.get("fabric")]
    if not read:
        return ""
    states = {g["fabric"]["state"] for g in read}
    if states == {"not supported"}:
        return "NVLink fabric: not supported on these GPUs (no fabric to wait for)"
    lines = []
    for g in read:
        f = g["fabric"]
        lines.append(f"  GPU {g['index']}: {f['state']}" + (f" ({f['status']})" if f.get("status") else "")
                     + ("" if f["state"] in ("completed", "not supported") else ": BLOCKS the next phase"))
    return "NVLink fabric\n" + "\n".join(lines)


def probe(x) -> str:
    """verify --probe: per GPU, the CUDA probe's result and time; the sandbox's stand-in says so."""
    x = record(x)
    p = getattr(x, "probe", None)
    if not p:
        return ""
    if p.get("skipped"):
        return f"CUDA probe: {p['skipped']}"
    head = f"CUDA probe ({p.get('size_mib')} MiB per GPU, {p.get('seconds', 0):.2f}s in all)"
    if p.get("stand_in"):
        head = f"CUDA probe: {p['stand_in']}"
    rows = []
    for g in getattr(x, "scan", x).gpus:
        r = g.get("probe") or {}
        if not r:
            continue
        took = f"{r['seconds']:.3f}" if r.get("seconds") is not None else "-"
        rows.append([g["index"], r.get("cuda_ordinal", "-"), r.get("state", "?").upper() if r.get("state") != "ok"
                     else "ok", took, r.get("error") or "-"])
    hidden = p.get("cuda_visible_devices")
    tail = f"\n  CUDA_VISIBLE_DEVICES={hidden} on the host: GPUs it hides are not probed" if hidden is not None else ""
    return head + "\n" + table(["gpu", "cuda", "probe", "seconds", Col("error", "wrap", 20)], rows, "  ") + tail


def probe_line(v) -> str:
    """A pivot's probe step in one line: how many GPUs proved usable and the slowest, or the
    first that did not (with its error), or that the GPUs were not free."""
    p = v.probe or {}
    gpus = [(g["index"], g.get("probe") or {}) for g in v.scan.gpus]
    if p.get("skipped") or not v.free:
        return "not probed: the GPUs are not free"
    if p.get("stand_in"):
        return p["stand_in"]
    bad = [(i, r) for i, r in gpus if r.get("state") != "ok"]
    unwell = [(g["index"], gpu_health(g)["verdict"]) for g in v.scan.gpus
              if gpu_health(g)["verdict"] not in ("ok", "unknown")]
    if bad:
        i, r = bad[0]
        return f"GPU {i} {r.get('state', '?').upper()}: {r.get('error') or '-'}" + (
            f" (+{len(bad) - 1} more)" if len(bad) > 1 else "")
    if unwell:
        return f"probe ok, but GPU {unwell[0][0]} is {unwell[0][1].upper()}"
    slowest = max((r.get("seconds") or 0.0 for _, r in gpus), default=0.0)
    return f"{len(gpus)}/{len(gpus)} GPU(s) usable ({p.get('size_mib')} MiB each; slowest {slowest:.2f}s, " \
           f"{p.get('seconds', 0):.2f}s in all)"


def mig(x) -> str:
    lines = []
    for g in _gpus(x):
        m = g.get("mig") or {}
        if m.get("current") != "enabled" and m.get("pending") != "enabled":
            continue
        inst = ", ".join(f"GI {i['gpu_instance']}/CI {i['compute_instance']} {i['used_mib']}/{i['total_mib']} MiB"
                         for i in m.get("instances") or []) or "no instances"
        lines.append(f"  GPU {g['index']}: MIG {m['current']} (pending {m.get('pending')}): {inst}")
    return "MIG\n" + "\n".join(lines) if lines else ""


def mps(x) -> str:
    x = record(x)
    info: Mps | None = x.mps if isinstance(x, records.TeardownResult) else getattr(x, "scan", x).mps
    quits: list[MpsQuit] = x.mps_quit if isinstance(x, records.TeardownResult) else []
    if not info and not quits:
        return ""
    lines = []
    for c in (info or {}).get("controls", []):
        lines.append(f"  MPS control daemon pid {c['pid']} (pipe {c['pipe_dir']}): protected")
    for s in (info or {}).get("servers", []):
        on = ", ".join(f"GPU {k} {v} MiB" for k, v in s["gpus"].items()) or "no GPU memory"
        served = ", ".join(f"pid {c['pid']} ({shorten(c['cmdline'], 40)})" for c in s["clients"])
        lines.append(f"  MPS server pid {s['pid']} ({on}) serves " + (served or "NO client (idle: it keeps its "
                                                                      "memory until --mps quit)"))
    for q in quits:
        result = "server gone" if q["servers_gone"] else f"NOT done: {q['error']}"
        lines.append(f"  --mps quit: control pid {q['control']} ({q['pipe_dir']}): {result} in {q['waited_s']}s")
    return "CUDA MPS\n" + "\n".join(lines)
