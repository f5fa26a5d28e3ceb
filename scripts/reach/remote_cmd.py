"""`invoke run -- CMD`: an operator's command on a host, its exit code told apart from ssh's.

Why its own module: ssh exits 255 both when it cannot reach the host and when the remote
command exits 255. The command is started behind a line that only the far side can print
(route.marked), so a 255 after that line is the command's and one before it is ssh's, with
or without a ControlMaster socket. A command that does not exist exits 127 with one line,
on this machine as over ssh (no traceback). Every call has a deadline: past it the ssh
process is killed and the host counts as timed out (exit 7), and the other hosts go on.
"""
from __future__ import annotations

import shlex
import subprocess
import sys
from dataclasses import dataclass

from ..agent.wire import frame
from . import runner
from .route import marked

RUN_DEADLINE_S = 600.0  # `invoke run` default --timeout: operator commands may be long, never endless
NOT_FOUND, NOT_EXECUTABLE = 127, 126  # what a shell exits with, so `local` agrees with ssh hosts


@dataclass
class Ran:
    """One host's command: its exit code and, when captured, its output."""

    code: int
    stdout: bytes = b""
    stderr: bytes = b""


def run_on(host, argv: list, capture: bool, deadline_s: float = RUN_DEADLINE_S) -> Ran:
    """Run argv on host. capture=False: stdout and stderr pass through (the proof line is
    taken out of stderr). Raises HostUnreachable / HostTimedOut; never for the command's
    own exit code, 255 included."""
    nonce = frame.new_nonce()
    how = runner.How(stdin=subprocess.DEVNULL if capture else None, capture=capture, echo_stderr=not capture,
                     deadline_s=deadline_s if deadline_s > 0 else None)
    try:
        done = runner.run(host.route, marked(host.route, argv, nonce, host.alias), nonce, how)
    except runner.NotStarted as exc:  # only on this machine (no hops): ssh itself is always there
        return _not_started(host, argv, exc.error, capture)
    if done.cut_off or done.code is None:
        raise done.timed_out(host.alias, deadline_s, local=not host.route.hops)
    failure = done.failure(host.route, host.alias, what=shlex.quote(argv[0]))
    if failure is not None:
        raise failure
    code = done.code
    return Ran(SIGNALLED + -code if code < 0 else code, done.stdout, done.stderr.encode())


SIGNALLED = 128  # a command killed by signal N exits 128+N, as a shell reports it


def _not_started(host, argv: list, exc: OSError, capture: bool) -> Ran:
    missing = isinstance(exc, FileNotFoundError)
    why = "command not found" if missing else (exc.strerror or str(exc))
    line = f"gpu-pivot: {host.alias}: {argv[0]}: {why}\n".encode()
    code = NOT_FOUND if missing else NOT_EXECUTABLE
    if not capture:
        sys.stderr.buffer.write(line)
        sys.stderr.flush()
    return Ran(code, b"", line)
