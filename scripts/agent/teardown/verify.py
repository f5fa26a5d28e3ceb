"""Prove the GPUs are free: no compute process, memory at or under the threshold, no holder.

"Free" means, for every GPU: no compute process, used memory (NVML v2, excluding driver-
reserved memory) <= --max-used-mib; no non-protected process holds a device (a persistence
daemon or monitor may keep its handle, but not a CUDA context); and every process could
be inspected. A scan that could not read some process's fds (not root) cannot know they
hold nothing, so it never says free: exit 6 (codes.EXIT_UNINSPECTED) says "run as root".
With --wait S it waits until free or S seconds pass (wait_free: one scan, then the holders'
exits and the GPU's quick read, a new scan only when those say it may be free), then says
exactly what still holds each GPU.
"""
import time

from ..gpu import checkup, gpuinfo, mps, probe
from ..holders import scan
from ..options.record import Options
from ..policy import program
from ..procs import procfs
from ..wire import codes, defaults, records
from . import targets

POLL_S = 0.05


def add_arguments(parser):
    parser.add_argument("--wait", type=float, default=defaults.VERIFY_WAIT_S,
                        help="poll up to this many seconds for the GPUs to be free")
    parser.add_argument("--probe", action="store_true",
                        help="once free, open a CUDA context on each GPU and allocate and touch a test buffer")
    parser.add_argument("--probe-mib", type=int, default=defaults.PROBE_MIB, help="the probe's test buffer in MiB")


def evaluate(doc, max_used_mib):
    """(free, problems): each problem one line a person can act on."""
    problems = []
    if not doc["gpus"] and not doc["devices"]:
        tried = "; ".join(doc.get("gpu_source_tried") or [])
        problems.append("no GPU visible: no device file matches %s and no GPU memory source (%s)"
                        % (doc["devices_glob"], tried or doc["gpu_source"]))
    for g in doc["gpus"]:
        for p in g["processes"]:
            problems.append("GPU %s: compute process pid %s (%s MiB)" % (g["index"], p["pid"], p["used_mib"]))
        used = g["used_mib"]
        if used is not None and used > max_used_mib:
            note = " (v1 memory call: includes reserved memory)" if g.get("memory_call") == "v1" else ""
            problems.append("GPU %s: %s MiB used > %s MiB%s" % (g["index"], used, max_used_mib, note))
        for what in g.get("unread") or ():  # a query that failed (gpuinfo.read): unknown is never free
            problems.append("GPU %s: %s could not be read, so it is not called free" % (g["index"], what))
    for h in doc["holders"]:
        if not h["protected"]:
            problems.append("pid %s (%s, state %s) holds %s" % (h["pid"], who(h), h["state"],
                                                                  ", ".join(h["devices"]) or "GPU memory"))
        elif has_context(h, doc.get("context_source")):
            problems.append("pid %s (%s) is protected (%s) but has a CUDA context on %s" % (
                h["pid"], who(h), h["protected"], ", ".join(h["devices"]) or "the GPU"))
    if doc.get("denied"):
        problems.append(uninspected_problem(doc["denied"]))
    if doc.get("proc_hidden"):
        problems.append("%s, so a holder may be unseen and nothing is called free: run as root" % doc["proc_hidden"])
    return not problems, problems


def has_context(h, lists):
    """Does this (protected) holder have a CUDA context? GPU memory of its own, or, where no
    process list can say (scan.context_source), device files mapped as a CUDA client maps
    them (the MPS control daemon maps and holds none)."""
    if h["gpu_mib"]:
        return True
    return not lists and bool(h.get("mapped_devices")) and not mps.is_control(h)


def who(h):
    """The program a holder runs, for a problem line: `sglang.launch_server`, not the
    interpreter's path that a cut command line mostly shows."""
    argv = h.get("argv") or []
    return " ".join(program.program_of(argv)[0])[:80] if argv else h["cmdline"][:80]


def uninspected_problem(denied):
    return ("%d process(es) could not be inspected (their open files are not readable by this user, or their "
            "threads kept exiting while read: pids %s%s); they may hold a GPU, so nothing is called free: run as "
            "root, or again"
            % (len(denied), ", ".join(map(str, denied[:8])), ", ..." if len(denied) > 8 else ""))


def exit_code(doc, free, max_used_mib):
    """0 free; 6 when the only thing in the way is processes that could not be inspected; else 1."""
    if free:
        return codes.EXIT_OK
    _, problems = evaluate(dict(doc, denied=[], proc_hidden=None), max_used_mib)
    uninspected = doc.get("denied") or doc.get("proc_hidden")
    return codes.EXIT_UNINSPECTED if uninspected and not problems else codes.EXIT_NOT_FREE


def still_holding(doc):
    """Per GPU: what still holds it (pid, state, cmdline, MiB) for the final report."""
    holders = {h["pid"]: h for h in doc["holders"]}
    out = []
    for g in doc["gpus"]:
        for p in g["processes"]:
            h = holders.get(p["pid"], {})
            out.append({"gpu": g["index"], "pid": p["pid"], "state": h.get("state", "?"),
                        "cmdline": h.get("cmdline", "(not visible here: another PID namespace)"),
                        "used_mib": p["used_mib"]})
    for h in doc["holders"]:
        if not h["protected"] and not h["gpu_mib"]:
            out.append({"gpu": None, "pid": h["pid"], "state": h["state"], "cmdline": h["cmdline"],
                        "used_mib": None, "devices": h["devices"]})
    return out


RESCAN_EVERY_S = 0.5  # while a holder is still alive: a fresh scan (and a progress line) this often


def wait_free(sel, wait_s, on_poll=None, source=None):
    """Scan until free or wait_s passes; returns (free, doc, problems, waited_s).

    Why not a scan per 50 ms poll: a scan reads every fd of every process (tens of ms on a
    busy host). Between scans the holders the last scan found are waited on by their pidfds
    (targets.ExitWaiter: it wakes at each exit), then the GPU source's quick read is polled
    until it reads free (the driver frees memory 0.1-0.3 s after the exit); only then, or
    every RESCAN_EVERY_S, is the host scanned again, and only a scan says free.
    `source`: an open GPU reader to reuse (teardown keeps one open); else one is opened.
    """
    started = time.monotonic()
    exits = targets.ExitWaiter()
    with gpuinfo.reader(sel.gpus, source) as (source, tried):
        try:
            while True:
                scanned_at = time.monotonic()
                doc = scan.collect(sel, source)
                doc["gpu_source_tried"] = tried or doc["gpu_source_tried"]
                free, problems = evaluate(doc, sel.max_used_mib)
                waited = time.monotonic() - started
                if free or waited >= wait_s:
                    return free, doc, problems, waited
                if on_poll:
                    on_poll(doc, problems, waited)
                _until_rescan(doc, source, exits, sel.max_used_mib, scanned_at,
                              min(started + wait_s, scanned_at + RESCAN_EVERY_S))
        finally:
            exits.close()


def _until_rescan(doc, source, exits, max_used_mib, scanned_at, until):
    """Return when a new scan could say something new: every holder the scan found (not
    protected) has exited and the quick read says free; at the latest at `until`."""
    holders = [h for h in doc["holders"] if not h["protected"]]
    while True:
        now = time.monotonic()
        if now >= until:
            return
        alive = [h for h in holders if procfs.same_process(h["pid"], h["start_time"])]
        if alive:
            exits.wait(alive, until - now)
            continue
        if gpuinfo.reads_free(source, max_used_mib) is None:  # no quick read: scan at the old pace
            time.sleep(max(0.0, min(until, scanned_at + POLL_S) - now))
            return
        gpuinfo.until_reads_free(source, max_used_mib, until - now)
        return


PROGRESS_EVERY_S = 0.5  # a line a second or two is news; one per 50 ms poll is noise


def _progress(emit, wait_s):
    """on_poll for wait_free: with --progress, what --wait is waiting for (the holders that are
    not protected, GPU memory still used, the first problems) at most twice a second."""
    last = [-PROGRESS_EVERY_S]

    def on_poll(doc, problems, waited):
        if waited - last[0] < PROGRESS_EVERY_S * 0.8:  # scans come every RESCAN_EVERY_S, a little late or early
            return
        last[0] = waited
        holders = [{"pid": h["pid"], "argv": (h.get("argv") or [])[:12], "cmdline": h["cmdline"][:200]}
                   for h in doc["holders"] if not h["protected"]][:8]
        emit(phase="verify-wait", elapsed_s=round(waited, 2), wait_s=wait_s, holders=holders,
             mib_left=gpuinfo.total_used_mib(doc["gpus"]), problems=problems[:3])

    return on_poll


def run(opts: Options):
    with gpuinfo.reader(opts.gpu_source) as (source, tried):  # kept open for the health pass (checkup.py)
        on_poll = _progress(opts.emit_progress, opts.wait)
        free, doc, problems, waited = wait_free(opts.selection, opts.wait, on_poll=on_poll, source=source)
        doc["gpu_source_tried"] = tried or doc["gpu_source_tried"]
        tried_probe = _probe(opts.probe, opts.probe_mib, free, doc, source)
        code, problems = checkup.verify_result(doc, source, free, problems, exit_code(doc, free, opts.max_used_mib),
                                               probe=tried_probe)
    return code, records.written(records.VerifyResult, dict(scan.public(doc), max_used_mib=opts.max_used_mib,
                                                            uninspected=len(doc.get("denied") or [])),
                                 code=code, free=free, problems=problems, waited_s=round(waited, 3),
                                 still_holding=[] if free else still_holding(doc), probe=tried_probe)


def _probe(wanted, probe_mib, free, doc, source):
    """With --probe, the CUDA probe's result (gpu/probe.py) once every GPU is free; on GPUs that
    are not free it is not run (a context there would join another's work): it says so."""
    if not wanted:
        return None
    if not free:
        return {"skipped": "the GPUs are not free: not probed", "gpus": {}}
    return probe.run(doc["gpus"], probe_mib, source=source)
