"""Starting the sandbox's processes, and finding them again without its directory.

Why its own module: a start that fails must kill its whole tree (not only the direct child:
its workers would live on), show the server's stderr and end in one line, not a traceback;
and removing the sandbox directory by hand must not lose its processes to `sandbox down`
(state.json goes with the directory). Here each process starts in its own session and
process group, which a failed start kills whole; its stderr goes to a log file whose tail
the one-line error shows; and each carries MEMBER_ENV=<its sandbox directory> in its
environment (inherited by its workers), an identity `down` can look for among this user's
processes when the directory is gone.
Never a name pattern: only a process of ours whose environment says it belongs to this
sandbox, checked by pid + start time before it is signalled.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from ..agent.procs import procfs

MEMBER_ENV = "GPU_PIVOT_SANDBOX_MEMBER"
START_TIMEOUT_S = 10.0


class SandboxStartError(RuntimeError):
    """A sandbox process did not start; str() is one line with its stderr's tail."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the kernel picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(path: Path | None, lines: int = 3) -> str:
    if path is None:
        return "(stderr not kept)"
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no stderr)"
    kept = [line.strip() for line in text.splitlines() if line.strip()][-lines:]
    return " | ".join(kept) or "(nothing on stderr)"


def start_detached(argv: list, ready: Path | None = None, env: dict | None = None,
                   executable: str | None = None, log: Path | None = None) -> int:
    """Start one detached process (own session and process group, no stdin/stdout to us;
    stderr to `log` when given) and wait until it writes `ready` (written whole by a
    rename, so it exists only once complete). A start that fails kills its whole process
    group (workers included) and raises SandboxStartError naming it, with stderr's tail.
    Used by the sandbox and by the tests' process sets."""
    if ready is not None:
        argv = argv + ["--ready", str(ready)]
    err = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600) if log else None
    try:
        proc = subprocess.Popen(argv, executable=executable, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL if err is None else err, start_new_session=True, env=env,
                                close_fds=True)
    finally:
        if err is not None:
            os.close(err)
    if ready is None:
        return proc.pid
    deadline = time.monotonic() + START_TIMEOUT_S
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            code = proc.poll()
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # its group is its own (new session): never another's
            except ProcessLookupError:
                pass
            proc.wait()
            why = f"exited {code}" if code is not None else f"not ready in {START_TIMEOUT_S:g}s"
            name = " ".join(str(a) for a in argv[:3])
            raise SandboxStartError(f"sandbox process `{name}` did not start ({why}); stderr: {_tail(log)}")
        time.sleep(0.01)
    return proc.pid


def member_env(base: Path, env: dict | None = None) -> dict:
    """The environment of a sandbox process: `env` (or ours) plus its membership."""
    return dict(env if env is not None else os.environ, **{MEMBER_ENV: str(base)})


def members(base: Path) -> list:
    """[(pid, start_time)] of this user's processes whose environment names `base` as their
    sandbox, ourselves excluded. Read from /proc/PID/environ (only our own are readable to
    a non-root user). Every uid of the process (real, effective, saved, fs) must be ours:
    the owner of /proc/PID is only the effective uid, so another user's setuid `su` started
    with the variable set would otherwise look like root's own."""
    want = f"{MEMBER_ENV}={base}".encode()
    uid, me = os.geteuid(), os.getpid()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        pid = int(name)
        try:
            if os.stat(f"/proc/{pid}").st_uid != uid:
                continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                environ = f.read().split(b"\0")
        except OSError:
            continue
        if want in environ and set(procfs.uids(pid) or ()) == {uid}:
            start = procfs.start_time(pid)
            if start is not None:
                found.append((pid, start))
    return found
