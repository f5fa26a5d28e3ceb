"""After the targets are gone: wait for the GPUs to read free, then keep watching.

Why a settle window: a supervisor (`while true; do python3 -m sglang.launch_server; done`,
a Restart=always unit we could not stop through systemd, a cron job) restarts the server
0.1 s after the last target exits, and a check made at that instant says "FREED" while
the GPU is being taken again. So free must hold for the whole window (default 2 s),
rescanning every poll. A holder that appears meanwhile is
- a new descendant of a target: signalled (the rule the plan states), and waited for;
- anything else: reported with the process that started it ("respawned by PID 812: bash
  supervise.sh") and the flag that would include it; the verdict is "not free".
A server takes seconds to import before it opens a GPU, so a restart is also caught before
it holds anything: a process started during the teardown that runs a target program (a
target pattern, or the same program as a signalled target) and is still alive at the end
makes the verdict "not free" too. It is reported, never signalled (it was not in the plan).
"Free at" (the first moment every GPU read free) and "settled at" are reported apart, and
`on_free` is called at free-at so the operator sees it then; the verdict stays the
window's: a respawn inside it still makes the teardown "not free".

Until free-at, the driver is what is waited on. Free needs every GPU to read free AND list no
compute process, no holder in the /proc scan, AND every target (adopted ones included) to
have exited: on 2xH200 (bench/exit_probe.py) the compute process list clears only with the
exit, and a process stuck in its exit can still have a GPU open after its fd table is
detached, where no scan sees it (a red team's find, on a host without NVML). The teardown
waits for that exit on the pidfds before this window starts; a target that has still not
exited when the window runs out makes the verdict "not free", with why. The source's quick
read (NVML memory and compute processes, gpuinfo.until_reads_free) is polled every 2 ms and
the full scan (/proc holders: tens of ms on a busy host) runs when it reads free, or every
FAST_WAIT_MAX_S regardless.
"""
import re
import time

from . import gpuinfo, plan, procfs, program, rules, scan, verify

PROGRESS_EVERY_S = 0.5
FAST_WAIT_MAX_S = 0.2


def _parent_text(procs, pid):
    info = procs.get(pid)
    if info is None:
        return "PID %s (gone)" % pid
    return "PID %d: %s" % (pid, info["cmdline"][:100])


def _suggest(procs, holder):
    """The --match that would include this holder's starter (or itself) next time."""
    starter = procs.get(holder["ppid"])
    who = starter if starter and holder["ppid"] != 1 and not rules.protect_reason(starter, set()) else holder
    names = [n for n, _ in program.names(who) if " " not in n and "/" not in n and not program.INTERPRETERS.match(n)]
    if not names:  # e.g. `sh -c 'while :; do ...; done'`: no program name to give
        return "stop PID %d (%s) first: it starts the holder again" % (who["pid"], who["cmdline"][:60])
    return "--match %s" % _quote(re.escape(names[0]))


def _quote(text):
    return "'%s'" % text.replace("'", "'\\''")


def appeared_report(doc, holder):
    procs = doc["_procs"]
    return {"pid": holder["pid"], "start_time": holder["start_time"], "cmdline": holder["cmdline"],
            "devices": holder["devices"], "ppid": holder["ppid"],
            "why": "appeared after the targets were gone; started by %s" % _parent_text(procs, holder["ppid"]),
            "include": _suggest(procs, holder)}


def _respawns(doc, targets, args, patterns, known):
    """Processes started during the teardown that run a target program (not yet holding a GPU)."""
    chain = doc["_chain"]
    fresh = [info for pid, info in doc["_procs"].items()  # started during the teardown: few, usually none
             if info["start_time"] >= targets.since_ticks and (pid, info["start_time"]) not in known
             and (pid, info["start_time"]) not in targets.keys and not procfs.finished(info)]
    if not fresh:
        return {}
    programs = {n for t in targets.items for n, _ in program.names(t) if " " not in n}
    out = {}
    for info in fresh:
        pid, k = info["pid"], (info["pid"], info["start_time"])
        if not plan.in_scope(info, args) or rules.protect_reason(info, chain, args.protect):
            continue
        names = {n for n, _ in program.names(info) if " " not in n}
        why = rules.target_reason(info, patterns) or (names & programs and "runs the same program as a target")
        if why:
            out[k] = {"pid": pid, "start_time": info["start_time"], "cmdline": info["cmdline"], "devices": [],
                      "ppid": info["ppid"],
                      "why": "a target program started during the teardown (%s), not holding a GPU yet; started by %s"
                             % (why, _parent_text(doc["_procs"], info["ppid"])),
                      "include": _suggest(doc["_procs"], info)}
    return out


def watch(args, source, targets, started, before=(), on_poll=None, on_free=None, timeout_s=None):
    """Poll until free for args.settle seconds, or timeout_s (default args.timeout) passes, or
    something that is not ours holds a GPU for a whole window. Free also needs every target,
    adopted ones included, to have exited (not only to be in its exit: see the module's
    docstring). `before`: (pid, start) of the holders the plan already saw (left alone or out
    of scope: not "appeared"). `on_free(free_at_s)` is called each time a free stretch
    begins. Returns a dict."""
    t0 = time.monotonic()
    timeout = args.timeout if timeout_s is None else timeout_s
    scans = 0
    free_at = None
    appeared = {}
    before = set(before)
    last_progress = 0.0
    first_foreign = None
    patterns = plan.patterns_of(args)
    respawned: dict = {}
    first_free: dict = {}  # the first free stretch's steps, for the teardown's timings
    while True:
        if free_at is None and not targets.alive(targets.items + targets.added):
            gpuinfo.until_reads_free(source, args.max_used_mib, min(FAST_WAIT_MAX_S, max(0.0, t0 + timeout -
                                                                                 time.monotonic())))
        scanned_at = time.monotonic()
        doc = scan.collect(args, source)
        scans += 1
        targets.adopt_new(doc["_procs"])
        targets.escalate(min(args.grace, 2.0))
        targets.escalate(args.grace, among=targets.items)  # one that runs after all (wait_gone's exit wait)
        for k, rec in _respawns(doc, targets, args, patterns, set(respawned) | before).items():
            respawned[k] = rec
            first_foreign = first_foreign or time.monotonic()
        for h in doc["holders"]:
            k = (h["pid"], h["start_time"])
            if h["protected"] or k in targets.keys or k in appeared or k in before:
                continue
            appeared[k] = appeared_report(doc, h)
            first_foreign = first_foreign or time.monotonic()
        free, problems = verify.evaluate(doc, args.max_used_mib)
        if targets.failed:
            free = False
            problems = problems + ["could not signal pid %s (%s: %s); it was not stopped"
                                   % (f["pid"], f["signal"], f["result"]) for f in targets.failed]
        now = time.monotonic()
        pending = targets.alive(targets.items + targets.added)
        if free and not pending:
            if free_at is None:
                free_at = scanned_at
                first_free = first_free or {
                    "confirm_proc_ms": doc.get("proc_scan_ms"), "confirm_gpu_ms": doc.get("gpu_read_ms"),
                    "confirmed_s": round(time.monotonic() - started, 3)}
                if on_free:
                    on_free(round(free_at - started, 3))
            if now - free_at >= args.settle:
                break
        else:
            free_at = None
        # also when free but an adopted process will not die (state D); a free stretch already
        # begun is watched to its whole window even past --timeout (cut short, a respawn at 1 s
        # of a 5 s window went unseen: found by a red team)
        if now - t0 >= timeout and free_at is None:
            break
        if first_foreign and not pending and now - first_foreign >= args.settle:
            free = False
            break
        if on_poll and now - last_progress >= PROGRESS_EVERY_S:  # a line a second is news; 20 are noise
            last_progress = now
            on_poll(doc, problems)
        time.sleep(verify.POLL_S)
    holding = {(h["pid"], h["start_time"]) for h in doc["holders"]}
    live_appeared = [a for k, a in appeared.items() if k in holding]
    listed = {k for k in appeared if k in holding}
    live_appeared += [r for k, r in respawned.items() if k not in listed and procfs.same_process(*k)]
    if not free and not problems and not live_appeared:  # a holder or respawn that came and went in the window
        problems = ["pid %d (%s): %s; gone by the end of the window" % (a["pid"], verify.who(a), a["why"])
                    for a in list(appeared.values()) + list(respawned.values())] or problems
    if pending and free:  # the window ran out with a target not yet exited: no holder seen is not enough
        free = False
        problems = problems + ["pid %d (%s) has not exited (%s)" % (
            t["pid"], verify.who(t),
            "in its exit" if procfs.exiting(t["pid"], t["start_time"]) else "still running") for t in pending]
    return {"free": free and not live_appeared, "doc": doc, "problems": problems, "appeared": live_appeared,
            "scans": scans, "first_free": first_free,
            "free_at_s": None if free_at is None else round(free_at - started, 3),
            "settled_at_s": round(time.monotonic() - started, 3) if free else None}
