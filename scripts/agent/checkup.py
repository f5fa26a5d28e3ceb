"""The end-of-command pass shared by status, verify and teardown: health, MIG and MPS.

Why one place: each of the three shows the same per-GPU health verdict (health.py), the
MIG mode and instances (mig.py) and who an MPS server serves (mps.py), read once with the
GPU reader the command already holds, after its last scan: never in the 50 ms poll loops,
which must stay cheap.
"""
import os

from . import contract, health, lastrun, mig, mps, procscan, xid


def annotate(doc, source, since_us=None, stuck=(), watch=None):
    """Add health and mig to every GPU row and mps to the document (a scan.collect result)."""
    health.assess(doc["gpus"], source, since_us=since_us, stuck=stuck, watch=watch)
    for index, m in mig.read_all(source).items():
        if index < len(doc["gpus"]):
            doc["gpus"][index]["mig"] = m
    doc["mps"] = mps.describe(doc.get("_procs") or {}, doc["gpus"], source)
    return doc


def last_teardown_since_us():
    """The start of the last teardown recorded on this host, on the kernel log's clock (us since
    boot), for the Xid window of verify and status; None without one (the log is not read then)."""
    try:
        record = lastrun.load_summary() or {}
    except Exception:
        return None
    import calendar
    import time

    try:
        started = time.strptime(record.get("started") or "", contract.TIME_FORMAT)
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


def verify_result(doc, source, free, problems, code):
    """verify's health pass: (code, problems) with the verdict applied (health.exit_code)."""
    annotate(doc, source, since_us=last_teardown_since_us())
    return health.exit_code(code, doc["gpus"]), mps_problems(doc, problems) + health.summary(doc["gpus"])


def teardown_start(source):
    """What a teardown notes when it starts: the kernel-log time and NVML's Xid watch."""
    watch = None
    if getattr(source, "name", None) == "nvml":
        watch = xid.NvmlWatch.start(source.nvml, source.handles)
        if watch.evset is None:
            watch = None
    return {"since_us": xid.now_us(), "watch": watch, "pid": os.getpid()}


def mps_quit(args, audit):
    """`teardown --mps quit`, once the targets (the clients) are gone: every control daemon on
    the host is told `quit`, and its server waited for. Read from a fresh /proc table: a server
    may have started (for a client) since the plan's scan. A scoped teardown (--scope TEXT,
    --scope-uid UID) quits only the daemons of that uid whose pipe directory or command line
    holds TEXT: the scope narrows everything a teardown acts on."""
    procs = {p: i for p, i in ((p, procscan.basic(p)) for p in procscan.all_pids()) if i}
    info = mps.describe(procs, [], None) or {"controls": [], "servers": []}
    scope, uid = getattr(args, "scope", None), getattr(args, "scope_uid", None)
    info["controls"] = [c for c in info["controls"] if (uid is None or c["uid"] == uid) and (
        not scope or scope in (c["pipe_dir"] or "") or scope in (c["cmdline"] or ""))]
    return mps.quit_all(info, audit)


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
