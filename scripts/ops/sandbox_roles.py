#!/usr/bin/env python3
"""The processes of the sandbox host: they hold fake GPU device files like real ones do.

Roles (argv[1]):
  server   plays `python3 -m sglang.launch_server`: holds GPU 0's files and spawns one
           worker per --tp (titled `sglang::scheduler_TP<i>`, like SGLang's setproctitle)
  worker   holds GPU i's files (and nvidiactl, nvidia-uvm) until signalled
  hold     holds every device file: plays nvidia-persistenced or a GPU monitor
  job      holds every GPU's files and declares memory on each (a training job)
  idle     holds nothing: an unrelated job that must survive a teardown
HTTP (server, --http-port P): /health is 200 once loaded (--load-s) and when
--code-dir's server_config.json says healthy; /metrics reports sglang:num_running_reqs
counting down from --inflight; POST /generate answers one request.

The whole account: docs/design-notes.md (scripts/ops/sandbox_roles.py)."""
import argparse
import glob
import os
import signal
import subprocess
import sys
import time

HERE = os.path.abspath(__file__)


def write_new(path, text):
    """Write path whole in one step: a fresh O_EXCL temp file (0600) renamed over it, so a
    reader never sees it half written and a link planted there is replaced, never followed."""
    tmp = "%s.tmp.%d" % (path, os.getpid())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.rename(tmp, path)


def name_self():
    """comm = argv[0] when argv[0] is a bare name (how the real daemon's comm reads); a path
    (python started as itself) keeps the kernel's comm. 15 characters, as the kernel keeps."""
    try:
        with open("/proc/self/cmdline", "rb") as f:
            argv0 = f.read().split(b"\0", 1)[0].decode(errors="replace")
        if argv0 and "/" not in argv0:
            with open("/proc/self/comm", "w") as f:
                f.write(argv0[:15])
    except OSError:
        pass  # no /proc: the name in argv[0] still shows


def hold(paths):
    return [open(p, "rb") for p in paths]


def gpu_files(devdir, gpu):
    return [os.path.join(devdir, name) for name in ("nvidia%d" % gpu, "nvidiactl", "nvidia-uvm")]


def declare_memory(memdir, gpu, mib, suffix=""):
    """Tell the sandbox's fake GPU source that this process 'uses' mib MiB on gpu."""
    with open("/proc/self/stat") as f:
        start = int(f.read().rsplit(")", 1)[1].split()[19])
    path = os.path.join(memdir, "%d%s.json" % (os.getpid(), suffix))
    write_new(path, '{"gpu": %d, "mib": %d, "start_time": %d}' % (gpu, mib, start))


def map_shm(path, create):
    """Map a /dev/shm file and keep it mapped (the mapping lives as long as the process):
    created fresh (O_EXCL, 0600, 1 MiB) like an NCCL segment, or one staged before."""
    import mmap

    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_CREAT | os.O_EXCL if create else 0)
    fd = os.open(path, flags, 0o600)
    try:
        if create:
            os.ftruncate(fd, 1 << 20)
        MAPS.append(mmap.mmap(fd, 0))
        if create:
            MAPS[-1][:] = b"\x01" * len(MAPS[-1])  # written, so its pages are really used
    finally:
        os.close(fd)


MAPS: list = []  # the mappings a role keeps for its lifetime


def spawn_worker(args, i):
    gpu = args.gpu + i
    argv = ["sglang::scheduler_TP%d" % i, HERE, "worker", "--devdir", args.devdir, "--gpu", str(gpu)]
    if args.memdir:
        argv += ["--memdir", args.memdir, "--mib", str(args.mib)]
    if args.ignore_term_workers:
        argv.append("--ignore-term")
    if args.shm_tag:
        argv += ["--shm-tag", args.shm_tag]
    if args.ready:
        argv += ["--ready", "%s.w%d" % (args.ready, i)]
    return subprocess.Popen(argv, executable=sys.executable)


def wait_workers_ready(args, n):
    """The server is ready only once every worker holds its files (no race for callers)."""
    deadline = time.monotonic() + 20
    paths = ["%s.w%d" % (args.ready, i) for i in range(n)]
    while not all(os.path.exists(p) for p in paths) and time.monotonic() < deadline:
        time.sleep(0.01)


def serve_http(args):
    """A tiny OpenAI-less stand-in for a server's /health, /metrics and /generate."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    started = time.monotonic()
    healthy = True
    if args.code_dir:
        with open(os.path.join(args.code_dir, "server_config.json")) as f:
            healthy = bool(json.load(f).get("healthy", True))

    def loaded():
        return time.monotonic() - started >= args.load_s

    class Handler(BaseHTTPRequestHandler):
        def _send(self, code, body, ctype="text/plain"):
            data = body.encode()
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path == "/health":
                self._send(200 if healthy and loaded() else 503, "ok" if healthy and loaded() else "not ready")
            elif self.path == "/metrics":
                running = max(0, args.inflight - int(time.monotonic() - started))
                self._send(200, "# TYPE sglang:num_running_reqs gauge\n"
                                'sglang:num_running_reqs{model_name="sandbox"} %d\n' % running)
            else:
                self._send(404, "not found")

        def do_POST(self):
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(length)
            if self.path == "/generate" and healthy and loaded():
                self._send(200, json.dumps({"text": "SANDBOX reply"}), "application/json")
            else:
                self._send(503, "not ready")

        def log_message(self, *a):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", args.http_port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()

    def progress():
        while not loaded():
            print("Loading weights: %d%%" % min(99, int(100 * (time.monotonic() - started) / max(args.load_s, 0.01))),
                  flush=True)
            time.sleep(0.5)
        print("The server is fired up and ready to roll!" if healthy else "server error: bad config, /health fails",
              flush=True)

    threading.Thread(target=progress, daemon=True).start()


def take_role(args):
    """Hold what the role holds and start its children: (held files, worker processes)."""
    held: list = []
    workers: list = []
    if args.role == "server":
        held = hold(gpu_files(args.devdir, args.gpu))
        if args.staged:
            map_shm(args.staged, create=False)
        workers = [spawn_worker(args, i) for i in range(args.tp)]
        if args.helpers:
            workers.append(subprocess.Popen(["sleep", "3601"]))
            mid = subprocess.Popen(["sh", "-c", "sleep 3602 & echo $! > \"$0\"", args.ready + ".grandchild"])
            mid.wait()
    elif args.role == "worker":
        held = hold(gpu_files(args.devdir, args.gpu))
        if args.shm_tag:
            try:
                map_shm("/dev/shm/%s-nccl-%d" % (args.shm_tag, os.getpid()), create=True)
            except OSError:  # the name taken by another user, or no room: the worker runs without one
                pass
        if args.memdir:
            declare_memory(args.memdir, args.gpu, args.mib)
    elif args.role == "job":
        for g in range(args.gpus):
            held += hold(gpu_files(args.devdir, g))
        if args.memdir:
            for g in range(args.gpus):
                declare_memory(args.memdir, g, args.mib, suffix="-%d" % g)
    elif args.role == "hold":
        held = hold(sorted(glob.glob(os.path.join(args.devdir, "nvidia*"))))
    return held, workers


def main(argv=None):
    name_self()
    p = argparse.ArgumentParser()
    p.add_argument("role", choices=["server", "worker", "hold", "idle", "job"])
    p.add_argument("--devdir", default="")
    p.add_argument("--gpu", type=int, default=0)
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--ignore-term", action="store_true")
    p.add_argument("--ignore-term-workers", action="store_true")
    p.add_argument("--ready", default="")
    p.add_argument("--memdir", default="", help="declare fake GPU memory here (sandbox GPU source)")
    p.add_argument("--mib", type=int, default=20480)
    p.add_argument("--http-port", type=int, default=0)
    p.add_argument("--load-s", type=float, default=0.0)
    p.add_argument("--code-dir", default="")
    p.add_argument("--inflight", type=int, default=0)
    p.add_argument("--shm-tag", default="", help="worker: make and map /dev/shm/TAG-nccl-<pid>")
    p.add_argument("--staged", default="", help="server: map this file staged in /dev/shm before it started")
    p.add_argument("--gpus", type=int, default=2, help="job: how many GPUs it holds")
    p.add_argument("--helpers", action="store_true",
                   help="server: also start a child that holds no GPU (a tokenizer) and a double-forked "
                        "process left in the server's process group")
    args, _unknown = p.parse_known_args(argv)  # servers get real-looking flags we ignore
    if args.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    held, workers = take_role(args)
    if args.http_port:
        serve_http(args)
    if args.ready and args.role == "server":
        wait_workers_ready(args, args.tp)
    if args.ready:
        write_new(args.ready, " ".join(str(w.pid) for w in workers))
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
