"""The end-of-command pass shared by status, verify and teardown: health, MIG and MPS.

Why one place: each of the three shows the same per-GPU health verdict (health.py), the
MIG mode and instances (mig.py) and who an MPS server serves (mps.py), read once with the
GPU reader the command already holds, after its last scan: never in the 50 ms poll loops,
which must stay cheap.
"""
import os

from ..state import lastrun
from ..wire import defaults
from . import gpuinfo, health, mig, mps, settings, xid


def annotate(doc, source, since_us=None, stuck=(), watch=None, probe=None):
    """Add health and mig to every GPU row and mps to the document (a scan.collect result).

    A hang is itself a verdict: once a driver call has not returned (source.hung, set by
    health.assess), the MIG and MPS queries are not made - each would wait on the same stuck
    driver - and those made are bounded like the health calls."""
    health.assess(doc["gpus"], source, since_us=since_us, stuck=stuck, watch=watch, probe=probe)
    source = source.opened()[0] if hasattr(type(source), "opened") else source
    migs = _nvml_bounded(source, lambda: mig.read_all(source), {}, "NVML MIG queries")
    for index, m in migs.items():
        if index < len(doc["gpus"]):
            doc["gpus"][index]["mig"] = m
    procs = doc.procs
    if getattr(source, "name", None) == gpuinfo.SandboxSource.name:  # fake GPUs: no MPS server serves them
        doc["mps"] = None
        return doc
    doc["mps"] = _nvml_bounded(source, lambda: mps.describe(procs, doc["gpus"], source), None, "NVML MPS queries")
    if getattr(source, "hung", False) and doc["mps"] is None:
        doc["mps"] = mps.describe(procs, doc["gpus"], None)  # /proc alone: no NVML call
    return doc


def annotate_settings(doc, source):
    """Add `settings` (settings.py: persistence, compute mode, clocks, power limit, MIG) to every
    GPU row: status's pass, after annotate (bounded like it, and skipped once the driver hung)."""
    source = source.opened()[0] if hasattr(type(source), "opened") else source
    found = _nvml_bounded(source, lambda: settings.read_all(source), {}, "NVML settings queries")
    for index, s in found.items():
        if index < len(doc["gpus"]):
            doc["gpus"][index]["settings"] = s
    return doc


def _nvml_bounded(source, fn, skipped, what):
    """fn() within health's call limit; `skipped` without calling when the driver already hung,
    or when this call hangs (which marks the source hung)."""
    if getattr(source, "hung", False):
        return skipped
    try:
        return health.bounded(fn, health.CALL_TIMEOUT_S, what)
    except health.Hung:
        try:
            source.hung = True  # gpuinfo skips nvmlShutdown: it would wait on the stuck call
        except AttributeError:
            pass
        return skipped


def last_teardown_since_us():
    """The start of the last teardown recorded on this host, on the kernel log's clock (us since
    boot), for the Xid window of verify and status; None without one (the log is not read then)."""
    try:
        record = lastrun.load_summary() or {}
    except Exception:
        return None
    if not record.get("started"):  # no teardown yet: strptime would import _strptime, calendar, datetime (~5 ms)
        return None
    import calendar
    import time

    try:
        started = time.strptime(record["started"], defaults.TIME_FORMAT)
    except ValueError:
        return None
    epoch = calendar.timegm(started) - (started.tm_gmtoff or 0)
    boot_epoch = time.time() - time.monotonic()
    return max(0, int((epoch - boot_epoch) * 1e6))


def mps_problems(doc, problems):
    """verify's problems with the MPS lines in place of 'compute process' / 'protected but has a
    CUDA context' for a server without clients."""
    idle = mps.idle_servers(doc.get("mps"))
    if not idle:
        return problems
    out = [p for p in problems if not any(("pid %s " % pid) in p for pid in idle)]
    for g in doc["gpus"]:
        for p in g["processes"]:
            if p["pid"] in idle:
                out.append(mps.problem_line(g["index"], p, idle[p["pid"]]))
    return out


def verify_result(doc, source, free, problems, code, probe=None):
    """verify's health pass: (code, problems) with the verdict applied (health.exit_code);
    `probe`: verify --probe's result, whose failures are health findings."""
    annotate(doc, source, since_us=last_teardown_since_us(), probe=probe)
    return health.exit_code(code, doc["gpus"]), mps_problems(doc, problems) + health.summary(doc["gpus"])


def teardown_start(source):
    """What a teardown notes when it starts: the kernel-log time and NVML's Xid watch."""
    watch = None
    if getattr(source, "name", None) == "nvml":
        watch = xid.NvmlWatch.start(source.nvml, source.handles)
        if watch.evset is None:
            watch = None
    return {"since_us": xid.now_us(), "watch": watch, "pid": os.getpid()}


def mps_quit(sel, audit, source=None, rescan=None):
    """`teardown --mps quit`, once the targets (the clients) are gone: every control daemon on
    the host is told `quit`, and its server waited for, all within defaults.MPS_QUIT_TIMEOUT_S.
    Read from a fresh scan: a server may have started (for a client) since the plan's scan. A
    daemon whose server still serves a process - an MPS client NVML lists, or an unprotected
    holder of the server's GPU - is left running: that process is outside the plan (the
    plan's targets are gone by now), and `quit` would end its CUDA work. A scoped teardown
    (--scope TEXT, --scope-uid UID) quits only the daemons of that uid whose pipe directory or
    command line holds TEXT: the scope narrows everything a teardown acts on. `rescan()`: that
    fresh scan (scan.collect; passed in by the teardown, since scan's status pass imports this
    module)."""
    doc = rescan()
    procs = doc.procs
    live = None if getattr(source, "hung", False) else source
    info = _nvml_bounded(live, lambda: mps.describe(procs, doc["gpus"], live), None, "NVML MPS queries") \
        if live is not None else None
    info = info or mps.describe(procs, doc["gpus"], None) or {"controls": [], "servers": []}
    scope, uid = sel.scope, sel.scope_uid
    info["controls"] = [c for c in info["controls"] if (uid is None or c["uid"] == uid) and (
        not scope or scope in (c["pipe_dir"] or "") or scope in (c["cmdline"] or ""))]
    return mps.quit_all(info, audit, skip=served_outside(info, doc))


def served_outside(info, doc):
    """{control pid: why} for daemons whose server still has a client: NVML's MPS clients, or
    a holder (neither MPS process nor protected) of a GPU the server is on."""
    indices = [g["index"] for g in doc["gpus"]] or sorted(
        {int(d[len("nvidia"):]) for d in map(os.path.basename, doc.get("devices") or [])
         if d.startswith("nvidia") and d[len("nvidia"):].isdigit()})
    mps_pids = {c["pid"] for c in info["controls"]} | {s["pid"] for s in info["servers"]}
    rows = {h["pid"]: h for h in doc["holders"]}
    others = [h for h in doc["holders"] if h["pid"] not in mps_pids and not h["protected"]]
    skip = {}
    for s in info["servers"]:
        if s["control"] is None:
            continue
        on = {int(k) for k in s["gpus"]} or set(health.gpus_of(rows.get(s["pid"]) or {}, indices))
        users = [c["pid"] for c in s["clients"] if c["pid"] not in mps_pids]
        users += [h["pid"] for h in others if h["pid"] not in users and set(health.gpus_of(h, indices)) & on]
        if users:
            skip[s["control"]] = "MPS server pid %s still serves pid %s (outside the plan): quit would end its work" % (
                s["pid"], ", ".join(map(str, users[:8])))
    return skip


def teardown_result(out, after_doc, source, start, code):
    """teardown's health pass on its final scan: health per GPU in out['after'], mps, the code.
    A failure here never loses the teardown's result: it is reported, and the code kept."""
    stuck = [dict(s, wchan=health.wchan(s["pid"])) for s in out.get("stuck") or []]
    try:
        annotate(after_doc, source, since_us=start["since_us"], stuck=stuck, watch=start["watch"])
    except Exception as exc:
        out["problems"] = list(out.get("problems") or []) + ["health check failed: %s: %s" % (type(exc).__name__, exc)]
        return code
    finally:
        if start["watch"] is not None:
            start["watch"].close()
    out["after"] = after_doc["gpus"]
    out["stuck"] = stuck
    out["mps"] = after_doc.get("mps")
    out["problems"] = mps_problems(after_doc, out.get("problems") or []) + health.summary(after_doc["gpus"])
    return health.exit_code(code, after_doc["gpus"])
