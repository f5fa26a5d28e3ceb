#!/usr/bin/python3
"""A stand-in GPU server for the real hosts: holds every /dev/nvidia* open (or those of
CUDA_VISIBLE_DEVICES), starts --workers children that hold them too, prints a line a log
reader can find, and sleeps. --ignore-term: the main process ignores SIGTERM;
--child-ignores-term: only the workers do (a worker stuck in a CUDA call); --exit-after S: exits 1
S seconds after it started (a server that crashes, for a unit's Restart=on-failure)."""
import glob
import os
import signal
import sys
import time

args = sys.argv[1:]
visible = os.environ.get("CUDA_VISIBLE_DEVICES")
paths = sorted(glob.glob("/dev/nvidia[0-9]*"))
if visible:
    paths = ["/dev/nvidia%s" % i for i in visible.split(",")]
fds = [os.open(p, os.O_RDWR) for p in paths + ["/dev/nvidiactl"]]
workers = int(args[args.index("--workers") + 1]) if "--workers" in args else 0
for _ in range(workers):
    if os.fork() == 0:
        if "--child-ignores-term" in args:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        while True:
            time.sleep(60)
if "--ignore-term" in args:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("gpu-holder %d holding %s" % (os.getpid(), " ".join(paths)), flush=True)
if "--exit-after" in args:
    time.sleep(float(args[args.index("--exit-after") + 1]))
    sys.exit(1)
while True:
    time.sleep(60)
