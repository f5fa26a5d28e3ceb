"""GPU probe: what the driver's release of a torch tree costs under the conditions a teardown creates.

Issue 15 asks for the agent's "free at" within 1.15x the floor (SIGKILL the tree, NVML reads 0).
The agent sends SIGTERM, not SIGKILL, and opens NVML (import + init) while the driver is
releasing the targets' memory. This probe times, on fresh trees, alternating:
  kill:        SIGKILL the tree, NVML already open (the floor)
  term:        SIGTERM the tree, NVML already open
  kill+init:   SIGKILL, and at the same instant another process imports pynvml and inits NVML
               (what the agent does after its signals)
  kill+watch:  kill+init, and the other process then registers NVML Xid events on every GPU, as
               the agent's health check does during the release (checkup.teardown_start)
In kill+init and kill+watch that other process then polls its fresh NVML as the agent does
(memory, and the compute process list) and reports when each first reads empty.
  init idle:   that import + init alone, the tree alive and untouched (before each kill+init)
For each kill: seconds to every tree process's leader gone (no /proc entry or a zombie), to
every process exited as the agent sees it (pidfd readable: its whole thread group is gone; a
thread on its own clock), and to every GPU reading 0 MiB (NVML v2, 2 ms poll). Medians of --reps.
Usage (GPU machine): python3 bench/exit_probe.py --reps 5 --out FILE.json
"""
from __future__ import annotations

import argparse
import json
import os
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.support.gpu_support import GpuTree, add_tree_arguments  # noqa: E402

INIT_CHILD = r"""
import sys, time
sys.stdin.readline()
t0 = time.monotonic()
import pynvml
t1 = time.monotonic()
pynvml.nvmlInit()
t2 = time.monotonic()
h = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
if "watch" in sys.argv[1:]:
    events = pynvml.nvmlEventSetCreate()
    for x in h:
        pynvml.nvmlDeviceRegisterEvents(x, pynvml.nvmlEventTypeXidCriticalError, events)
[pynvml.nvmlDeviceGetMemoryInfo(x, version=pynvml.nvmlMemory_v2).used for x in h]
t3 = time.monotonic()
mem0 = procs0 = -1.0
while "poll" in sys.argv[1:] and (mem0 < 0 or procs0 < 0) and time.monotonic() - t0 < 30:
    if mem0 < 0 and not any(pynvml.nvmlDeviceGetMemoryInfo(x, version=pynvml.nvmlMemory_v2).used for x in h):
        mem0 = time.monotonic()
    if procs0 < 0 and not any(pynvml.nvmlDeviceGetComputeRunningProcesses(x) for x in h):
        procs0 = time.monotonic()
    time.sleep(0.002)
print("%.4f %.4f %.4f %.4f %.4f %.4f" % (t0, t1 - t0, t2 - t1, t3 - t2, mem0, procs0), flush=True)
"""


def gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


def init_child(*flags):
    """`watch`: also register Xid events; `poll`: then poll until every GPU reads 0 and lists no
    compute process (what the agent's fresh NVML sees, on the shared monotonic clock)."""
    return subprocess.Popen([sys.executable, "-c", INIT_CHILD, *flags], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)


class ExitClock:
    """When every pid's thread group is gone, from pidfds polled on a thread (the agent's own
    wait): a leader can be a zombie while its other threads still release the GPU."""

    def __init__(self, pids):
        self.fds = [os.pidfd_open(p) for p in pids]
        self.at = None
        self.thread = threading.Thread(target=self._wait, daemon=True)
        self.thread.start()

    def _wait(self):
        poller, left = select.poll(), set(self.fds)
        for fd in self.fds:
            poller.register(fd, select.POLLIN)
        while left:
            for fd, _ in poller.poll(60_000):
                left.discard(fd)
                poller.unregister(fd)
        self.at = time.monotonic()

    def seconds_after(self, t0):
        self.thread.join(60)
        for fd in self.fds:
            os.close(fd)
        return None if self.at is None else self.at - t0


def init_idle() -> dict:
    child = init_child()
    time.sleep(0.3)  # let the interpreter start: only the import and init are timed
    child.stdin.write("go\n")
    child.stdin.flush()
    _, imp, init, read, _, _ = map(float, child.stdout.readline().split())
    child.wait()
    return {"import_s": imp, "init_s": init, "read_s": read}


def one(workdir, args, n, how):
    import pynvml

    tree = GpuTree(workdir, f"probe-{how}-{n}", args.children, args.gib_per_proc)
    pynvml.nvmlInit()
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    out = {"how": how}
    with_init = how in ("kill+init", "kill+watch")
    if with_init:
        out["idle"] = init_idle()
        child = init_child("poll", *(["watch"] if how == "kill+watch" else []))
        time.sleep(0.3)
    sig = signal.SIGTERM if how == "term" else signal.SIGKILL
    clock = ExitClock(list(tree.starts))
    t0 = time.monotonic()
    for pid in tree.starts:
        os.kill(pid, sig)
    if with_init:
        child.stdin.write("go\n")
        child.stdin.flush()
    t_gone = t_free = t_procs = None
    while t_gone is None or t_free is None or t_procs is None:
        now = time.monotonic() - t0
        if now > 60:
            break
        if t_gone is None and all(gone(p) for p in tree.starts):
            t_gone = now
        if t_free is None and not any(pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2).used
                                      for h in handles):
            t_free = now
        if t_procs is None and not any(pynvml.nvmlDeviceGetComputeRunningProcesses(h) for h in handles):
            t_procs = time.monotonic() - t0
        time.sleep(0.002)
    out.update(gone_s=t_gone, free_s=t_free, no_procs_s=t_procs, exited_s=clock.seconds_after(t0))
    if with_init:
        start, imp, init, read, mem0, procs0 = map(float, child.stdout.readline().split())
        child.wait()
        out["during"] = {"start_after_kill_s": start - t0, "import_s": imp, "init_s": init, "read_s": read,
                         "its_free_s": mem0 - t0 if mem0 > 0 else None,
                         "its_no_procs_s": procs0 - t0 if procs0 > 0 else None}
    pynvml.nvmlShutdown()
    tree.kill()
    return out


MODES = ("kill", "term", "kill+init", "kill+watch")


def med(values):
    values = [v for v in values if v is not None]
    return {"median": round(statistics.median(values), 4), "min": round(min(values), 4),
            "max": round(max(values), 4)} if values else None


def main():
    p = argparse.ArgumentParser()
    add_tree_arguments(p)
    args = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for n in range(args.reps):
            for how in MODES:
                rows.append(one(work, args, n, how))
                print(json.dumps(rows[-1]), flush=True)
    summary = {}
    for how in MODES:
        mine = [r for r in rows if r["how"] == how]
        summary[how] = {key: med([r[key] for r in mine]) for key in ("gone_s", "exited_s", "free_s", "no_procs_s")}
        if how != "kill" and how != "term":
            for key in ("its_free_s", "its_no_procs_s"):
                summary[how]["fresh NVML " + key] = med([r["during"][key] for r in mine])
    inits = [r for r in rows if r["how"] == "kill+init"]
    for key in ("import_s", "init_s", "read_s"):
        summary["init idle " + key] = med([r["idle"][key] for r in inits])
        summary["init during kill " + key] = med([r["during"][key] for r in inits])
    Path(args.out).write_text(json.dumps({"summary": summary, "rows": rows}, indent=1))
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
