"""The CLI leaves as soon as it is done (scripts/cli/output_guard._exit_now): Python's teardown of
an Invoke process is skipped, and nothing the program or its exit handlers still had to do is
lost: the exit code, the whole output, atexit handlers, weakref finalizers, logging's buffers.
An exception no one caught, and sys.exit with a message, leave as Python leaves."""
from __future__ import annotations

import os
import subprocess
import sys

from tests.support.paths import REPO

TASKS = """
import atexit, logging, logging.handlers, sys, weakref
from invoke import task, Exit
from scripts.cli import output_guard

output_guard.install()
OUT = {out!r}


class Noted:
    def __init__(self, path, mark=lambda path, o=open: o(path, "w").close()):
        self.path, self.mark = path, mark

    def __del__(self):  # runs only in Python's own teardown, when sys's attributes are cleared
        self.mark(self.path)


sys.fast_exit_probe = Noted(OUT + "/teardown")


def _setup():
    atexit.register(lambda: open(OUT + "/atexit", "w").close())
    weakref.finalize(Noted, lambda: open(OUT + "/finalizer", "w").close())
    log = logging.getLogger("fastexit")
    buffered = logging.handlers.MemoryHandler(1000, flushLevel=logging.CRITICAL,
                                              target=logging.FileHandler(OUT + "/log"))
    log.addHandler(buffered)
    log.warning("kept")  # in the buffer until logging shuts down
    print("x" * 200000)


@task
def code(c, n=0):
    _setup()
    if int(n):
        raise Exit(code=int(n))


@task
def message(c):
    _setup()
    sys.exit("gpu-pivot: a message on the way out")


@task
def crash(c):
    _setup()
    raise RuntimeError("uncaught")
"""


def _run(tmp_path, *words):
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    for f in out.iterdir():
        f.unlink()
    (tmp_path / "tasks.py").write_text(TASKS.format(out=str(out)))
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-m", "invoke", *words], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=60)
    return done, {f.name for f in out.iterdir()}, (out / "log").read_text() if (out / "log").exists() else ""


def test_a_cli_that_ends_leaves_at_once_with_its_code_and_loses_nothing(tmp_path):
    for words, code in ((["code"], 0), (["code", "-n", "7"], 7), (["code", "-n", "9"], 9)):
        done, files, log = _run(tmp_path, *words)
        assert done.returncode == code, done.stderr
        assert done.stdout == "x" * 200000 + "\n"  # every byte flushed
        assert {"atexit", "finalizer"} <= files and log == "kept\n"  # handlers ran, logging's buffer flushed
        assert "teardown" not in files  # Python's own teardown was skipped


def test_a_message_or_an_uncaught_exception_leaves_as_python_does(tmp_path):
    done, files, log = _run(tmp_path, "message")
    assert done.returncode == 1 and "a message on the way out" in done.stderr
    assert {"atexit", "finalizer", "teardown"} <= files and log == "kept\n"
    done, files, log = _run(tmp_path, "crash")
    assert done.returncode == 1 and "RuntimeError: uncaught" in done.stderr
    assert {"atexit", "finalizer", "teardown"} <= files and log == "kept\n"


def test_a_program_that_imports_the_tasks_is_not_armed(tmp_path):
    """pytest imports tasks.py: its own exit code must never be replaced."""
    code = ("import sys; sys.path.insert(0, %r); from scripts.cli import output_guard; output_guard.install(); "
            "print(output_guard._EXIT); sys.exit(3)" % str(REPO))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 3 and done.stdout.strip() == "[]"


def test_an_exit_whose_message_cannot_be_written_keeps_its_code(tmp_path):
    """Invoke prints an Exit's message to stderr; on a full disk that write failed and the CLI
    exited 1 ("done but not free") for a bad host name, whose code is 2."""
    hosts = tmp_path / "hosts.env"
    hosts.write_text("")
    env = dict(os.environ, GPU_PIVOT_HOSTS_FILE=str(hosts), XDG_STATE_HOME=str(tmp_path / "state"),
               GPU_PIVOT_RUN_DIR=str(tmp_path / "run"), GPU_PIVOT_SANDBOX_DIR=str(tmp_path / "sb"))
    argv = [sys.executable, "-m", "invoke", "status", "--host", "nosuch"]
    shown = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert shown.returncode == 2 and "nosuch" in shown.stderr
    with open("/dev/full", "w") as full:
        done = subprocess.run(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=full, timeout=60)
    assert done.returncode == 2
