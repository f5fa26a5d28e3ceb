"""Run a command as the only tree of namespaces of its own: the sandbox of each test worker.

Why: the agent's tests scan the whole /proc and signal what they find. On a busy machine that
/proc holds what the tests cannot foresee: a process with an empty argv[0], another root's
teardown, someone's process mapping /dev/zero (the numbers of the fake character-device GPUs),
a server on the port a test just picked. `make test` runs each pytest-xdist worker as

    python tests/support/pidns.py -- PYTHON -u -c BOOTSTRAP      (conftest.pytest_xdist_setupnodes)

and inside it:
- a PID namespace: /proc (mounted fresh) lists only the worker and what its tests start, a
  signal reaches nothing else, and when the worker ends the kernel ends all that is left;
- a network namespace with only its own loopback up: a port a test picks is free unless the
  worker's own tests use it, and no packet leaves the worker;
- a mount namespace: /run is an empty tmpfs, and /var/lib/gpu-pivot and ~/.local/state/gpu-pivot
  (where they exist) are hidden behind empty ones, so a test can neither read nor change the
  machine's gpu-pivot state; conftest.py fails a test that writes there (REAL_STATE below).

PID 1 is this file's init: it reaps every orphan at once (the machine's own init may take
seconds, REALHOSTS.md), passes SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 on to the
worker and exits with the worker's status. The launcher waits for it and dies with it; if the
launcher is killed, PR_SET_PDEATHSIG kills PID 1 and with it the namespace.

Needs root (CAP_SYS_ADMIN); `usable()` says whether this machine allows it.
"""
from __future__ import annotations

import ctypes
import fcntl
import os
import pwd
import signal
import socket
import struct
import subprocess
import sys

CLONE_NEWNS, CLONE_NEWPID, CLONE_NEWNET = 0x00020000, 0x20000000, 0x40000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 0x2, 0x4, 0x8, 0x4000, 0x40000
PR_SET_PDEATHSIG = 1
SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
ENV = "GPU_PIVOT_TEST_PIDNS"  # set inside: "1"
STATE_ENV = "GPU_PIVOT_TEST_REAL_STATE"  # inside: the real state paths, ':'-separated


def real_state() -> list[str]:
    """The machine's gpu-pivot state that no test may read or write (root's paths)."""
    home = pwd.getpwuid(os.getuid()).pw_dir
    return ["/run/gpu-pivot", "/var/lib/gpu-pivot", os.path.join(home, ".local", "state", "gpu-pivot")]


_libc = None


def _c():
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _check(_c().mount(source and source.encode(), target.encode(), fstype and fstype.encode(), ctypes.c_ulong(flags),
                      data and data.encode()), f"mount {target}")


def _loopback_up() -> None:
    """`ip link set lo up` and `ip addr add 127.0.0.2/8 dev lo label lo:1` without iproute2
    (SIOCSIFFLAGS, SIOCSIFADDR). Why the second address: getaddrinfo with AI_ADDRCONFIG (slurmd,
    slurmctld) finds no IPv4 address for a name while the only one the host has is 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        flags = struct.unpack("16sH", fcntl.ioctl(s, 0x8913, struct.pack("16sH", b"lo", 0)))[1]
        fcntl.ioctl(s, 0x8914, struct.pack("16sH", b"lo", flags | 0x1))
        addr = struct.pack("16sH2s4s8s", b"lo:1", socket.AF_INET, b"\0\0", socket.inet_aton("127.0.0.2"), b"")
        fcntl.ioctl(s, 0x8916, addr)


def _inside() -> None:
    """As PID 1 of the new namespaces: /proc, the masks, loopback."""
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    _mount("tmpfs", "/run", "tmpfs", MS_NOSUID | MS_NODEV, "mode=755")
    os.mkdir("/run/lock", 0o755)
    os.chmod("/run/lock", 0o1777)
    os.mkdir("/run/sshd", 0o755)  # sshd's privilege separation directory
    for path in real_state()[1:]:
        if os.path.isdir(path) and not os.path.islink(path):
            _mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, "mode=700")
    _loopback_up()


def _init(cmd: list[str]) -> None:
    """PID 1: start the command, reap everything, pass signals on, exit with its status. The
    worker leads a session of its own, as a login does on a host: a session left outside the
    namespace reads as 0, which the agent takes for "started from outside" (never FREED)."""
    worker = os.fork()
    if worker == 0:
        os.setsid()
        os.execvp(cmd[0], cmd)
    for sig in SIGNALS:
        signal.signal(sig, lambda s, _f: os.kill(worker, s))
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            os._exit(1)
        if pid == worker:
            code = os.waitstatus_to_exitcode(status)
            os._exit(code if code >= 0 else 128 - code)


def run(cmd: list[str]) -> int:
    """Unshare, fork PID 1 of the new namespaces, wait for it; returns its exit status."""
    _check(_c().unshare(CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET), "unshare")
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing mounted here shows outside
    os.environ[ENV] = "1"
    os.environ[STATE_ENV] = ":".join(real_state())
    child = os.fork()
    if child == 0:
        try:
            _check(_c().prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl")
            _inside()
            _init(cmd)
        except BaseException as exc:
            print(f"tests/support/pidns.py: {exc}", file=sys.stderr, flush=True)
        os._exit(70)
    for sig in SIGNALS:
        signal.signal(sig, lambda s, _f: os.kill(child, s))
    while True:
        pid, status = os.waitpid(child, 0)
        if pid == child:
            code = os.waitstatus_to_exitcode(status)
            return code if code >= 0 else 128 - code


def usable() -> str | None:
    """None when this machine lets the suite run workers in namespaces of their own, else why not."""
    if os.geteuid() != 0:
        return "not root"
    probe = subprocess.run([sys.executable, __file__, "--", "/bin/sh", "-c",
                            'test "$$" = 2 && test ! -e /run/gpu-pivot && exec true'],  # the init is 1
                           capture_output=True, text=True, timeout=60)
    if probe.returncode:
        return f"namespaces refused here ({probe.stderr.strip() or 'exit %d' % probe.returncode})"
    return None


def main(argv: list[str]) -> int:
    if not argv or argv[0] != "--" or len(argv) < 2:
        print("usage: python tests/support/pidns.py -- COMMAND [ARG...]", file=sys.stderr)
        return 2
    return run(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
