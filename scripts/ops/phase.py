"""Local side of phases: each operation is one agent call on the host (one round trip).

Why a module: `invoke start/stop/logs/lint-launch` and every step of `invoke pivot` use the
same calls; the pivot only orders them.
"""
from __future__ import annotations

import json
from collections.abc import Callable

from ..agent.procs import textsafe
from ..agent.wire import frame as wire_frame, records, requests
from ..config.errors import ConfigError, show
from ..reach.transport import AgentResult, call_agent


def phase_of(host, name: str):
    if not name:  # the flag was not given: say it is required, not "no such phase ''"
        known = ", ".join(sorted(host.phases)) or "none configured"
        raise ConfigError(f"--phase is required (host {host.alias} has: {known})")
    if name not in host.phases:
        known = ", ".join(sorted(host.phases)) or "none configured"
        raise ConfigError(f"--phase {show(name)}: host {host.alias} has no such phase (known: {known})")
    return host.phases[name]


def start(host, phase) -> AgentResult[records.StartResult]:
    return call_agent(host, requests.PhaseStart(spec=phase.spec()))


def ready(host, phase, wait_s: float, on_progress=None, intruders=False) -> AgentResult[records.ReadyResult]:
    """`intruders`: also name a process outside the phase that holds a GPU meanwhile (a pivot's)."""
    return call_agent(host, requests.PhaseReady(spec=phase.spec(), wait=wait_s, intruders=bool(intruders)),
                      on_progress=on_progress)


def stop(host, phase, operator: str) -> AgentResult[records.StopResult]:
    return call_agent(host, requests.PhaseStop(spec=phase.spec(), operator=operator))


def logs(host, phase, lines: int) -> AgentResult[records.LogsResult]:
    return call_agent(host, requests.PhaseLogs(spec=phase.spec(), lines=lines))


def follow_logs(host, phase, lines: int, on_log_line: Callable[[str], None]):
    """Stream the log until Ctrl-C: the agent execs `tail -F` / `journalctl -f` on the host;
    `on_log_line` gets each log line as it comes (the host's text, decoded, without its newline).

    Returns (exit code, the agent's result document or None). The agent answers with a
    result instead of following when it cannot (a phase never started there): that frame
    is read like any call's (transport), never printed raw. Errors as every call's: ssh's
    own failure is HostUnreachable (exit 3), its connect or keep-alive timeout HostTimedOut
    (exit 7); there is no deadline, following is open-ended. Ctrl-C ends the stream and is
    re-raised (exit 130 through `guarded`)."""
    from ..reach.runner import How
    from ..reach.transport import read_document, send_agent  # as every agent call

    nonce = wire_frame.new_nonce()
    begin = wire_frame.begin(nonce).encode()
    frame: list = []  # the agent's result, when it answered instead of following

    def on_line(raw: bytes) -> None:
        if frame or raw.rstrip(b"\n") == begin:
            frame.append(raw)
            return
        on_log_line(textsafe.decode(raw).rstrip("\n"))

    request = requests.PhaseLogs(spec=phase.spec(), lines=lines, follow=True)
    done = send_agent(host, request, nonce, How(on_line=on_line, echo_stderr=True, stop_on_interrupt=True))
    assert done.code is not None  # no deadline: it exited
    failure = done.failure(host.route, host.alias)
    if frame:
        return done.code, read_document(host.alias, b"".join(frame).decode("utf-8", "replace"), nonce, done.code,
                                        done.stderr, failure)
    if failure is not None:
        raise failure
    return done.code, None


def drain(host, url: str, timeout_s: float, on_progress=None) -> AgentResult[records.DrainResult]:
    return call_agent(host, requests.Drain(url=url, timeout=timeout_s), on_progress=on_progress)


def gates(host, phase) -> AgentResult[records.GatesResult]:
    return call_agent(host, requests.Gates(spec=phase.spec()))


def lint(host, argv: list, gpus: str | None) -> AgentResult[records.LintResult]:
    return call_agent(host, requests.Lint(command=json.dumps(argv), gpus=gpus or None))


def deploy(host, phase, action: str) -> AgentResult[records.DeployResult]:
    return call_agent(host, requests.Deploy(spec=phase.spec(), action=action))


def smoke(host, phase) -> AgentResult[records.SmokeResult]:
    return call_agent(host, requests.Smoke(spec=phase.spec()))
