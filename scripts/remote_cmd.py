"""`invoke run -- CMD`: an operator's command on a host, its exit code told apart from ssh's.

Why its own module: ssh exits 255 both when it cannot reach the host and when the remote
command exits 255. The command is started behind a line that only the far side can print
(route.marked), so a 255 after that line is the command's and one before it is ssh's, with
or without a ControlMaster socket. A command that does not exist exits 127 with one line,
on this machine as over ssh (no traceback). Every call has a deadline: past it the ssh
process is killed and the host counts as timed out (exit 7), and the other hosts go on.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass

from .agent import contract
from .route import ran_line, read_ssh_log, ssh_failure, ssh_log
from .transport import kill_and_reap, timed_out

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
    nonce = contract.new_nonce()
    mark = ran_line(nonce).encode()
    with ssh_log(host.route) as log:
        cmd = host.route.wrap(_marked(host, argv, nonce), ssh_log=log.path if log else None)
        seen: dict = {"ran": host.route.ssh is None, "err": [], "partial": b""}
        # Both streams go to files, never pipes: a ControlPersist master forked by this ssh keeps
        # them open for minutes, so EOF on a pipe would come only then (transport.call_agent).
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            try:
                proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL if capture else None,
                                        stdout=out if capture else None, stderr=err)
            except OSError as exc:  # only on this machine (no hops): ssh itself is always there
                return _not_started(host, argv, exc, capture)
            done = threading.Event()
            follower = threading.Thread(target=follow_stderr, args=(err, mark, seen, capture, done), daemon=True)
            follower.start()
            stuck = None
            code: int | None
            try:
                code = proc.wait(timeout=deadline_s if deadline_s > 0 else None)
                cut_off = False
            except subprocess.TimeoutExpired:
                code, cut_off = kill_and_reap(proc), True
                stuck = proc.pid if code is None else None
            finally:
                done.set()
                follower.join()
            out.seek(0)
            stdout = out.read()
        text = b"".join(seen["err"]).decode("utf-8", "replace")
        ssh_said = read_ssh_log(log)
        if cut_off or code is None:
            raise timed_out(host.alias, deadline_s, seen["ran"], local=not host.route.hops, stuck_pid=stuck)
        failure = ssh_failure(host.route, host.alias, code, seen["ran"], ssh_said, text)
        if failure is not None:
            raise failure
        return Ran(SIGNALLED + -code if code < 0 else code, stdout, text.encode())


SIGNALLED = 128  # a command killed by signal N exits 128+N, as a shell reports it
# The far side's wrapper: the proof line (route.marked), then the command as a child of sh,
# not exec'd. Why not exec: ssh reports a command killed by a signal as 255 (it has no exit
# status), the same as its own failure; sh's wait turns that death into 128+N. Why check
# the command first: sh's own "exec: X: not found" names no host; this line does, like
# `local` (_not_started).
_WRAPPER = (
    'printf "%s\\n" "$1" >&2; alias=$2; shift 2; '
    'case "$1" in */*) [ -f "$1" ] && [ -x "$1" ] ;; *) command -v "$1" >/dev/null 2>&1 ;; esac || { '
    'if [ -e "$1" ]; then printf "gpu-pivot: %s: %s: not executable\\n" "$alias" "$1" >&2; exit 126; fi; '
    'printf "gpu-pivot: %s: %s: command not found\\n" "$alias" "$1" >&2; exit 127; }; '
    '"$@"')


def _marked(host, argv: list, nonce: str) -> list:
    """argv behind the proof line over ssh (see _WRAPPER); argv itself with no ssh hop."""
    if host.route.ssh is None:
        return list(argv)
    return ["sh", "-c", _WRAPPER, "gpu-pivot", ran_line(nonce), host.alias, *argv]


def _not_started(host, argv: list, exc: OSError, capture: bool) -> Ran:
    missing = isinstance(exc, FileNotFoundError)
    why = "command not found" if missing else (exc.strerror or str(exc))
    line = f"gpu-pivot: {host.alias}: {argv[0]}: {why}\n".encode()
    code = NOT_FOUND if missing else NOT_EXECUTABLE
    if not capture:
        sys.stderr.buffer.write(line)
        sys.stderr.flush()
    return Ran(code, b"", line)


def follow_stderr(err, mark: bytes, seen: dict, capture: bool, done: threading.Event) -> None:
    """Read the stderr file as it grows (until `done`, then what is left), line by line."""
    pos = 0
    while True:
        finished = done.is_set()
        chunk = os.pread(err.fileno(), 65536, pos)
        if chunk:
            pos += len(chunk)
            data = seen["partial"] + chunk
            *lines, seen["partial"] = data.split(b"\n")
            for line in lines:
                _line(line + b"\n", mark, seen, capture)
            continue
        if finished:
            if seen["partial"]:
                _line(seen["partial"], mark, seen, capture)
            return
        done.wait(0.05)


def _line(line: bytes, mark: bytes, seen: dict, capture: bool) -> None:
    """One stderr line: the proof line is dropped (noting it was seen); the rest kept. Not
    capturing, lines after it pass on at once (a long command's errors show as they come);
    lines before it are ssh's or the login shell's, kept for the one line that says why the
    host was not reached."""
    if not seen["ran"] and line.rstrip(b"\n") == mark:
        seen["ran"] = True
        return
    seen["err"].append(line)
    if not capture and seen["ran"]:
        os.write(2, line)
