"""Render a teardown plan, its progress lines and its before/after GPU table.

Why here: the same plan table is shown by `invoke plan`, before the confirmation prompt
of `invoke teardown`, and by `--dry-run`; one renderer keeps them identical.
"""
from __future__ import annotations

from .render import shorten, table
from .status_view import where


def _mib(gpu_mib: dict) -> str:
    total = sum(v for v in (gpu_mib or {}).values() if v)
    return str(total) if gpu_mib else "-"


def plan_tables(plan: dict) -> str:
    out = []
    if plan["targets"]:
        rows = [[t["pid"], t["state"], where(t), _mib(t["gpu_mib"]), t["via"], shorten(t["reason"], 40),
                 shorten(t["cmdline"], 50)] for t in plan["targets"]]
        out.append(f"Targets ({len(rows)}; will free about {plan['will_free_mib']} MiB of GPU memory)\n" +
                   table(["pid", "st", "unit/container", "MiB", "how", "why", "cmdline"], rows, "  "))
    else:
        out.append("Targets: none (nothing matches the target patterns and no unprotected process holds a GPU)")
    if plan["protected"]:
        rows = [[p["pid"], shorten(p["reason"], 48), shorten(p["cmdline"], 60)] for p in plan["protected"]]
        out.append("Protected, never signalled\n" + table(["pid", "why", "cmdline"], rows, "  "))
    if plan["left_alone"]:
        rows = [[p["pid"], _mib(p["gpu_mib"]), shorten(p["cmdline"], 60)] for p in plan["left_alone"]]
        out.append("Left alone (--only-matching) although they hold a GPU\n" + table(["pid", "MiB", "cmdline"], rows, "  "))
    for w in plan.get("writing", []):
        out.append(f"  WARNING pid {w['pid']} has files open for writing: {', '.join(w['files'][:5])}")
    for u in plan.get("units", []):
        out.append(f"  unit {u['unit']} will be stopped with systemctl{' and disabled' if u['disable'] else ''}")
    scope = plan.get("scope") or {}
    if scope.get("text") or scope.get("uid") is not None:
        out.append(f"  scope: only processes with {scope.get('text')!r} in their command line"
                   + (f", owned by uid {scope['uid']}" if scope.get("uid") is not None else ""))
    out.extend(f"  rule: {r}" for r in plan.get("rules", []))
    return "\n".join(out)


def progress_line(alias: str, p: dict) -> str:
    alive = p.get("alive")
    parts = [f"{alias}: [{p.get('elapsed_s', 0):6.2f}s] {p.get('phase')}"]
    if alive is not None:
        parts.append(f"alive {len(alive)}" + (f" ({' '.join(map(str, alive[:8]))})" if alive else ""))
    if p.get("mib_left") is not None:
        parts.append(f"GPU MiB used {p['mib_left']}")
    if p.get("problems"):
        parts.append(f"waiting on: {p['problems'][0]}")
    return "  ".join(parts)


def before_after(doc: dict) -> str:
    before = {g["index"]: g for g in doc.get("before") or []}
    after = {g["index"]: g for g in doc.get("after") or []}
    if not before and not after:
        return "GPU memory: no source on this host (device holders only)"
    rows = []
    for idx in sorted(set(before) | set(after)):
        b, a = before.get(idx, {}), after.get(idx, {})
        rows.append([idx, b.get("used_mib", "?"), a.get("used_mib", "?"), len(b.get("processes", [])),
                     len(a.get("processes", [])), a.get("total_mib", b.get("total_mib", "?"))])
    return f"GPU memory before -> after (source: {doc.get('gpu_source')})\n" + \
        table(["gpu", "used before", "used after", "procs before", "procs after", "total MiB"], rows, "  ")


def actions(doc: dict) -> str:
    recs = doc.get("actions") or []
    if not recs:
        return ""
    rows = [[r["signal"], r["pid"], r["result"], shorten(r.get("cmdline") or "", 60)] for r in recs]
    return "Actions\n" + table(["action", "pid", "result", "cmdline"], rows, "  ")


def host_line(outcome) -> str:
    """One line per host as it finishes, for a fleet teardown."""
    alias = outcome.host.alias
    if outcome.error is not None:
        return f"{alias}: UNREACHABLE: {shorten(str(outcome.error), 80)}"
    d, code = outcome.value.doc, outcome.value.code
    if d.get("locked"):
        return f"{alias}: LOCKED: {d['error']}"
    verdict = "freed" if code == 0 else "NOT FREE"
    return (f"{alias}: {verdict} {d.get('freed_mib', 0)} MiB, {len(d['plan']['targets'])} target(s) stopped, "
            f"{len(d['plan']['protected'])} protected kept, {outcome.value.wall_s:.2f}s")


def verdict_lines(alias: str, doc: dict, code: int) -> list:
    """The end of a teardown report: why it is or is not free, in the words a person acts on.

    One place for the verdict line (FREED only with exit 0, i.e. the agent saw every GPU
    free for the whole settle window, could inspect every process and sent every signal).
    """
    if doc.get("locked"):
        return [f"{alias}: LOCKED: {doc['error']}"]
    if doc.get("state_error"):
        return [f"{alias}: NOT STARTED: {doc['state_error']} (nothing was signalled)"]
    lines = []
    if doc.get("unapproved"):
        lines.append(f"  not signalled (appeared after the plan you approved): {[t['pid'] for t in doc['unapproved']]}")
    for t in doc.get("adopted") or []:
        lines.append(f"  also signalled pid {t['pid']}: {t['reason']} ({shorten(t.get('cmdline') or '', 60)})")
    for f in doc.get("signal_failures") or []:
        lines.append(f"  COULD NOT SIGNAL pid {f['pid']} ({f['signal']}: {f['result']}): it was not stopped")
    for a in doc.get("appeared") or []:
        lines.append(f"  RESPAWN pid {a['pid']} ({shorten(a['cmdline'], 60)}) {a['why']}")
        if a.get("include"):
            lines.append(f"    to include it: {a['include']}")
    for s in doc.get("stuck") or []:
        lines.append(f"  STUCK pid {s['pid']} state {s['state']} GPU MiB {s['gpu_mib']}: {s['why']}")
    for c in doc.get("concurrent_teardowns") or []:
        lines.append(f"  NOTE another user's teardown ran beside this one: pid {c['pid']} ({c['user']}): "
                     f"{shorten(c.get('cmdline') or '', 60)}")
    for e in doc.get("record_errors") or []:
        lines.append(f"  WARNING {e} (the teardown itself finished)")
    timing = f"in {doc.get('wall_s', 0):.2f}s"
    if doc.get("free_at_s") is not None:
        timing = f"free at {doc['free_at_s']:.2f}s, settled at {doc.get('settled_at_s') or 0:.2f}s " \
                 f"({doc.get('settle_s', 0):g}s watched for respawns)"
    verdict = "FREED and verified" if code == 0 else ("NOT FREE (could not inspect every process)" if code == 6
                                                      else "NOT FREE")
    plan = doc.get("plan") or {"protected": []}
    lines.append(f"{alias}: {verdict} {timing} (freed {doc.get('freed_mib', 0)} MiB, "
                 f"{doc.get('signalled', 0)} signals sent, {len(plan['protected'])} protected kept)")
    if code:
        lines.extend("  " + p for p in doc.get("problems", []))
    return lines
