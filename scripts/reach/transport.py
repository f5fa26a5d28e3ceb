"""Run the agent on a host in one round trip and read back its one JSON document.

Why: the agent source goes on stdin (`python3 - SUBCOMMAND`), so a call is exactly one
ssh connection (or none, for this machine), nothing is installed on the host, and only a
short argv needs quoting. Everything outside the nonce'd marker lines is noise and ignored.
The process itself is run by scripts/reach/runner.py, as every command sent over a route.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar, overload

from ..agent.state import statedir
from ..agent.wire import call, codes, defaults as shared, frame, records
from ..config import defaults
from ..config.errors import ConfigError
from . import runner
from .bundle import agent_stream
from .route import RAN_PREFIX, HostTimedOut, marked


class AgentError(RuntimeError):
    """The agent ran (or tried to) but gave no usable result; the text says why."""


R = TypeVar("R", bound=records.Record)


@dataclass
class AgentResult(Generic[R]):
    """One agent call's outcome: its exit code, its JSON document (what --json prints) and the
    same document read through the contract (`result`: records.TeardownResult for a
    teardown, and so on; the one place the local side reads the agent's keys). The record's
    type is the parameter: call_agent's overloads give AgentResult[records.TeardownResult]
    for "teardown", and so on (records.RESULTS)."""

    host: str
    code: int
    doc: dict
    wall_s: float
    result: R


def exit_code_for(exc: BaseException) -> int | None:
    """The documented exit code for an error users cause or meet; None for a bug (a traceback).
    The mapping from the errors of reaching a host and below to exit codes: a pivot's steps
    (pivot.py), a fleet's rows and the Slurm job read it; the tasks read it through
    cli/common.code_for, which adds the errors of the operations above (the sandbox's start)."""
    from .route import HostUnreachable

    if isinstance(exc, ConfigError):
        return codes.EXIT_USAGE
    if isinstance(exc, HostTimedOut):  # before HostUnreachable: it is one, with its own code
        return codes.EXIT_TIMED_OUT
    # StateDirError: a local state directory (audit log, ssh sockets) was refused
    if isinstance(exc, (HostUnreachable, AgentError, statedir.StateDirError)):
        return codes.EXIT_UNREACHABLE
    return None


def _tail(text: str, lines: int = 5) -> str:
    kept = [line for line in text.strip().splitlines() if line.strip()][-lines:]
    return " | ".join(kept) or "(nothing on stderr)"


def agent_argv(host, subcommand: str, args, nonce: str, progress: bool) -> list:
    """The agent's argv on the host (call.agent_argv) with what the host config selects: for a
    plan or a teardown, also each phase's checkpoint stop (checkpoint_stops)."""
    if subcommand in ("plan", "teardown") and not any(str(a).startswith("--checkpoint-stop") for a in args):
        args = list(args) + ["--checkpoint-stop=" + frame.encode_spec(s) for s in checkpoint_stops(host)]
    return call.agent_argv(host.python, subcommand, nonce, host.devices, progress=progress, run_dir=host.run_dir,
                               fake_devices=host.fake_devices, targets=host.targets, protect=host.protect,
                               fake_gpus=host.fake_gpus, scope=host.scope, scope_uid=host.scope_uid, args=args,
                               stream=True)  # stdin: bundle.agent_stream()


def checkpoint_stops(host) -> list:
    """The checkpoint stops the host's phases declare (STOP_SIGNAL...): every teardown of the host
    runs the one of each phase running there first (agent teardown/checkpoint.py)."""
    phases = getattr(host, "phases", None) or {}
    return [s for s in (phases[name].checkpoint_stop() for name in sorted(phases)) if s]


def checkpoint_wait_s(host) -> float:
    """What a teardown's deadline grows by: the longest stop's deadline (they wait side by side)."""
    return max([float(s["deadline_s"]) for s in checkpoint_stops(host)], default=0.0)


# The deadline of one agent call: a floor for the round trip (ssh connect, the bundle, the
# scan) plus the waits the call's own flags ask for. Why computed from the flags: a teardown
# with --grace 30 --settle 2 may rightly take a minute, a ping never; one fixed number would
# either cut the teardown off or let a frozen host hold the ping for as long.
BASE_DEADLINE_S = 60.0
_WAIT_FLAGS = {  # flags whose seconds the call may spend waiting, by subcommand
    "teardown": ("--grace", "--timeout", "--wait-lock", "--settle"),
    "verify": ("--wait",),
    "phase-ready": ("--wait",),
    "drain": ("--timeout",),
}


@dataclass(frozen=True)
class TeardownRequest:
    """One teardown's flags as fields: the agent argv for `invoke teardown`, a pivot's teardown
    step, the Slurm epilog and the Ansible module alike (argv), and its deadline read from the
    fields (deadline_s). Values are already checked (cliargs, ansible_task._params).

    None: the flag is not passed and the agent's own rule holds (settle: defaults.SETTLE_S, or
    none when nothing can respawn; wait_lock: fail at once; operator: the agent's guess)."""

    grace: float = defaults.GRACE_S
    timeout: float = defaults.TIMEOUT_S
    settle: float | None = None
    wait_lock: float | None = None
    max_used_mib: int = defaults.MAX_USED_MIB
    operator: str | None = None
    match: tuple = ()  # extra target patterns
    only_matching: bool = False
    disable: bool = False
    stop_starters: bool = False
    all_users: bool = False
    mps_quit: bool = False
    keep_shm: bool = False  # keep what the targets left in /dev/shm and System V shared memory
    approved: str | None = None  # "pid:start,...": only these are signalled
    hold: tuple | None = None  # (seconds, phase, token): once FREED the lock stays a pivot's (agent hold.py)

    def selection(self) -> list:
        """The flags that choose targets (plan takes the same)."""
        args = ["--match=" + m for m in self.match]  # =: a pattern may start with "-"
        args += ["--only-matching"] if self.only_matching else []
        args += ["--disable"] if self.disable else []
        args += ["--all-users"] if self.all_users else []
        return args + (["--stop-starters"] if self.stop_starters else [])

    def argv(self) -> list:
        """The agent's `teardown` arguments."""
        args = self.selection() + ["--grace", self.grace, "--timeout", self.timeout]
        args += [] if self.wait_lock is None else ["--wait-lock", self.wait_lock]
        args += ["--max-used-mib", self.max_used_mib]
        args += [] if self.operator is None else ["--operator", self.operator]
        args += [] if self.settle is None else ["--settle", self.settle]
        args += ["--mps", "quit"] if self.mps_quit else []
        args += ["--keep-shm"] if self.keep_shm else []
        if self.hold is not None:
            args += ["--hold-s", self.hold[0], "--hold-phase", self.hold[1], "--hold-token", self.hold[2]]
        return args + ([] if self.approved is None else ["--approved", self.approved])

    def deadline_s(self) -> float:
        """BASE_DEADLINE_S plus every wait it asks for: grace, wait-lock, settle and its timeout
        twice (a teardown that kills may spend it once for TERM and once for KILL), and the MPS
        daemons' one shared quit limit (agent mps.py)."""
        waits = self.grace + 2 * self.timeout + (self.wait_lock or 0.0) + (self.settle or 0.0)
        return BASE_DEADLINE_S + waits + (shared.MPS_QUIT_TIMEOUT_S if self.mps_quit else 0.0)


@dataclass(frozen=True)
class VerifyRequest:
    """One verify's flags as fields: the agent argv for `invoke verify`, the Slurm prolog and the
    Ansible module's `state: verified` alike, its deadline read from the fields."""

    wait: float = defaults.VERIFY_WAIT_S  # poll this long for free GPUs (0: look once)
    max_used_mib: int = defaults.MAX_USED_MIB
    probe_mib: int | None = None  # verify --probe with a test buffer of this size (agent/gpu/probe.py)

    def argv(self) -> list:
        probe = [] if self.probe_mib is None else ["--probe", "--probe-mib", self.probe_mib]
        return ["--wait", self.wait, "--max-used-mib", self.max_used_mib, *probe]

    def deadline_s(self) -> float:
        return BASE_DEADLINE_S + self.wait + (0 if self.probe_mib is None else shared.PROBE_DEADLINE_S)


def call_teardown(host, request: TeardownRequest, on_progress=None,
                  deadline_s: float | None = None) -> AgentResult[records.TeardownResult]:
    """One teardown on `host`, within the deadline its fields give (or the caller's budget)."""
    return call_agent(host, "teardown", request.argv(), on_progress=on_progress,
                      deadline_s=request.deadline_s() if deadline_s is None else deadline_s)


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
    """Seconds one agent call may take before the host counts as timed out, read from its argv
    words: BASE_DEADLINE_S plus every wait its flags ask for (a teardown: as
    TeardownRequest.deadline_s, which the tasks, Slurm and Ansible use), plus the gates' and
    the phase's own limits from its spec."""
    waits = sum(_flag_seconds(args, f) for f in _WAIT_FLAGS.get(subcommand, ()))
    if subcommand == "teardown":
        waits += _flag_seconds(args, "--timeout")
        words = [str(a) for a in args]
        if "--mps=quit" in words or any(w == "--mps" and words[i + 1:i + 2] == ["quit"] for i, w in enumerate(words)):
            waits += shared.MPS_QUIT_TIMEOUT_S  # every MPS daemon's quit, one shared limit (agent mps.py)
    spec = _spec_of(args)
    if subcommand == "gates":
        waits += shared.GATE_TIMEOUT_S * len(spec.get("gates") or ())
    elif subcommand == "phase-stop":  # its checkpoint stop's wait, then TERM -> KILL
        waits += 2 * float(spec.get("stop_timeout") or 0) + (float(spec.get("stop_deadline") or 0)
                                                             if spec.get("stop_signal") else 0.0)
    elif subcommand == "smoke":
        waits += shared.SMOKE_TIMEOUT_S
    elif subcommand == "reset" and "--yes" in [str(a) for a in args]:
        waits += shared.RESET_TIMEOUT_S  # nvidia-smi --gpu-reset is bounded by the agent itself
    return BASE_DEADLINE_S + waits


def _spec_of(args) -> dict:
    words = [str(a) for a in args]
    if call.SPEC_FLAG in words[:-1]:
        try:
            spec = frame.decode_spec(words[words.index(call.SPEC_FLAG) + 1])
            return spec if isinstance(spec, dict) else {}
        except ValueError:
            return {}
    return {}


# The record each subcommand's call gives (records.RESULTS), for mypy: one overload per subcommand.
@overload
def call_agent(host, subcommand: Literal["ping"], args=..., on_progress=...,
               deadline_s: float | None = ...) -> AgentResult[records.PingResult]: ...
@overload
def call_agent(host, subcommand: Literal["scan"], args=..., on_progress=...,
               deadline_s: float | None = ...) -> AgentResult[records.ScanResult]: ...
@overload
def call_agent(host, subcommand: Literal["verify"], args=..., on_progress=...,
               deadline_s: float | None = ...) -> AgentResult[records.VerifyResult]: ...
@overload
def call_agent(host, subcommand: Literal["plan"], args=..., on_progress=...,
               deadline_s: float | None = ...) -> AgentResult[records.PlanResult]: ...
@overload
def call_agent(host, subcommand: Literal["teardown"], args=..., on_progress=...,
               deadline_s: float | None = ...) -> AgentResult[records.TeardownResult]: ...
@overload
def call_agent(host, subcommand: Literal["phase-start"], args=..., on_progress=...,
               deadline_s: float | None = ...) -> AgentResult[records.StartResult]: ...
@overload
def call_agent(host, subcommand: Literal["phase-ready"], args=..., on_progress=...,
               deadline_s: float | None = ...) -> AgentResult[records.ReadyResult]: ...
@overload
def call_agent(host, subcommand: Literal["phase-stop"], args=..., on_progress=...,
               deadline_s: float | None = ...) -> AgentResult[records.StopResult]: ...
@overload
def call_agent(host, subcommand: Literal["phase-logs"], args=..., on_progress=...,
               deadline_s: float | None = ...) -> AgentResult[records.LogsResult]: ...
@overload
def call_agent(host, subcommand: Literal["smoke"], args=..., on_progress=...,
               deadline_s: float | None = ...) -> AgentResult[records.SmokeResult]: ...
@overload
def call_agent(host, subcommand: Literal["drain"], args=..., on_progress=...,
               deadline_s: float | None = ...) -> AgentResult[records.DrainResult]: ...
@overload
def call_agent(host, subcommand: Literal["gates"], args=..., on_progress=...,
               deadline_s: float | None = ...) -> AgentResult[records.GatesResult]: ...
@overload
def call_agent(host, subcommand: Literal["lint"], args=..., on_progress=...,
               deadline_s: float | None = ...) -> AgentResult[records.LintResult]: ...
@overload
def call_agent(host, subcommand: Literal["deploy"], args=..., on_progress=...,
               deadline_s: float | None = ...) -> AgentResult[records.DeployResult]: ...
@overload
def call_agent(host, subcommand: Literal["reset"], args=..., on_progress=...,
               deadline_s: float | None = ...) -> AgentResult[records.ResetResult]: ...
@overload
def call_agent(host, subcommand: Literal["gpu-settings"], args=..., on_progress=...,
               deadline_s: float | None = ...) -> AgentResult[records.SettingsResult]: ...
@overload
def call_agent(host, subcommand: Literal["release"], args=..., on_progress=...,
               deadline_s: float | None = ...) -> AgentResult[records.ReleaseResult]: ...
@overload
def call_agent(host, subcommand: str, args=..., on_progress=...,
               deadline_s: float | None = ...) -> AgentResult[records.Record]: ...


def call_agent(host, subcommand: str, args=(), on_progress=None, deadline_s: float | None = None) -> AgentResult[Any]:
    """Run one agent subcommand on `host` within `deadline_s` (default: deadline_for()).

    Raises HostUnreachable, HostTimedOut (ssh gave up waiting, or the deadline passed: the
    ssh process is killed), AgentError, or ConfigError (the agent refused a flag's value:
    exit 2, nothing done)."""
    nonce = frame.new_nonce()
    deadline = deadline_s if deadline_s is not None else deadline_for(subcommand, args)
    deadline += checkpoint_wait_s(host) if subcommand == "teardown" else 0.0  # a phase's stop comes first
    out_lines: list = []

    def on_line(raw: bytes) -> None:
        line = raw.decode("utf-8", "replace")
        fields = frame.parse_progress(line) if on_progress else None
        if fields is None:
            out_lines.append(line)
            return
        try:
            on_progress(fields)
        except Exception:  # noqa: BLE001  a display error must never stop reading the result
            pass

    # On this machine (no hops) the agent gets its own session, as it would on a host behind
    # ssh: a Ctrl-C at the operator's terminal must not reach it mid-teardown.
    done = send_agent(host, agent_argv(host, subcommand, args, nonce, on_progress is not None), nonce,
                      runner.How(on_line=on_line, deadline_s=deadline, own_session=not host.route.hops))
    if done.cut_off:
        raise done.timed_out(host.alias, deadline, local=not host.route.hops)
    assert done.code is not None  # not cut off: it exited
    doc = read_document(host.alias, "".join(out_lines), nonce, done.code, done.stderr, done.failure(host.route,
                                                                                                   host.alias))
    try:
        result = records.read(subcommand, done.code, doc)
    except records.ContractError as exc:
        raise AgentError(f"{host.alias}: {exc} (exit {done.code})") from None
    return AgentResult(host.alias, done.code, doc, done.wall_s, result)


def send_agent(host, argv: list, nonce: str, how: runner.How) -> runner.Finished:
    """Run the agent's `argv` on host through the runner, the agent bundle on its stdin
    (bundle.agent_stream of argv's subcommand, built on the feeding thread after the spawn:
    its ~10 ms run while the agent's interpreter starts or ssh connects). AgentError when it could not start or
    its bundle could not be built (then it got an empty stdin and stopped before doing
    anything), or when the local ssh ControlPath directory was refused."""
    local = not host.route.hops
    subcommand = argv[argv.index(call.STDIN) + 1]  # the bundle carries what this subcommand imports
    how = dataclasses.replace(how, feed=lambda: agent_stream(compiled=local,  # compiled: this machine's bytecode
                                                             subcommand=subcommand))
    try:
        done = runner.run(host.route, marked(host.route, argv, nonce), nonce, how)
    except runner.NotStarted as exc:  # e.g. LOCAL_PYTHON names no program: the agent could not run (exit 3)
        raise AgentError(f"{host.alias}: {exc}") from None
    except statedir.StateDirError as exc:
        raise AgentError(f"{host.alias}: {exc}") from None
    if done.feed_error is not None:
        raise AgentError(f"{host.alias}: could not build the agent bundle: {done.feed_error}")
    return done


def read_document(alias: str, stdout: str, nonce: str, code: int, stderr: str = "",
                  unreached: Exception | None = None) -> dict:
    """The agent's one JSON document from its stdout (between the markers of `nonce`).

    Raises `unreached` when there is none (ssh's own failure: Finished.failure), else
    AgentError (no document, not JSON, or the agent's own failure, named) or ConfigError
    (the agent refused a flag's value). `alias` ("" for none) starts every message."""
    at = f"{alias}: " if alias else ""
    try:
        body = frame.extract(stdout, nonce)
    except frame.MarkerError as exc:
        if unreached is not None:
            raise unreached from None
        stderr = "\n".join(line for line in stderr.splitlines() if RAN_PREFIX not in line)
        raise AgentError(f"{at}{exc}; the command exited {code}; stderr: {_tail(stderr)}") from None
    try:
        doc = json.loads(body)
    except ValueError as exc:
        raise AgentError(f"{at}the agent's result is not valid JSON ({exc}); exit {code}") from None
    if not isinstance(doc, dict):
        raise AgentError(f"{at}the agent's result is not a JSON object; exit {code}")
    if doc.get(codes.USAGE_ERROR):
        raise ConfigError(f"{at}{doc[codes.USAGE_ERROR]}")
    if doc.get(codes.AGENT_ERROR):  # the agent caught its own failure (agent/cli.py main): exit 3, named
        raise AgentError(f"{at}the agent failed: {doc[codes.AGENT_ERROR]} (exit {code}; please report "
                         "it with this line)")
    return doc
