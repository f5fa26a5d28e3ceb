"""A server with GPU memory and a large pinned host pool: how soon after the GPU first reads
free does the teardown say FREED? (issue: the exit spends seconds unpinning after that.)

Two runs of the same shape, side by side:
- floor: SIGKILL the server; NVML polled every 2 ms gives the first 0-MiB read; its exit (a
  pidfd) comes seconds later, after the unpinning.
- teardown: the agent's teardown of the same shape; the same poller; the verdict's time is
  when the call returns.
Prints one JSON document (and writes it to --out): each run's first 0-MiB read, exit and
verdict times from the signal, and verdict - first 0-MiB read (target: <= 0.3 s).

  python3 bench/exiting_pinned.py --gpu-gib 120 --pinned-gib 48 --out exiting-pinned.json
"""
import argparse
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


class Poller(threading.Thread):
    """NVML's v2 used memory of GPU 0 every 2 ms: the first moment it reads 0 MiB."""

    def __init__(self):
        super().__init__(daemon=True)
        import pynvml
        pynvml.nvmlInit()
        self.nvml, self.handle = pynvml, pynvml.nvmlDeviceGetHandleByIndex(0)
        self.zero_at = None
        self.stop = False

    def used_mib(self):
        info = self.nvml.nvmlDeviceGetMemoryInfo(self.handle, version=self.nvml.nvmlMemory_v2)
        return info.used // 2**20

    def run(self):
        while not self.stop and self.zero_at is None:
            if self.used_mib() == 0:
                self.zero_at = time.monotonic()
            time.sleep(0.002)


def start_server(token, gpu_gib, pinned_gib):
    ready = Path("/tmp/%s.ready" % token)
    ready.unlink(missing_ok=True)
    proc = subprocess.Popen([sys.executable, str(REPO / "tests" / "support" / "gpu_pinned_server.py"), "--token", token,
                             "--gpu-gib", str(gpu_gib), "--pinned-gib", str(pinned_gib), "--ready", str(ready)],
                            start_new_session=True)
    while not ready.exists():
        if proc.poll() is not None:
            raise SystemExit("the server did not start (exit %s)" % proc.returncode)
        time.sleep(0.1)
    return proc


def exit_watch(proc, t0, out):
    """The server's exit, from a pidfd, relative to t0."""
    fd = os.pidfd_open(proc.pid)
    select.select([fd], [], [])
    out["exit_s"] = round(time.monotonic() - t0, 3)
    os.close(fd)


def floor(args):
    proc = start_server("gp-pinned-floor", args.gpu_gib, args.pinned_gib)
    poller, out = Poller(), {}
    t0 = time.monotonic()
    watcher = threading.Thread(target=exit_watch, args=(proc, t0, out), daemon=True)
    poller.start()
    watcher.start()
    os.kill(proc.pid, signal.SIGKILL)
    watcher.join(120)
    poller.join(120)
    proc.wait(60)
    out["zero_s"] = round(poller.zero_at - t0, 3) if poller.zero_at else None
    return out


def teardown(args):
    from scripts.agent.wire.requests import Teardown
    from scripts.config.hostconfig import build_host
    from scripts.reach.transport import call_agent

    token = "gp-pinned-teardown"
    proc = start_server(token, args.gpu_gib, args.pinned_gib)
    host = build_host("local", {"PYTHON": sys.executable, "TARGETS": r"gpu_pinned_server\.py", "SCOPE": token},
                      "bench")
    poller, out = Poller(), {}
    t0 = time.monotonic()
    watcher = threading.Thread(target=exit_watch, args=(proc, t0, out), daemon=True)
    poller.start()
    watcher.start()
    result = call_agent(host, Teardown(grace=10, timeout=60), deadline_s=180)
    out["verdict_s"] = round(time.monotonic() - t0, 3)
    watcher.join(120)
    poller.join(120)
    proc.wait(60)
    out["zero_s"] = round(poller.zero_at - t0, 3) if poller.zero_at else None
    out["verdict_after_zero_s"] = round(out["verdict_s"] - out["zero_s"], 3) if out["zero_s"] else None
    out.update(code=result.code, verdict=result.doc.get("verdict"), free_at_s=result.doc.get("free_at_s"),
               exiting_without_gpu=result.doc.get("exiting_without_gpu"), problems=result.doc.get("problems"))
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--gpu-gib", type=float, default=120)
    p.add_argument("--pinned-gib", type=float, default=48)
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    doc = {"shape": {"gpu_gib": args.gpu_gib, "pinned_gib": args.pinned_gib},
           "floor": [floor(args) for _ in range(args.runs)], "teardown": [teardown(args) for _ in range(args.runs)]}
    text = json.dumps(doc, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
