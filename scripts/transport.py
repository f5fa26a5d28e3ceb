"""Run the agent on a host in one round trip and read back its one JSON document.

Why: the agent source goes on stdin (`python3 - SUBCOMMAND`), so a call is exactly one
ssh connection (or none, for this machine), nothing is installed on the host, and only a
short argv needs quoting. Everything outside the nonce'd marker lines is noise and ignored.
"""
from __future__ import annotations

import json
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any

from .agent import contract
from .bundle import agent_stream
from .config_error import ConfigError
from .route import RAN_PREFIX, HostTimedOut, ran_line, read_ssh_log, ssh_failure, ssh_log


class AgentError(RuntimeError):
    """The agent ran (or tried to) but gave no usable result; the text says why."""


@dataclass
class AgentResult:
    """One agent call's outcome: its exit code, its JSON document (what --json prints) and the
    same document read through the contract (`result`: contract.TeardownResult for a
    teardown, and so on; the one place the local side reads the agent's keys)."""

    host: str
    code: int
    doc: dict
    wall_s: float
    result: Any = None


def exit_code_for(exc: BaseException) -> int | None:
    """The documented exit code for an error users cause or meet; None for a bug (a traceback).
    The one mapping from errors to exit codes: the tasks (cli/common.py) and a pivot's steps
    (pivot.py) both read it. SandboxStartError is imported here, when an error is being
    handled: a module not yet imported cannot have raised its error."""
    from .route import HostUnreachable
    from .sandbox_procs import SandboxStartError

    if isinstance(exc, ConfigError):
        return contract.EXIT_USAGE
    if isinstance(exc, HostTimedOut):  # before HostUnreachable: it is one, with its own code
        return contract.EXIT_TIMED_OUT
    if isinstance(exc, SandboxStartError):  # the sandbox's processes did not start: nothing to use
        return contract.EXIT_FAILED
    # StateDirError: a local state directory (audit log, ssh sockets) was refused
    if isinstance(exc, (HostUnreachable, AgentError, contract.statedir.StateDirError)):
        return contract.EXIT_UNREACHABLE
    return None


def _tail(text: str, lines: int = 5) -> str:
    kept = [line for line in text.strip().splitlines() if line.strip()][-lines:]
    return " | ".join(kept) or "(nothing on stderr)"


def agent_argv(host, subcommand: str, args, nonce: str, progress: bool) -> list:
    """The agent's argv on the host (contract.agent_argv) with what the host config selects."""
    return contract.agent_argv(host.python, subcommand, nonce, host.devices, progress=progress, run_dir=host.run_dir,
                               fake_devices=host.fake_devices, targets=host.targets, protect=host.protect,
                               fake_gpus=host.fake_gpus, scope=host.scope, scope_uid=host.scope_uid, args=args,
                               stream=True)  # stdin: bundle.agent_stream()


# The deadline of one agent call: a floor for the round trip (ssh connect, the bundle, the
# scan) plus the waits the call's own flags ask for. Why computed from the flags: a teardown
# with --grace 30 --settle 2 may rightly take a minute, a ping never; one fixed number would
# either cut the teardown off or let a frozen host hold the ping for as long.
BASE_DEADLINE_S = 60.0
GATE_TIMEOUT_S = 600.0  # each command gate's own limit on the host (agent/gates.py)
SMOKE_TIMEOUT_S = 60.0  # the smoke request's own limit on the host (agent/phase.py)
_WAIT_FLAGS = {  # flags whose seconds the call may spend waiting, by subcommand
    "teardown": ("--grace", "--timeout", "--wait-lock", "--settle"),
    "verify": ("--wait",),
    "phase-ready": ("--wait",),
    "drain": ("--timeout",),
}


def _flag_seconds(args, flag: str) -> float:
    words = [str(a) for a in args]
    for i, word in enumerate(words):
        value = words[i + 1] if word == flag and i + 1 < len(words) else (
            word.split("=", 1)[1] if word.startswith(flag + "=") else None)
        if value is not None:
            try:
                return max(0.0, float(value))
            except ValueError:
                return 0.0
    return 0.0


def deadline_for(subcommand: str, args=()) -> float:
    """Seconds one agent call may take before the host counts as timed out: BASE_DEADLINE_S
    plus every wait its flags ask for (a teardown: grace + timeout + wait-lock + settle; a
    teardown that kills may spend its --timeout twice, once for TERM and once for KILL), plus
    the gates' and the phase's own limits from its spec."""
    waits = sum(_flag_seconds(args, f) for f in _WAIT_FLAGS.get(subcommand, ()))
    if subcommand == "teardown":
        waits += _flag_seconds(args, "--timeout")
        words = [str(a) for a in args]
        if "--mps=quit" in words or any(w == "--mps" and words[i + 1:i + 2] == ["quit"] for i, w in enumerate(words)):
            waits += contract.MPS_QUIT_TIMEOUT_S  # every MPS daemon's quit, one shared limit (agent mps.py)
    spec = _spec_of(args)
    if subcommand == "gates":
        waits += GATE_TIMEOUT_S * len(spec.get("gates") or ())
    elif subcommand == "phase-stop":
        waits += 2 * float(spec.get("stop_timeout") or 0)
    elif subcommand == "smoke":
        waits += SMOKE_TIMEOUT_S
    elif subcommand == "reset" and "--yes" in [str(a) for a in args]:
        waits += contract.RESET_TIMEOUT_S  # nvidia-smi --gpu-reset is bounded by the agent itself
    return BASE_DEADLINE_S + waits


def _spec_of(args) -> dict:
    words = [str(a) for a in args]
    if contract.SPEC_FLAG in words[:-1]:
        try:
            spec = contract.decode_spec(words[words.index(contract.SPEC_FLAG) + 1])
            return spec if isinstance(spec, dict) else {}
        except ValueError:
            return {}
    return {}


KILL_WAIT_S = 5.0


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


def call_agent(host, subcommand: str, args=(), on_progress=None, deadline_s: float | None = None) -> AgentResult:
    """Run one agent subcommand on `host` within `deadline_s` (default: deadline_for()).

    Raises HostUnreachable, HostTimedOut (ssh gave up waiting, or the deadline passed: the
    ssh process is killed), AgentError, or ConfigError (the agent refused a flag's value:
    exit 2, nothing done)."""
    nonce = contract.new_nonce()
    deadline = deadline_s if deadline_s is not None else deadline_for(subcommand, args)
    with ssh_log(host.route) as log:
        code, out_lines, stderr, ssh_said, cut_off, wall = _run(host, subcommand, args, on_progress, nonce,
                                                                deadline, log)
    ran = route_ran(host, stderr, nonce)
    if cut_off:
        raise timed_out(host.alias, deadline, ran, local=not host.route.hops, stuck_pid=cut_off.get("stuck"))
    doc = _parse(host, "".join(out_lines), nonce, code, stderr, ran, ssh_said)
    try:
        result = contract.read(subcommand, code, doc)
    except contract.ContractError as exc:
        raise AgentError(f"{host.alias}: {exc} (exit {code})") from None
    return AgentResult(host.alias, code, doc, wall, result)


def _run(host, subcommand: str, args, on_progress, nonce: str, deadline: float, log):
    """Start the agent on host (ssh's own messages to `log`), feed it, read it until it exits
    or the deadline passes: (code, stdout lines, stderr, what ssh said, cut off, seconds).
    `cut off`: {} when it ended by itself, else {"stuck": pid or None} (pid: it outlived SIGKILL)."""
    try:
        cmd = host.route.wrap(host.route.marked(agent_argv(host, subcommand, args, nonce, on_progress is not None),
                                                nonce), ssh_log=log.path if log else None)
    except contract.statedir.StateDirError as exc:  # the local ssh ControlPath directory was refused
        raise AgentError(f"{host.alias}: {exc}") from None
    started = time.monotonic()
    # stderr goes to a file, not a pipe: a ControlPersist master forked by this ssh keeps
    # its stderr open for minutes, and waiting for EOF on a pipe would hang until then.
    with tempfile.TemporaryFile() as err:
        # On this machine (no hops) the agent gets its own session, as it would on a host
        # behind ssh: a Ctrl-C at the operator's terminal must not reach it mid-teardown.
        try:
            proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                                    start_new_session=not host.route.hops)
        except OSError as exc:  # e.g. LOCAL_PYTHON names no program: the agent could not run (exit 3)
            raise AgentError(f"{host.alias}: could not start {cmd[0]!r}: {exc.strerror or exc}") from None
        # The bundle is built on the feeding thread, after the spawn: its ~10 ms run while the
        # agent's interpreter starts (or ssh connects) instead of before them.
        build_failed: list = []
        threading.Thread(target=_feed, args=(proc, not host.route.hops, build_failed), daemon=True).start()
        out_lines: list = []
        reader = threading.Thread(target=_read, args=(proc, out_lines, on_progress), daemon=True)
        reader.start()
        cut_off: dict = {}
        code: int | None
        try:
            code = proc.wait(timeout=deadline)
        except subprocess.TimeoutExpired:
            # ssh (the far side's agent ignores the hangup) or this machine's agent
            code = kill_and_reap(proc)
            cut_off = {"stuck": proc.pid if code is None else None}
        # EOF follows the exit; never wait on a pipe another process holds (nor on one a process
        # that outlived SIGKILL still holds: it gave no answer, and the line says so)
        reader.join(timeout=5 if code is not None else 0.2)
        err.seek(0)
        stderr = err.read().decode("utf-8", "replace")
    if build_failed:
        raise AgentError(f"{host.alias}: could not build the agent bundle: {build_failed[0]}")
    return code, out_lines, stderr, read_ssh_log(log), cut_off, time.monotonic() - started


def route_ran(host, stderr: str, nonce: str) -> bool:
    """Did the far side start the command (route.marked's line on stderr)? Always, with no ssh."""
    return host.route.ssh is None or ran_line(nonce) in stderr


def _read(proc, out_lines: list, on_progress) -> None:
    for raw in proc.stdout:
        line = raw.decode("utf-8", "replace")
        fields = contract.parse_progress(line) if on_progress else None
        if fields is not None:
            try:
                on_progress(fields)
            except Exception:  # noqa: BLE001  a display error must never stop reading the result
                pass
            continue
        out_lines.append(line)


def _feed(proc, compiled: bool, build_failed: list) -> None:
    """Build the agent's stdin (bundle.agent_stream; `compiled`: this machine's bytecode too)
    and write it; a bundle that cannot be built is noted in `build_failed` and the agent gets
    an empty stdin, so it stops before doing anything."""
    try:
        payload = agent_stream(compiled=compiled)
    except Exception as exc:  # noqa: BLE001  reported by _run once the agent has stopped
        build_failed.append(exc)
        payload = b""
    try:
        proc.stdin.write(payload)
        proc.stdin.close()
    except (BrokenPipeError, OSError):
        pass  # the far side exited early; its exit code and stderr say why


def _parse(host, stdout: str, nonce: str, code: int, stderr: str, ran: bool, ssh_said: str = "") -> dict:
    try:
        body = contract.extract(stdout, nonce)
    except contract.MarkerError as exc:
        failure = ssh_failure(host.route, host.alias, code, ran, ssh_said, stderr)
        if failure is not None:
            raise failure from None
        stderr = "\n".join(line for line in stderr.splitlines() if RAN_PREFIX not in line)
        raise AgentError(f"{host.alias}: {exc}; the command exited {code}; stderr: {_tail(stderr)}") from None
    try:
        doc = json.loads(body)
    except ValueError as exc:
        raise AgentError(f"{host.alias}: the agent's result is not valid JSON ({exc}); exit {code}") from None
    if not isinstance(doc, dict):
        raise AgentError(f"{host.alias}: the agent's result is not a JSON object; exit {code}")
    if doc.get(contract.USAGE_ERROR):
        raise ConfigError(f"{host.alias}: {doc[contract.USAGE_ERROR]}")
    if doc.get(contract.AGENT_ERROR):  # the agent caught its own failure (agent/cli.py main): exit 3, named
        raise AgentError(f"{host.alias}: the agent failed: {doc[contract.AGENT_ERROR]} (exit {code}; please report "
                         "it with this line)")
    return doc
