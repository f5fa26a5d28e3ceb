"""`python -m invoke ARGS` for the tests, forked from an interpreter that has Invoke imported.

Why: importing Invoke is 0.13 s of CPU on the 2-core CI machine (unittest.mock, asyncio, its
vendored yaml), most of a CLI start, and the suite starts the CLI over a thousand times. Here one
interpreter per test worker imports Invoke once; each call forks it, and the child becomes the
CLI: the caller's argv, environment, working directory and stdin/stdout/stderr (passed as file
descriptors), tasks.py loaded fresh, Invoke's own `__main__` run, its exit code returned. What
a user meets is the same code on the same inputs; only the interpreter's start is shared.

Where a start differs, the call is a real process instead (`exec_reasons`): an environment that
changes how Python itself starts (PYTHON*, the locale), or GPU_PIVOT_TEST_CLI=exec for the
whole run. Tests of the start itself (imports, timing, signals at start) run their own process.
tests/cli/test_cli_zygote.py compares both ways on the same commands.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

SERVER = r'''
import json, os, signal, socket, sys
import invoke, invoke.main  # the cost every real start pays: paid here once
listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
listener.bind(sys.argv[1]); listener.listen(64)
listener.settimeout(1.0)
parent = os.getppid()
print("ready", flush=True)
while True:
    try:
        conn, _ = listener.accept()
    except socket.timeout:
        if os.getppid() != parent:  # the test worker is gone: so is this server
            sys.exit(0)
        continue
    conn.settimeout(None)
    if os.fork():  # the handler forks the CLI, waits for it, reports its status; reaped below
        conn.close()
        while True:
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    break
            except ChildProcessError:
                break
        continue
    listener.close()
    msg, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
    req = json.loads(msg.decode())
    pid = os.fork()
    if pid == 0:
        conn.close()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in fds:
            if fd > 2:
                os.close(fd)
        os.environ.clear(); os.environ.update(req["env"])
        os.chdir(req["cwd"])
        sys.path[0] = req["cwd"]
        sys.argv = ["invoke"] + req["args"]
        # what site.py does at a start, as this start: each .pth line that begins with `import`
        # runs again (the output guard's reads orig_argv: it loads for `-m invoke` only)
        sys.orig_argv = [sys.executable, "-m", "invoke"] + req["args"]
        import site
        known = set(sys.path)
        for d in site.getsitepackages():
            for name in sorted(os.listdir(d)) if os.path.isdir(d) else ():
                if name.endswith(".pth"):
                    site.addpackage(d, name, known)
        import runpy
        runpy.run_module("invoke", run_name="__main__", alter_sys=True)
        sys.exit(0)
    for fd in fds:
        os.close(fd)
    conn.sendall(b"%d\n" % pid)
    _, status = os.waitpid(pid, 0)
    conn.sendall(b"%d\n" % status)
    os._exit(0)
'''

# Keys of the environment that change how an interpreter starts: a call with other values than
# the server's runs as a real process.
START_KEYS = ("LANG", "LANGUAGE")
START_PREFIXES = ("PYTHON", "LC_")


def exec_reasons(env: dict) -> list:
    """Why this call must start a real interpreter; [] when the server's start is the same."""
    if os.environ.get("GPU_PIVOT_TEST_CLI") == "exec":
        return ["GPU_PIVOT_TEST_CLI=exec"]
    keys = {k for k in {*env, *os.environ} if k in START_KEYS or k.startswith(START_PREFIXES)}
    return sorted(k for k in keys if env.get(k) != os.environ.get(k))


class Zygote:
    """The per-worker server: started at the first call, ended with the worker."""

    def __init__(self, cwd: Path):
        self.cwd = cwd
        self.dir = Path(tempfile.mkdtemp(prefix="gpu-pivot-cli-"))
        self.path = str(self.dir / "s")
        self.proc = subprocess.Popen([sys.executable, "-c", SERVER, self.path], cwd=cwd, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE)
        line = self.proc.stdout.readline()
        if line != b"ready\n":
            raise RuntimeError(f"the CLI server did not start: {line!r}")

    def run(self, args: list, env: dict, input: bytes | None, timeout: float) -> subprocess.CompletedProcess:
        stdin_r, stdin_w = os.pipe() if input is not None else (os.dup(0), None)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(self.path)
            msg = json.dumps({"args": list(args), "env": env, "cwd": str(self.cwd)}).encode()
            socket.send_fds(conn, [msg], [stdin_r, out_w, err_w])
        finally:
            for fd in (stdin_r, out_w, err_w):
                os.close(fd)
        reply = conn.makefile("rb")
        pid = int(reply.readline())
        chunks: dict = {out_r: [], err_r: []}
        if stdin_w is not None:
            threading.Thread(target=_feed, args=(stdin_w, input), daemon=True).start()
        readers = [threading.Thread(target=_drain, args=(fd, chunks[fd]), daemon=True) for fd in (out_r, err_r)]
        for t in readers:
            t.start()
        status_line: list = []
        waiter = threading.Thread(target=lambda: status_line.append(reply.readline()), daemon=True)
        waiter.start()
        waiter.join(timeout)
        if not status_line:
            os.kill(pid, signal.SIGKILL)
            waiter.join()
            for t in readers:
                t.join(5)  # a grandchild that kept stdout open: what was read by then
            conn.close()
            raise subprocess.TimeoutExpired([sys.executable, "-m", "invoke", *args], timeout,
                                            b"".join(chunks[out_r]), b"".join(chunks[err_r]))
        for t in readers:
            t.join()
        conn.close()
        status = int(status_line[0])
        code = os.waitstatus_to_exitcode(status)
        return subprocess.CompletedProcess([sys.executable, "-m", "invoke", *args], code, b"".join(chunks[out_r]),
                                           b"".join(chunks[err_r]))

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def _drain(fd: int, into: list) -> None:
    with os.fdopen(fd, "rb", buffering=0) as f:
        while chunk := f.read(65536):
            into.append(chunk)


def _feed(fd: int, data: bytes) -> None:
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
    except BrokenPipeError:
        pass


_zygote: Zygote | None = None
_guard = threading.Lock()


def run_cli(args, cwd: Path, env: dict, input: bytes | None, timeout: float) -> subprocess.CompletedProcess:
    """`python -m invoke ARGS` in cwd with env: forked from the server, or a real process (exec_reasons)."""
    global _zygote
    if exec_reasons(env):
        return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=cwd, capture_output=True, input=input,
                              env=env, timeout=timeout)
    with _guard:
        if _zygote is None or _zygote.proc.poll() is not None:
            _zygote = Zygote(cwd)
    return _zygote.run(list(args), env, input, timeout)


def stop() -> None:
    global _zygote
    if _zygote is not None:
        _zygote.stop()
        _zygote = None

