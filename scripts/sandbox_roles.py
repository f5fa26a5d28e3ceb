#!/usr/bin/env python3
"""The processes of the sandbox host: they hold fake GPU device files like real ones do.

Roles (argv[1]):
  server   plays `python3 -m sglang.launch_server`: holds GPU 0's files and spawns one
           worker per --tp (titled `sglang::scheduler_TP<i>`, like SGLang's setproctitle)
  worker   holds GPU i's files (and nvidiactl, nvidia-uvm) until signalled
  hold     holds every device file: plays nvidia-persistenced or a GPU monitor
  idle     holds nothing: an unrelated job that must survive a teardown
Options: --devdir DIR (where the fake device files are), --gpu N, --tp N,
--ignore-term (ignore SIGTERM, like a wedged server), --ready FILE (touched when holding),
--memdir DIR --mib N (workers declare fake GPU memory for the sandbox's GPU source).
Standard library only; a sandbox stand-in, never shipped to a GPU host.
"""
import argparse
import glob
import os
import signal
import subprocess
import sys
import time

HERE = os.path.abspath(__file__)


def hold(paths):
    return [open(p, "rb") for p in paths]


def gpu_files(devdir, gpu):
    return [os.path.join(devdir, "nvidia%d" % gpu), os.path.join(devdir, "nvidiactl"), os.path.join(devdir, "nvidia-uvm")]


def declare_memory(memdir, gpu, mib):
    """Tell the sandbox's fake GPU source that this process 'uses' mib MiB on gpu."""
    with open("/proc/self/stat") as f:
        start = int(f.read().rsplit(")", 1)[1].split()[19])
    path = os.path.join(memdir, "%d.json" % os.getpid())
    with open(path, "w") as f:
        f.write('{"gpu": %d, "mib": %d, "start_time": %d}' % (gpu, mib, start))


def spawn_worker(args, i):
    gpu = args.gpu + i
    argv = ["sglang::scheduler_TP%d" % i, HERE, "worker", "--devdir", args.devdir, "--gpu", str(gpu)]
    if args.memdir:
        argv += ["--memdir", args.memdir, "--mib", str(args.mib)]
    if args.ignore_term_workers:
        argv.append("--ignore-term")
    return subprocess.Popen(argv, executable=sys.executable)


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("role", choices=["server", "worker", "hold", "idle"])
    p.add_argument("--devdir", default="")
    p.add_argument("--gpu", type=int, default=0)
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--ignore-term", action="store_true")
    p.add_argument("--ignore-term-workers", action="store_true")
    p.add_argument("--ready", default="")
    p.add_argument("--memdir", default="", help="declare fake GPU memory here (sandbox GPU source)")
    p.add_argument("--mib", type=int, default=20480)
    p.add_argument("--helpers", action="store_true",
                   help="server: also start a child that holds no GPU (a tokenizer) and a double-forked "
                        "process left in the server's process group")
    args, _unknown = p.parse_known_args(argv)  # servers get real-looking flags we ignore
    if args.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    held = []
    workers = []
    if args.role == "server":
        held = hold(gpu_files(args.devdir, args.gpu))
        workers = [spawn_worker(args, i) for i in range(args.tp)]
        if args.helpers:
            workers.append(subprocess.Popen(["sleep", "3601"]))
            mid = subprocess.Popen(["sh", "-c", "sleep 3602 & echo $! > \"$0\"", args.ready + ".grandchild"])
            mid.wait()
    elif args.role == "worker":
        held = hold(gpu_files(args.devdir, args.gpu))
        if args.memdir:
            declare_memory(args.memdir, args.gpu, args.mib)
    elif args.role == "hold":
        held = hold(sorted(glob.glob(os.path.join(args.devdir, "nvidia*"))))
    if args.ready:
        with open(args.ready, "w") as f:
            f.write(" ".join(str(w.pid) for w in workers))
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
