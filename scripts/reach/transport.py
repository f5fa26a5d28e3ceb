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
from typing import Any, Generic, TypeVar, overload

from ..agent.state import statedir
from ..agent.wire import call, codes, frame, records, requests
from ..config.errors import ConfigError
from . import runner
from .bundle import agent_stream
from .route import RAN_PREFIX, HostTimedOut, marked


class AgentError(RuntimeError):
    """The agent ran (or tried to) but gave no usable result; the text says why."""


R = TypeVar("R", bound=records.Record)
Q = TypeVar("Q", bound=requests.Request)


@dataclass
class AgentResult(Generic[R]):
    """One agent call's outcome: its exit code, its JSON document (what --json prints) and the
    same document read through the contract (`result`: records.TeardownResult for a
    teardown, and so on; the one place the local side reads the agent's keys). The record's
    type is the parameter: call_agent's overloads give AgentResult[records.TeardownResult]
    for a requests.Teardown, and so on (records.RESULTS)."""

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


def agent_argv(host, request, nonce: str, progress: bool) -> list:
    """The agent's argv on the host for `request` (call.agent_argv) with what the host config selects."""
    return call.agent_argv(host.python, request, nonce, host.devices, progress=progress, run_dir=host.run_dir,
                           fake_devices=host.fake_devices, targets=host.targets, protect=host.protect,
                           fake_gpus=host.fake_gpus, scope=host.scope, scope_uid=host.scope_uid,
                           stream=True)  # stdin: bundle.agent_stream()


def checkpoint_stops(host) -> tuple:
    """The checkpoint stops the host's phases declare (STOP_SIGNAL...): every teardown of the host
    runs the one of each phase running there first (agent teardown/checkpoint.py)."""
    phases = getattr(host, "phases", None) or {}
    return tuple(s for s in (phases[name].checkpoint_stop() for name in sorted(phases)) if s)


def for_host(host, request: Q) -> Q:
    """`request` as `host` gets it: a plan or a teardown carries the host's checkpoint stops, so a
    teardown's deadline includes them; any other request as it is."""
    if isinstance(request, requests.Plan) and not request.checkpoint_stops:
        return request.replace(checkpoint_stops=checkpoint_stops(host))
    return request


# The record each request's call gives (records.RESULTS), for mypy: one overload per request class,
# Teardown before Plan (a Teardown is a Plan: the same selection).
@overload
def call_agent(host, request: requests.Ping, on_progress=..., deadline_s: float | None = ...
               ) -> AgentResult[records.PingResult]: ...
@overload
def call_agent(host, request: requests.Scan, on_progress=..., deadline_s: float | None = ...
               ) -> AgentResult[records.ScanResult]: ...
@overload
def call_agent(host, request: requests.Verify, on_progress=..., deadline_s: float | None = ...
               ) -> AgentResult[records.VerifyResult]: ...
@overload
def call_agent(host, request: requests.Teardown, on_progress=..., deadline_s: float | None = ...
               ) -> AgentResult[records.TeardownResult]: ...
@overload
def call_agent(host, request: requests.Plan, on_progress=..., deadline_s: float | None = ...
               ) -> AgentResult[records.PlanResult]: ...
@overload
def call_agent(host, request: requests.PhaseStart, on_progress=..., deadline_s: float | None = ...
               ) -> AgentResult[records.StartResult]: ...
@overload
def call_agent(host, request: requests.PhaseReady, on_progress=..., deadline_s: float | None = ...
               ) -> AgentResult[records.ReadyResult]: ...
@overload
def call_agent(host, request: requests.PhaseStop, on_progress=..., deadline_s: float | None = ...
               ) -> AgentResult[records.StopResult]: ...
@overload
def call_agent(host, request: requests.PhaseLogs, on_progress=..., deadline_s: float | None = ...
               ) -> AgentResult[records.LogsResult]: ...
@overload
def call_agent(host, request: requests.Smoke, on_progress=..., deadline_s: float | None = ...
               ) -> AgentResult[records.SmokeResult]: ...
@overload
def call_agent(host, request: requests.Drain, on_progress=..., deadline_s: float | None = ...
               ) -> AgentResult[records.DrainResult]: ...
@overload
def call_agent(host, request: requests.Gates, on_progress=..., deadline_s: float | None = ...
               ) -> AgentResult[records.GatesResult]: ...
@overload
def call_agent(host, request: requests.Lint, on_progress=..., deadline_s: float | None = ...
               ) -> AgentResult[records.LintResult]: ...
@overload
def call_agent(host, request: requests.Deploy, on_progress=..., deadline_s: float | None = ...
               ) -> AgentResult[records.DeployResult]: ...
@overload
def call_agent(host, request: requests.Reset, on_progress=..., deadline_s: float | None = ...
               ) -> AgentResult[records.ResetResult]: ...
@overload
def call_agent(host, request: requests.GpuSettings, on_progress=..., deadline_s: float | None = ...
               ) -> AgentResult[records.SettingsResult]: ...
@overload
def call_agent(host, request: requests.Release, on_progress=..., deadline_s: float | None = ...
               ) -> AgentResult[records.ReleaseResult]: ...


def call_agent(host, request: requests.Request, on_progress=None, deadline_s: float | None = None
               ) -> AgentResult[Any]:
    """Run one agent request on `host` (for_host) within its deadline (request.deadline_s());
    `deadline_s`: a caller's own shorter budget instead (a ping's --timeout, a Slurm hook's).

    Raises HostUnreachable, HostTimedOut (ssh gave up waiting, or the deadline passed: the
    ssh process is killed), AgentError, or ConfigError (the agent refused a flag's value:
    exit 2, nothing done)."""
    nonce = frame.new_nonce()
    request = for_host(host, request)
    deadline = deadline_s if deadline_s is not None else request.deadline_s()
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
    done = send_agent(host, request, nonce, runner.How(on_line=on_line, deadline_s=deadline,
                                                       own_session=not host.route.hops), on_progress is not None)
    if done.cut_off:
        raise done.timed_out(host.alias, deadline, local=not host.route.hops)
    assert done.code is not None  # not cut off: it exited
    doc = read_document(host.alias, "".join(out_lines), nonce, done.code, done.stderr, done.failure(host.route,
                                                                                                   host.alias))
    try:
        result = records.read(request.name, done.code, doc)
    except records.ContractError as exc:
        raise AgentError(f"{host.alias}: {exc} (exit {done.code})") from None
    return AgentResult(host.alias, done.code, doc, done.wall_s, result)


def send_agent(host, request: requests.Request, nonce: str, how: runner.How, progress: bool = False
               ) -> runner.Finished:
    """Run the agent with `request` on host through the runner, the agent bundle on its stdin
    (bundle.agent_stream of the request's subcommand, built on the feeding thread after the
    spawn: its ~10 ms run while the agent's interpreter starts or ssh connects). AgentError when it could not start or
    its bundle could not be built (then it got an empty stdin and stopped before doing
    anything), or when the local ssh ControlPath directory was refused."""
    local = not host.route.hops
    argv = agent_argv(host, request, nonce, progress)
    how = dataclasses.replace(how, feed=lambda: agent_stream(compiled=local,  # compiled: this machine's bytecode
                                                             subcommand=request.name))
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
