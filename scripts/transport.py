"""Run the agent on a host in one round trip and read back its one JSON document.

Why: the agent source goes on stdin (`python3 - SUBCOMMAND`), so a call is exactly one
ssh connection (or none, for this machine), nothing is installed on the host, and only a
short argv needs quoting. Everything outside the nonce'd marker lines is noise and ignored.
"""
from __future__ import annotations

import json
import secrets
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass

from .agent import markers
from .agent.cli import PROGRESS_PREFIX
from .agent.statedir import StateDirError
from .bundle import agent_payload
from .route import HostUnreachable


class AgentError(RuntimeError):
    """The agent ran (or tried to) but gave no usable result; the text says why."""


@dataclass
class AgentResult:
    host: str
    code: int
    doc: dict
    wall_s: float
    stderr: str


def _tail(text: str, lines: int = 5) -> str:
    kept = [line for line in text.strip().splitlines() if line.strip()][-lines:]
    return " | ".join(kept) or "(nothing on stderr)"


SELECTING = ("scan", "verify", "plan", "teardown", "lint")


def agent_argv(host, subcommand: str, args, nonce: str, progress: bool) -> list:
    """The agent's argv on the host: its subcommand plus what the host config selects."""
    argv = [host.python, "-", subcommand, "--devices", host.devices, "--marker", nonce]
    if progress:
        argv.append("--progress")
    if host.run_dir:
        argv += ["--run-dir", host.run_dir]
    if host.fake_devices:
        argv.append("--fake-devices")
    if subcommand in SELECTING:
        for pattern in host.targets:
            argv += ["--target", pattern]
        for pattern in host.protect:
            argv += ["--protect", pattern]
        if host.fake_gpus:
            argv += ["--fake-gpus", host.fake_gpus]
        if host.scope:
            argv += ["--scope", host.scope]
        if host.scope_uid is not None:
            argv += ["--scope-uid", str(host.scope_uid)]
    return argv + [str(a) for a in args]


def call_agent(host, subcommand: str, args=(), on_progress=None, timeout: float | None = None) -> AgentResult:
    """Run one agent subcommand on `host`. Raises HostUnreachable or AgentError."""
    nonce = secrets.token_hex(8)
    try:
        cmd = host.route.wrap(agent_argv(host, subcommand, args, nonce, on_progress is not None))
    except StateDirError as exc:  # the local ssh ControlPath directory was refused
        raise AgentError(f"{host.alias}: {exc}") from None
    payload = agent_payload()
    started = time.monotonic()
    # stderr goes to a file, not a pipe: a ControlPersist master forked by this ssh keeps
    # its stderr open for minutes, and waiting for EOF on a pipe would hang until then.
    with tempfile.TemporaryFile() as err:
        # On this machine (no hops) the agent gets its own session, as it would on a host
        # behind ssh: a Ctrl-C at the operator's terminal must not reach it mid-teardown.
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                                start_new_session=not host.route.hops)
        feeder = threading.Thread(target=_feed, args=(proc, payload), daemon=True)
        feeder.start()
        out_lines = []
        timer = threading.Timer(timeout, proc.kill) if timeout else None
        if timer:
            timer.start()
        try:
            for raw in proc.stdout:
                line = raw.decode("utf-8", "replace")
                if on_progress and line.startswith(PROGRESS_PREFIX):
                    try:
                        on_progress(json.loads(line[len(PROGRESS_PREFIX):]))
                        continue
                    except ValueError:
                        pass
                out_lines.append(line)
            code = proc.wait()
        finally:
            if timer:
                timer.cancel()
        err.seek(0)
        stderr = err.read().decode("utf-8", "replace")
    wall = time.monotonic() - started
    return AgentResult(host.alias, code, _parse(host, "".join(out_lines), nonce, code, stderr), wall, stderr)


def _feed(proc, payload: bytes) -> None:
    try:
        proc.stdin.write(payload)
        proc.stdin.close()
    except (BrokenPipeError, OSError):
        pass  # the far side exited early; its exit code and stderr say why


def _parse(host, stdout: str, nonce: str, code: int, stderr: str) -> dict:
    try:
        body = markers.extract(stdout, nonce)
    except markers.MarkerError as exc:
        if host.route.ssh_failed(code):
            raise HostUnreachable(f"{host.alias}: host unreachable (ssh exit 255: {_tail(stderr, 2)})") from None
        raise AgentError(f"{host.alias}: {exc}; the command exited {code}; stderr: {_tail(stderr)}") from None
    try:
        doc = json.loads(body)
    except ValueError as exc:
        raise AgentError(f"{host.alias}: the agent's result is not valid JSON ({exc}); exit {code}") from None
    if not isinstance(doc, dict):
        raise AgentError(f"{host.alias}: the agent's result is not a JSON object; exit {code}")
    if doc.get("usage_error"):
        from .hostconfig import ConfigError

        raise ConfigError(f"{host.alias}: {doc['usage_error']}")
    return doc
