"""stdout that fails (a reader that closed the pipe, a full disk): the one guard, for Invoke's
own output (`--list`, `--help`, `--version`, `TASK --help`) and for every task's.

Why: `invoke --list | head -c 10` printed a BrokenPipeError traceback and exited 1, and
`invoke --list > /dev/full` an OSError traceback and exit 1, which the exit-code table defines as "done
but not free". On Invoke's own paths, outside every task, a closed pipe now ends the program
quietly with 141 (128 + SIGPIPE, what a shell reports for a program its reader left), and a
full disk or an I/O error on stdout with one line on stderr and exit 10 (codes.EXIT_OUTPUT).
A task (guard_stdout, from scripts/cli/common.guarded) runs on to its end instead: a teardown
must not stop between freeing the GPUs and saying so.

The whole account: docs/design-notes.md (scripts/cli/output_guard.py)."""
import atexit
import errno
import os
import sys

CLOSED_PIPE = 141  # codes.EXIT_CLOSED_PIPE (tests/cli/test_hostile_output.py checks they agree)
OUTPUT_FAILED = 10  # codes.EXIT_OUTPUT
USAGE = 2  # codes.EXIT_USAGE
# A write to stdout that fails because of where stdout goes, not because of the task: a full
# disk or quota (`> /dev/full`), an I/O error, a file grown past its limit.
FAILED_WRITE = (errno.ENOSPC, errno.EIO, errno.EDQUOT, errno.EFBIG)


class GuardedStdout:
    """sys.stdout, noting the error a write or flush raised (`failed`), so the hook below knows
    a failure was stdout's and not another file's. Raised on, until a task starts (guard_stdout:
    `absorbing`): then the first BrokenPipeError (`invoke teardown | head -1`, or quitting `less`)
    or failed write (`> /dev/full`: FAILED_WRITE) points fd 1 at /dev/null and the task runs to
    its end and exits with its own code. Why: a teardown reported "agent failed" after freeing
    the GPUs, and a pivot stopped between its teardown and its start. A failed write is kept in
    `write_error`: `guarded` then ends the task with one line on stderr and exit 10
    (common.output_failed), never with a traceback and exit 1, which reads "not free"."""

    def __init__(self, stream):
        self._stream = stream
        self.failed = None
        self.absorbing = False
        self.closed_by_reader = False
        self.write_error = None
        self.written = False  # anything printed yet: a --json error document only on an empty stdout

    def _call(self, op, *args):
        try:
            return op(*args)
        except OSError as exc:
            self.failed = exc
            if not self.absorbing:
                raise
            if isinstance(exc, BrokenPipeError):
                self.closed_by_reader = True
            elif exc.errno in FAILED_WRITE:
                self.write_error = exc
            else:
                raise
        _devnull_at(self._stream.fileno())
        return None

    @property
    def gone(self):
        return self.closed_by_reader or self.write_error is not None

    def write(self, text):
        self.written = self.written or bool(text)
        if self.gone:
            return len(text)
        return self._call(self._stream.write, text)

    def flush(self):
        if not self.gone:
            self._call(self._stream.flush)

    def __getattr__(self, name):
        return getattr(self._stream, name)


def guard_stdout():
    """A task's stdout from here on: failures absorbed (GuardedStdout). With fd 1 closed at start
    (`>&-`: sys.stdout is None) fd 1 points at /dev/null first, so the task runs and exits with
    its own code."""
    if sys.stdout is None:
        _devnull_at(1)
        sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115  fd 1 lives as long as the process
    if not isinstance(sys.stdout, GuardedStdout):
        sys.stdout = GuardedStdout(sys.stdout)
    sys.stdout.absorbing = True


def _devnull_at(fd):
    """Point `fd` at /dev/null: nothing more written there fails, or goes anywhere."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    if devnull != fd:
        os.dup2(devnull, fd)
        os.close(devnull)


def _is_invoke(argv):
    """Is this interpreter running Invoke (`invoke ...`, `inv ...`, `python -m invoke ...`)?"""
    words = list(argv[1:3])
    if words[:1] == ["-m"]:
        return words[1:2] in (["invoke"], ["inv"])
    return bool(words) and os.path.basename(words[0]) in ("invoke", "inv")


def _stdout_failure(exc):
    """The exit for an exception that stdout's failure explains: 141, 10, or None."""
    if isinstance(exc, BrokenPipeError):
        return CLOSED_PIPE
    failed = getattr(sys.stdout, "failed", None)
    if isinstance(exc, OSError) and exc.errno in FAILED_WRITE and failed is exc:
        return OUTPUT_FAILED
    return None


def _leave(code, exc):
    """End now: fd 1 at /dev/null (nothing more is tried on it), one line for a failed write."""
    try:
        _devnull_at(1)
    except OSError:
        pass
    if code == OUTPUT_FAILED:
        line = "gpu-pivot: the output could not be written (%s); nothing else was done\n" % (
            os.strerror(exc.errno) if exc.errno else exc)
        try:
            os.write(2, line.encode())
        except OSError:
            pass
    os._exit(code)


def _reported_exit(exc):
    """The code of the Exit Invoke was reporting when writing its message failed (stderr on a
    full disk or a closed pipe: `invoke status --host nosuch 2>/dev/full` exited 1, "done but
    not free", for a bad host name), or None. Invoke prints an Exit's message in its handler,
    so the Exit is the failed write's context."""
    reporting = getattr(exc, "__context__", None)
    if not (isinstance(exc, BrokenPipeError) or (isinstance(exc, OSError) and exc.errno in FAILED_WRITE)):
        return None
    if type(reporting).__name__ != "Exit" or not type(reporting).__module__.startswith("invoke"):
        return None
    code = getattr(reporting, "code", None)
    return code if isinstance(code, int) and not isinstance(code, bool) else None


def _hook(kind, value, tb, default=sys.excepthook):
    code = _stdout_failure(value)
    if code is None:
        reported = _reported_exit(value)
        if reported is not None:  # the message could not be written; the code still can
            os._exit(reported & 0xFF)
        default(kind, value, tb)
        return
    _leave(code, value)


def _flush_at_exit():
    """Flush stdout before Python's own last flush (whose failure would print "Exception
    ignored" and exit 120): a buffered listing fails here, not in print(). Then, in an Invoke
    process that ended by sys.exit with a number or by returning, leave at once (_exit_now)."""
    try:
        if sys.stdout is not None:
            sys.stdout.flush()
    except OSError as exc:
        code = _stdout_failure(exc)
        if code is not None:
            _leave(code, exc)
        raise
    if _EXIT:
        _exit_now(_EXIT[0])


# The exit the program asked for, in an Invoke process (install: sys.exit is wrapped to note
# it): [code] once known; [] where leaving at once is not armed or not safe (sys.exit given a
# message, which Python prints on the way out; an exception no one caught).
_EXIT: list = []
_UNSURE = object()


def _parse_error_reported():
    """Is Invoke ending on its parser's error (sys.exit called while it handles a ParseError)?"""
    handled = sys.exc_info()[1]
    return type(handled).__name__ == "ParseError" and type(handled).__module__.startswith("invoke")


def _noting_exit(real_exit):
    def exit(code=None):  # noqa: A001 - sys.exit's own name and signature
        if code == 1 and _parse_error_reported():
            # Invoke gives its parser's errors 1, "done but not free": a command line it could not
            # read is bad input, and nothing ran (scripts/cli/parse_errors.py words most of them;
            # this is for the core flags, read before tasks.py loads: `invoke -c` without a value)
            code = USAGE
        _EXIT[:] = [code or 0] if code is None or (isinstance(code, int) and not isinstance(code, bool)) \
            else [_UNSURE]
        return real_exit(code)
    exit.__doc__ = real_exit.__doc__
    return exit


def _exit_now(code):
    """os._exit(code) once the program is done and every other exit handler has run: Python's
    own teardown of an Invoke process (~310 modules) is 40-80 ms after the last line is
    printed, and the exit is the verdict a script or an operator waits on (a teardown with
    nothing that could restart a target exits as its GPUs read free: bench/RESULTS.md 5c).
    What that teardown would still do is done here first: stderr flushed, logging shut down
    (its exit handler was registered before this one, so it would run after). Not where an
    exception went uncaught (Python has printed it, and exits 1)."""
    if code is _UNSURE or getattr(sys, "last_value", None) is not None or getattr(sys, "last_exc", None) is not None:
        return
    try:
        if sys.stderr is not None:
            sys.stderr.flush()
        if "logging" in sys.modules:
            sys.modules["logging"].shutdown()
    except Exception:
        return  # let Python's own exit report it
    os._exit(code & 0xFF)


def _invoke_process():
    """Is this interpreter Invoke itself (`invoke ...`, `inv ...`, `python -m invoke ...`), and
    not a program that imports tasks.py (pytest)?"""
    if hasattr(sys, "orig_argv"):
        return _is_invoke(sys.orig_argv)
    first = sys.argv[0] if sys.argv else ""
    return os.path.basename(first) in ("invoke", "inv") or first.endswith(os.path.join("invoke", "__main__.py"))


def install():
    """Hook this process once: the excepthook, the flush at exit, the guard on stdout; in
    Invoke itself, sys.exit noted and a normal end armed to leave at once (_exit_now), and
    the checkout's tasks found from any folder (find_tasks_from_anywhere)."""
    if getattr(sys, "_gpu_pivot_output_guard", False):
        return
    sys._gpu_pivot_output_guard = True  # type: ignore[attr-defined]
    if sys.stdout is not None and not isinstance(sys.stdout, GuardedStdout):
        sys.stdout = GuardedStdout(sys.stdout)
    sys.excepthook = _hook
    if _invoke_process():
        _EXIT[:] = [0]  # returning from the program is exit 0, as Python's own end would be
        sys.exit = _noting_exit(sys.exit)
        find_tasks_from_anywhere(sys.argv)
    atexit.register(_flush_at_exit)


CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_WHERE_FLAGS = ("-c", "--collection", "-r", "--search-root")


def find_tasks_from_anywhere(argv):
    """The venv's `invoke` run outside the checkout (`cd /tmp && .venv/bin/invoke status`)
    searched upward for a tasks.py, found none, and said only "Can't find any collection named
    'tasks'!", exit 1 ("done but not free"). Where no tasks.py is above the working folder and
    the command line names no collection or search root, the search starts at this checkout
    (`--search-root`): the same tasks, hosts.env beside them, from any folder. A folder with a
    tasks.py of its own (another project) keeps it. Changes argv in place."""
    if any(a in _WHERE_FLAGS or a.startswith(tuple(f + "=" for f in _WHERE_FLAGS if f.startswith("--")))
           for a in argv[1:]):
        return
    try:
        here = os.getcwd()
    except OSError:  # a working folder removed under us: nothing to search from
        here = "/"
    while True:
        if os.path.isfile(os.path.join(here, "tasks.py")):
            return
        parent = os.path.dirname(here)
        if parent == here:
            break
        here = parent
    if os.path.isfile(os.path.join(CHECKOUT, "tasks.py")):
        argv[1:1] = ["--search-root", CHECKOUT]


PTH_NAME = "gpu_pivot_output_guard.pth"
# One line Python runs at every start of the venv's interpreter (site.py runs a .pth line that
# begins with `import`). It costs nothing but an argv test unless the program is Invoke; then
# this file is loaded (its cached bytecode: ~0.1 ms, importlib.util being Invoke's import too).
PTH_LINE = ("import os, sys; a = getattr(sys, 'orig_argv', []); (a[1:3] in (['-m', 'invoke'], ['-m', 'inv']) or "
            "os.path.basename((a[1:2] or [''])[0]) in ('invoke', 'inv')) and os.path.isfile(%r) and exec("
            "\"import importlib.util as u; s = u.spec_from_file_location('gpu_pivot_output_guard', %r); "
            "s.loader.exec_module(u.module_from_spec(s))\")\n")


def write_pth(site_dir=None):
    """Put PTH_LINE in the venv's site-packages (`make setup` runs this: python -m
    scripts.cli.output_guard); returns the file written."""
    import site

    here = os.path.abspath(__file__)
    path = os.path.join(site_dir or site.getsitepackages()[0], PTH_NAME)
    with open(path, "w") as f:
        f.write(PTH_LINE % (here, here))
    return path


if __name__ == "gpu_pivot_output_guard" and _invoke_process():  # loaded by the .pth
    install()
elif __name__ == "__main__":
    print(write_pth())
