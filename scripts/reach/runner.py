"""One runner for every command sent over a route: the agent (transport), an operator's
command (remote_cmd) and a followed log (phase_ops).

Why one: each must tell ssh's own exit 255 from the command's (a proof line only the far side
can print, route.marked: `ran`), keep ssh's own messages (its -E log), keep stderr in a file
and never a pipe (a ControlPersist master forked by this ssh keeps its stderr open for
minutes: EOF on a pipe would come only then), stop at a deadline (SIGKILL, naming a process
that outlived it) and handle Ctrl-C as the caller asks. What differs between them is only
what goes in and out (`How`).
"""
from __future__ import annotations

import os
import select
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..config.route import Route
from .route import HostTimedOut, ran_line, route_failure, wrap
from .ssh import read_ssh_log, ssh_log

KILL_WAIT_S = 5.0
END_WAIT_S = 5.0  # after SIGTERM (Ctrl-C while following), before SIGKILL


@dataclass(frozen=True)
class How:
    """What goes in and out of one command, and how it ends.

    feed: stdin is this callable's bytes, built and written on a thread after the spawn (its
      error is kept in Finished.feed_error and the command gets an empty stdin); else `stdin`
      (None: this terminal's, or subprocess.DEVNULL).
    on_line: each stdout line (bytes) as it comes, on a reader thread; its error stops the
      command and is raised. Else `capture` (stdout kept in a file: Finished.stdout), else
      this terminal's stdout.
    echo_stderr: the command's stderr lines after the proof line go to this stderr as they come.
    deadline_s: past it the local process (ssh, or the command here) is killed; None: no limit.
    own_session: a session of its own (a Ctrl-C at the terminal does not reach it).
    stop_on_interrupt: on Ctrl-C, stop the local process (SIGTERM, then SIGKILL) before re-raising.
    """

    feed: Callable[[], bytes] | None = None
    stdin: int | None = None
    on_line: Callable[[bytes], None] | None = None
    capture: bool = False
    echo_stderr: bool = False
    deadline_s: float | None = None
    own_session: bool = False
    stop_on_interrupt: bool = False


@dataclass
class Finished:
    """How one command ended. `code` is None only when it was cut off and outlived SIGKILL."""

    code: int | None
    ran: bool  # the far side started it (always, with no ssh hop)
    stderr: str  # without the proof line
    ssh_said: str  # ssh's own messages during the call ("" with no ssh hop)
    wall_s: float
    stdout: bytes = b""  # How.capture only
    cut_off: bool = False  # the deadline passed
    stuck_pid: int | None = None  # cut off and it did not die on SIGKILL
    feed_error: BaseException | None = None

    def failure(self, route: Route, alias: str, what: str = "the agent"):
        """ssh's own failure (HostUnreachable, HostTimedOut, HostKeyFailed) or sudo's refusal
        (SudoRefused) before `what` ran, or None."""
        if self.code is None:
            return None
        return route_failure(route, alias, self.code, self.ran, self.ssh_said, self.stderr, what)

    def timed_out(self, alias: str, seconds: float, local: bool) -> HostTimedOut:
        return timed_out(alias, seconds, self.ran, local=local, stuck_pid=self.stuck_pid)


class NotStarted(Exception):
    """The local program could not be started (only on this machine: ssh itself is always there)."""

    def __init__(self, program: str, error: OSError):
        super().__init__(f"could not start {program!r}: {error.strerror or error}")
        self.program, self.error = program, error


def run(route: Route, argv: list, nonce: str, how: How) -> Finished:
    """Run `argv` (already behind its proof line for `nonce`) over `route` and wait for it.

    Raises NotStarted, StateDirError (the local ssh ControlPath directory was refused), the
    on_line handler's error, or KeyboardInterrupt; never for the command's exit code."""
    mark = ran_line(nonce).encode()
    with ssh_log(route.ssh) as log, scratch_file() as err, _stdout_file(how) as out:
        cmd = wrap(route, argv, ssh_log=log.path if log else None)
        started = time.monotonic()
        try:
            proc = subprocess.Popen(cmd, stdin=subprocess.PIPE if how.feed else how.stdin,
                                    stdout=subprocess.PIPE if how.on_line else out, stderr=err,
                                    start_new_session=how.own_session)
        except OSError as exc:
            raise NotStarted(cmd[0], exc) from None
        io = _Io(proc, how, _Follower(err, mark, ran=route.ssh is None, echo=how.echo_stderr))
        try:
            done = _wait(proc, how, io)
        finally:
            io.follower.stop()
        stdout = b""
        if out is not None:
            out.seek(0)
            stdout = out.read()
        ssh_said = read_ssh_log(log)
    if io.line_error:
        raise io.line_error[0]
    stderr = io.follower.text()
    done.update(ran=io.follower.ran or route.ssh is None or mark.decode() in stderr, stderr=stderr,
                ssh_said=ssh_said, wall_s=time.monotonic() - started, stdout=stdout,
                feed_error=io.feed_error[0] if io.feed_error else None)
    return Finished(**done)


def _stdout_file(how: How):
    import contextlib

    return scratch_file() if how.capture and not how.on_line else contextlib.nullcontext()


def scratch_file():
    """An unnamed read-write file, gone once closed, for a command's stderr (and captured stdout).
    Why not tempfile.TemporaryFile: importing tempfile brings shutil, random, bz2 and lzma (~3.5 ms)
    into every call; on Linux the same file is one open with O_TMPFILE, as TemporaryFile makes it.
    Where that is refused (another kernel, a /tmp that cannot), tempfile's own."""
    tmp = next((os.environ[k] for k in ("TMPDIR", "TEMP", "TMP") if os.environ.get(k)), "/tmp")
    flag = getattr(os, "O_TMPFILE", 0)
    if flag:
        try:
            fd = os.open(tmp, flag | os.O_RDWR | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError:
            pass
        else:
            return open(fd, "w+b")  # noqa: SIM115  the caller closes it (a with block)
    import tempfile

    return tempfile.TemporaryFile()


def _wait(proc, how: How, io: _Io) -> dict:
    """Wait for the exit, the deadline or Ctrl-C: {code, cut_off, stuck_pid}."""
    code: int | None
    try:
        code = wait_exit(proc, how.deadline_s)
        done: dict = {"code": code}
    except subprocess.TimeoutExpired:
        code = kill_and_reap(proc)
        done = {"code": code, "cut_off": True, "stuck_pid": proc.pid if code is None else None}
    except KeyboardInterrupt:
        if how.stop_on_interrupt:
            end(proc)
        raise
    # EOF follows the exit; never wait on a pipe another process holds (nor on one a process
    # that outlived SIGKILL still holds: it gave no answer, and the line says so)
    if io.reader is not None:
        io.reader.join(timeout=5 if code is not None else 0.2)
    return done


def wait_exit(proc: subprocess.Popen, timeout: float | None) -> int:
    """proc.wait(timeout), woken by the exit itself. Why: Popen.wait with a timeout polls,
    its sleeps doubling to 50 ms, so a verdict that took seconds reached the caller up to 50 ms
    after the agent had exited; a pidfd is readable the moment the process ends (Linux 5.3+;
    elsewhere, or when one cannot be opened, Popen's own wait). poll(), not select(): a fleet's
    CLI may hold over 1024 fds (each host's pipes, files and log), and select refuses an fd
    numbered past FD_SETSIZE. Raises TimeoutExpired."""
    if timeout is None or proc.returncode is not None:  # reaped: its pid may name another process now
        return proc.wait()
    try:
        pidfd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):  # an older kernel, no fds left, or already reaped
        return proc.wait(timeout=timeout)
    try:
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        ready = poller.poll(min(max(0, int(timeout * 1000) + 1), 2**31 - 1))  # ms, rounded up
    except (ValueError, OverflowError, OSError):  # cannot be polled here: Popen's own wait
        ready = None
    finally:
        os.close(pidfd)
    if ready is None:
        return proc.wait(timeout=timeout)
    if not ready:
        raise subprocess.TimeoutExpired(proc.args, timeout)
    return proc.wait()


@dataclass
class _Io:
    """The threads around one process: stdin's feeder, stdout's reader, stderr's follower."""

    proc: subprocess.Popen
    how: How
    follower: _Follower
    reader: threading.Thread | None = None
    feed_error: list = field(default_factory=list)
    line_error: list = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.how.feed is not None:
            threading.Thread(target=self._feed, daemon=True).start()
        if self.how.on_line is not None:
            self.reader = threading.Thread(target=self._read, daemon=True)
            self.reader.start()

    def _feed(self) -> None:
        assert self.how.feed is not None and self.proc.stdin is not None
        try:
            payload = self.how.feed()
        except Exception as exc:  # noqa: BLE001  the caller reports it once the command has stopped
            self.feed_error.append(exc)
            payload = b""
        try:
            self.proc.stdin.write(payload)
            self.proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass  # the far side exited early; its exit code and stderr say why

    def _read(self) -> None:
        assert self.how.on_line is not None and self.proc.stdout is not None
        try:
            for raw in self.proc.stdout:
                self.how.on_line(raw)
        except Exception as exc:  # noqa: BLE001  e.g. a closed stdout (`logs --follow | head`): raised by run
            self.line_error.append(exc)
            end(self.proc)


class _Follower:
    """Reads the stderr file as it grows, line by line, on a thread: the proof line is dropped
    (noting it was seen), the rest kept. Echoing, lines after it pass on at once (a long
    command's errors show as they come); lines before it are ssh's or the login shell's,
    kept for the one line that says why the host was not reached."""

    def __init__(self, err, mark: bytes, ran: bool, echo: bool):
        self.err, self.mark, self.ran, self.echo = err, mark, ran, echo
        self.kept: list = []
        self.partial = b""
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._follow, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        """Read what is left, then end."""
        self.done.set()
        self.thread.join()

    def text(self) -> str:
        return b"".join(self.kept).decode("utf-8", "replace")

    def _follow(self) -> None:
        pos = 0
        while True:
            finished = self.done.is_set()
            try:
                chunk = os.pread(self.err.fileno(), 65536, pos)
            except (OSError, ValueError):  # the file closed under it (Ctrl-C ends the call): nothing more to read
                return
            if chunk:
                pos += len(chunk)
                *lines, self.partial = (self.partial + chunk).split(b"\n")
                for line in lines:
                    self._line(line + b"\n")
                continue
            if finished:
                if self.partial:
                    self._line(self.partial)
                return
            self.done.wait(0.05)

    def _line(self, line: bytes) -> None:
        if not self.ran and line.rstrip(b"\n") == self.mark:
            self.ran = True
            return
        self.kept.append(line)
        if self.echo and self.ran:
            os.write(2, line)


def kill_and_reap(proc) -> int | None:
    """SIGKILL a process this CLI started and reap it: its exit code, or None when it has not
    died KILL_WAIT_S later. Why not wait for ever: a process in the kernel's uninterruptible
    sleep (state D: a call into a hung NFS or FUSE mount, or into a driver) dies only when that
    call returns, and the CLI must not hang past its own deadline waiting for it."""
    proc.kill()
    try:
        return proc.wait(KILL_WAIT_S)
    except subprocess.TimeoutExpired:
        return None


def end(proc) -> None:
    """Stop a local process (ssh, or a command here) and reap it: SIGTERM, then SIGKILL."""
    proc.terminate()
    try:
        proc.wait(timeout=END_WAIT_S)
    except subprocess.TimeoutExpired:
        kill_and_reap(proc)


def timed_out(alias: str, seconds: float, ran: bool, local: bool = False, stuck_pid: int | None = None) -> HostTimedOut:
    """The one line for a call cut off at its deadline: whether the host had started it.
    On this machine (`local`: no ssh) the process itself was killed, so nothing goes on;
    unless it did not die (`stuck_pid`): then it says so, and that it may still hold the lock."""
    if stuck_pid is not None:
        return HostTimedOut(f"{alias}: timed out: no answer within {seconds:g}s, and pid {stuck_pid} did not stop "
                            "on SIGKILL: it is stuck in the kernel (state D: a hung NFS or FUSE mount, or a driver "
                            "call) and holds what it held, the host's teardown lock too, until that call returns")
    if local:
        return HostTimedOut(f"{alias}: timed out: no answer within {seconds:g}s; the command was stopped "
                            "(see `invoke status`); raise it with --timeout")
    where = ("it had started on the host and may still finish there" if ran
             else "no sign it started there")
    return HostTimedOut(f"{alias}: host timed out: no answer within {seconds:g}s; {where}; raise it with --timeout")
