"""Prove the GPUs are free: no compute process, memory at or under the threshold, no holder.

"Free" means, for every GPU: no compute process, used memory (NVML v2, excluding driver-
reserved memory) <= --max-used-mib; no non-protected process holds a device (a persistence
daemon or monitor may keep its handle, but not a CUDA context); and every process could
be inspected. A scan that could not read some process's fds (not root) cannot know they
hold nothing, so it never says free: exit 6 (contract.EXIT_UNINSPECTED) says "run as root".
With --wait S it polls every 50 ms until free or S seconds pass, then says exactly what
still holds each GPU.
"""
import time

from . import contract, gpuinfo, options, scan

POLL_S = 0.05


def add_arguments(parser):
    options.add_threshold(parser)
    parser.add_argument("--wait", type=float, default=0.0, help="poll up to this many seconds for the GPUs to be free")


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
    for h in doc["holders"]:
        if not h["protected"]:
            problems.append("pid %s (%s, state %s) holds %s" % (h["pid"], h["cmdline"][:80], h["state"],
                                                                  ", ".join(h["devices"]) or "GPU memory"))
        elif h["gpu_mib"] or h.get("mapped_devices"):
            problems.append("pid %s (%s) is protected (%s) but has a CUDA context on %s" % (
                h["pid"], h["cmdline"][:80], h["protected"], ", ".join(h["devices"]) or "the GPU"))
    if doc.get("denied"):
        problems.append(uninspected_problem(doc["denied"]))
    if doc.get("proc_hidden"):
        problems.append("%s, so a holder may be unseen and nothing is called free: run as root" % doc["proc_hidden"])
    return not problems, problems


def uninspected_problem(denied):
    return ("%d process(es) could not be inspected (their open files are not readable by this user: pids %s%s); "
            "they may hold a GPU, so nothing is called free: run as root"
            % (len(denied), ", ".join(map(str, denied[:8])), ", ..." if len(denied) > 8 else ""))


def exit_code(doc, free, max_used_mib):
    """0 free; 6 when the only thing in the way is processes that could not be inspected; else 1."""
    if free:
        return contract.EXIT_OK
    _, problems = evaluate(dict(doc, denied=[], proc_hidden=None), max_used_mib)
    uninspected = doc.get("denied") or doc.get("proc_hidden")
    return contract.EXIT_UNINSPECTED if uninspected and not problems else contract.EXIT_NOT_FREE


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


def wait_free(args, wait_s, on_poll=None, source=None):
    """Poll until free or wait_s passes; returns (free, doc, problems, waited_s).

    `source`: an open GPU reader to reuse (teardown keeps one open); else one is opened.
    """
    started = time.monotonic()
    with gpuinfo.reader(args, source) as (source, tried):
        while True:
            doc = scan.collect(args, source)
            doc["gpu_source_tried"] = tried or doc["gpu_source_tried"]
            free, problems = evaluate(doc, args.max_used_mib)
            waited = time.monotonic() - started
            if free or waited >= wait_s:
                return free, doc, problems, waited
            if on_poll:
                on_poll(doc, problems, waited)
            time.sleep(min(POLL_S, max(0.0, wait_s - waited)))


def run(args):
    free, doc, problems, waited = wait_free(args, args.wait)
    out = scan.public(doc)
    out.update(free=free, problems=problems, waited_s=round(waited, 3), max_used_mib=args.max_used_mib,
               still_holding=[] if free else still_holding(doc), uninspected=len(doc.get("denied") or []))
    return exit_code(doc, free, args.max_used_mib), out
