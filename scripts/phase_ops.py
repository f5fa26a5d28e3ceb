"""Local side of phases: each operation is one agent call on the host (one round trip).

Why a module: `invoke start/stop/logs/lint-launch` and every step of `invoke pivot` use the
same calls; the pivot only orders them.
"""
from __future__ import annotations

import json
import subprocess

from .agent import contract
from .bundle import agent_stream
from .config_error import ConfigError
from .transport import agent_argv, call_agent


def phase_of(host, name: str):
    if name not in host.phases:
        known = ", ".join(sorted(host.phases)) or "none configured"
        raise ConfigError(f"--phase {name!r}: host {host.alias} has no such phase (known: {known})")
    return host.phases[name]


def spec_args(phase) -> list:
    return contract.spec_args(phase.spec())


def start(host, phase):
    return call_agent(host, "phase-start", spec_args(phase))


def ready(host, phase, wait_s: float, on_progress=None):
    return call_agent(host, "phase-ready", spec_args(phase) + ["--wait", wait_s], on_progress=on_progress)


def stop(host, phase, operator: str):
    return call_agent(host, "phase-stop", spec_args(phase) + ["--operator", operator])


def logs(host, phase, lines: int):
    return call_agent(host, "phase-logs", spec_args(phase) + ["--lines", lines])


def follow_logs(host, phase, lines: int) -> int:
    """Stream the log until Ctrl-C: the agent execs `tail -F` / `journalctl -f` on the host."""
    argv = host.route.wrap(agent_argv(host, "phase-logs", spec_args(phase) + ["--lines", str(lines), "--follow"],
                                      contract.new_nonce(), False))
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE)
    assert proc.stdin is not None  # stdin=PIPE
    proc.stdin.write(agent_stream())
    proc.stdin.close()
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        return 0


def drain(host, url: str, timeout_s: float, on_progress=None):
    return call_agent(host, "drain", ["--url", url, "--timeout", timeout_s], on_progress=on_progress)


def gates(host, phase):
    return call_agent(host, "gates", spec_args(phase))


def lint(host, argv: list, gpus: str | None):
    extra = ["--gpus", gpus] if gpus else []
    return call_agent(host, "lint", ["--argv", json.dumps(argv), *extra])


def deploy(host, phase, action: str):
    return call_agent(host, "deploy", spec_args(phase) + ["--action", action])


def smoke(host, phase):
    return call_agent(host, "smoke", spec_args(phase))
