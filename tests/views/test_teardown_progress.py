"""What a running teardown shows, on a terminal and in a pipe.

- On a terminal (a real pty): one line rewritten in place (`\\r`, then `\\x1b[K` to erase the
  rest), counting down to SIGKILL through the grace and to the verdict through the respawn
  watch; the report then starts on a line of its own.
- In a pipe: a line per update, no `\\r`, the countdown in the grace's lines.
- Either way FREED is the verdict's word alone: the moment the GPUs read free is `free at`,
  shown once per free stretch.
Each teardown is the test's own: fake device files and its temp dir as the scope.
"""
from __future__ import annotations

import io
import os
import re
import signal
import subprocess
import sys
import tty

from scripts.views.teardown import TeardownProgress
from tests.conftest import REPO
from tests.support import scenario

KILL_IN = re.compile(r"SIGKILL in (\d+\.\d)s")


def _stubborn_server(ps, hosts_env) -> dict:
    """A server that ignores SIGTERM (it lives through the whole grace); the env to tear it down."""
    ps.server("--ignore-term", "--ignore-term-workers", tp=1)
    hosts_env("".join(f"LOCAL_{k}='{v}'\n" for k, v in dict(
        scenario.host_keys(ps), TARGETS=r"sandbox_roles\.py").items()))
    return dict(os.environ, NO_COLOR="1", TERM="xterm", COLUMNS="200")


TEARDOWN = [sys.executable, "-m", "invoke", "teardown", "--host", "local", "--yes", "--grace", "2", "--settle", "2"]


def _on_a_terminal(env: dict, argv: list = TEARDOWN, interrupt_at: str | None = None) -> tuple:
    """Run argv with stdout and stderr on a pty (raw: no \\n -> \\r\\n), in a process group of
    its own; (exit code, text). `interrupt_at`: once the output holds this text, SIGINT to the
    group, as a Ctrl-C at the terminal sends."""
    master, slave = os.openpty()
    tty.setraw(slave)
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave,
                            start_new_session=True)
    os.close(slave)
    chunks: list = []
    try:
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: every writer of the pty is gone
                break
            if not data:
                break
            chunks.append(data)
            if interrupt_at and interrupt_at.encode() in b"".join(chunks):
                os.killpg(proc.pid, signal.SIGINT)
                interrupt_at = None
        return proc.wait(60), b"".join(chunks).decode("utf-8", "replace")
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_on_a_terminal_progress_is_one_line_updated_in_place_with_a_countdown(ps, hosts_env):
    code, text = _on_a_terminal(_stubborn_server(ps, hosts_env))
    assert code == 0, text
    live, report = text.split("\n== local", 1)  # the live line, ended by one newline, then the report
    assert "\n" not in live, live  # every update rewrote the same line
    updates = [u.replace("\x1b[K", "") for u in live.split("\r") if u]
    assert len(updates) >= 3 and all(u.startswith("local: ") for u in updates), updates
    assert all(u.endswith("\x1b[K") for u in live.split("\r") if u), live
    countdown = [float(m) for u in updates for m in KILL_IN.findall(u)]
    assert countdown[0] == 2.0, updates  # at SIGTERM: the whole grace
    assert len(countdown) >= 2 and countdown == sorted(countdown, reverse=True), updates
    free = [u for u in updates if u.startswith("local: free at ")]
    assert free and "watching 2 s for a respawn before the verdict" in free[0], updates
    assert re.search(r"watching 2 s for a respawn before the verdict: \d+\.\ds left", live), updates
    assert "FREED" not in live and text.count("FREED") == 1, text
    assert "local: FREED and verified" in report


def test_in_a_pipe_progress_is_a_line_per_update(ps, hosts_env):
    env = _stubborn_server(ps, hosts_env)
    out = subprocess.run(TEARDOWN, cwd=REPO, env=env, capture_output=True, timeout=60)
    text = out.stdout.decode()
    assert out.returncode == 0, text + out.stderr.decode()
    assert "\r" not in text and "\x1b" not in text
    progress = text.split("\n== local", 1)[0].splitlines()
    grace = [line for line in progress if "] grace" in line]
    assert grace and all(KILL_IN.search(line) for line in grace), progress
    assert [line for line in progress if line.startswith("local: free at ")], progress
    assert "FREED" not in "\n".join(progress) and text.count("FREED") == 1, text


def _fed(*updates) -> list:
    out = io.StringIO()  # not a terminal: a line per update
    shown = TeardownProgress("local", 2.0, stream=out)
    for p in updates:
        shown.update(p)
    shown.done()
    return out.getvalue().splitlines()


FREE = {"phase": "free", "elapsed_s": 0.21, "free_at_s": 0.21, "settle_s": 2, "mib_left": 0}


def test_the_free_line_comes_once_per_free_stretch():
    lines = _fed(FREE, {"phase": "verify", "elapsed_s": 0.7, "problems": [], "mib_left": 0}, FREE)
    assert [line.split(",")[0] for line in lines if "free at" in line] == ["local: free at 0.21s"], lines
    # a respawn ended the stretch: the next free is news, and still not the verdict
    lines = _fed(FREE, {"phase": "verify", "elapsed_s": 0.9, "problems": ["RESPAWN pid 9"], "mib_left": 0},
                 dict(FREE, free_at_s=1.5, elapsed_s=1.5))
    assert [line.split(",")[0] for line in lines if "free at" in line] == ["local: free at 0.21s",
                                                                          "local: free at 1.50s"], lines
    assert not any("FREED" in line for line in lines)


def test_a_free_without_a_window_says_the_verdict_follows_and_not_freed():
    lines = _fed(dict(FREE, settle_s=0))
    assert " ".join(" ".join(lines).split()) == (
        "local: free at 0.21s (every GPU read free, no holder left); no respawn window to watch: the verdict "
        "follows")


def test_a_progress_line_without_numbers_is_shown_not_fatal():
    """A host's progress line is the host's word: fields that are not numbers read as 0."""
    lines = _fed({"phase": "sigterm", "elapsed_s": "soon", "alive": [1]}, {"phase": "grace", "elapsed_s": None},
                 dict(FREE, free_at_s="x", settle_s="y"))
    assert lines[0].startswith("local: [  0.00s] sigterm  SIGKILL in 2.0s"), lines
    assert any(line.startswith("local: free at 0.00s") for line in lines), lines


def test_a_ctrl_c_on_a_terminal_says_so_on_a_line_of_its_own(ps, hosts_env):
    """The live line has no newline at its end: the interruption's line must not be glued to it."""
    code, text = _on_a_terminal(_stubborn_server(ps, hosts_env), interrupt_at="SIGKILL in")
    assert code == 130, text
    assert re.search(r"\x1b\[K\ninterrupted: the teardown continues on local; see its result with", text), text
