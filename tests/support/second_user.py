"""A real second local user for the tests about other users: made with useradd, removed at the end.

Why real: the cases are about what the kernel lets another uid do (create a directory
first, hold an flock, plant a link, be seen in /proc). A mock would only repeat our
assumptions. Use the `second_user` fixture (tests/conftest.py offers it to every module); it skips,
saying why, where it cannot run (not root, no useradd/setpriv).

Every process it starts as that user is tracked and killed by PID at the end, before
`userdel -r` removes the user, its group and its home.
"""
from __future__ import annotations

import os
import pwd
import secrets
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass, field

import pytest

PATH = "/usr/local/bin:/usr/bin:/bin"
SBIN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass
class SecondUser:
    name: str
    uid: int
    gid: int
    home: str
    python: str = ""
    procs: list = field(default_factory=list)

    def argv(self, argv: list) -> list:
        """argv run as this user: real and effective uid/gid, its supplementary groups only."""
        if shutil.which("setpriv"):
            return ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--init-groups", "--", *argv]
        return ["runuser", "-u", self.name, "--", *argv]

    def env(self, **extra) -> dict:
        """A login-like environment: nothing of the test's own (GPU_PIVOT_*, XDG_*) leaks in."""
        env = {"HOME": self.home, "USER": self.name, "LOGNAME": self.name, "PATH": PATH, "LANG": "C.UTF-8"}
        env.update({k: str(v) for k, v in extra.items()})
        return env

    def run(self, argv: list, env: dict | None = None, **kw) -> subprocess.CompletedProcess:
        kw.setdefault("capture_output", True)
        kw.setdefault("timeout", 60)
        return subprocess.run(self.argv(argv), env=env or self.env(), cwd=self.home, **kw)

    def popen(self, argv: list, env: dict | None = None, **kw) -> subprocess.Popen:
        """argv as this user, in a session of its own as their login would start it (not in
        the test's process group, which would relate it to whatever else the test started)."""
        kw.setdefault("start_new_session", True)
        proc = subprocess.Popen(self.argv(argv), env=env or self.env(), cwd=self.home, **kw)
        self.procs.append(proc)
        return proc

    def py(self, code: str, *args: str, **kw) -> subprocess.CompletedProcess:
        """Run Python code as this user (text in and out)."""
        kw.setdefault("text", True)
        return self.run([self.python, "-c", code, *args], **kw)

    def end_processes(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    os.kill(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            proc.wait(10)
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                if stream:
                    stream.close()


def _find_python(user: SecondUser) -> str:
    """An interpreter the user can run (the test's own may sit in root's 0700 home)."""
    for cand in (sys.executable, shutil.which("python3", path=PATH), "/usr/bin/python3"):
        if cand and user.run([cand, "-c", "import sys; assert sys.version_info >= (3, 8)"]).returncode == 0:
            return cand
    pytest.skip(f"no python3 that user {user.name} can run")
    return ""


def make_user() -> SecondUser:
    if os.geteuid() != 0:
        pytest.skip("needs root: the test creates a throwaway second user with useradd")
    for tool in ("useradd", "userdel"):
        if not shutil.which(tool, path=SBIN_PATH):
            pytest.skip(f"needs {tool} to create a throwaway second user")
    if not (shutil.which("setpriv") or shutil.which("runuser")):
        pytest.skip("needs setpriv or runuser to run commands as the second user")
    name = "gpvt" + secrets.token_hex(4)
    made = subprocess.run(["useradd", "--create-home", "--user-group", "--shell", "/bin/sh", name],
                          capture_output=True, text=True, env={"PATH": SBIN_PATH, "LANG": "C"})
    if made.returncode:
        pytest.skip(f"useradd {name} failed: {made.stderr.strip()}")
    pw = pwd.getpwnam(name)
    user = SecondUser(name, pw.pw_uid, pw.pw_gid, pw.pw_dir)
    try:
        user.python = _find_python(user)
    except BaseException:
        remove_user(user)
        raise
    return user


def remove_user(user: SecondUser) -> None:
    user.end_processes()
    gone = subprocess.run(["userdel", "--remove", user.name], capture_output=True, text=True,
                          env={"PATH": SBIN_PATH, "LANG": "C"})  # whatever PATH the test set
    if gone.returncode not in (0, 12):  # 12: home could not be removed (already gone)
        raise AssertionError(f"userdel {user.name} failed ({gone.returncode}): {gone.stderr.strip()}")


@pytest.fixture
def second_user():
    """A throwaway real user: .name .uid .gid .home .python, .run/.popen/.py(argv) as that user."""
    user = make_user()
    try:
        yield user
    finally:
        remove_user(user)
