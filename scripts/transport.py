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
from .bundle import agent_payload
from .config_error import ConfigError
from .route import HostUnreachable


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


def _tail(text: str, lines: int = 5) -> str:
    kept = [line for line in text.strip().splitlines() if line.strip()][-lines:]
    return " | ".join(kept) or "(nothing on stderr)"


def agent_argv(host, subcommand: str, args, nonce: str, progress: bool) -> list:
    """The agent's argv on the host (contract.agent_argv) with what the host config selects."""
    return contract.agent_argv(host.python, subcommand, nonce, host.devices, progress=progress, run_dir=host.run_dir,
                               fake_devices=host.fake_devices, targets=host.targets, protect=host.protect,
                               fake_gpus=host.fake_gpus, scope=host.scope, scope_uid=host.scope_uid, args=args)


def call_agent(host, subcommand: str, args=(), on_progress=None) -> AgentResult:
    """Run one agent subcommand on `host`. Raises HostUnreachable, AgentError, or ConfigError
    (the agent refused a flag's value: exit 2, nothing done)."""
    nonce = contract.new_nonce()
    try:
        cmd = host.route.wrap(agent_argv(host, subcommand, args, nonce, on_progress is not None))
    except contract.statedir.StateDirError as exc:  # the local ssh ControlPath directory was refused
        raise AgentError(f"{host.alias}: {exc}") from None
    payload = agent_payload()
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
        feeder = threading.Thread(target=_feed, args=(proc, payload), daemon=True)
        feeder.start()
        out_lines = []
        assert proc.stdout is not None  # stdout=PIPE
        for raw in proc.stdout:
            line = raw.decode("utf-8", "replace")
            fields = contract.parse_progress(line) if on_progress else None
            if fields is not None:
                on_progress(fields)
                continue
            out_lines.append(line)
        code = proc.wait()
        err.seek(0)
        stderr = err.read().decode("utf-8", "replace")
    wall = time.monotonic() - started
    doc = _parse(host, "".join(out_lines), nonce, code, stderr)
    try:
        result = contract.read(subcommand, code, doc)
    except contract.ContractError as exc:
        raise AgentError(f"{host.alias}: {exc} (exit {code})") from None
    return AgentResult(host.alias, code, doc, wall, result)


def _feed(proc, payload: bytes) -> None:
    try:
        proc.stdin.write(payload)
        proc.stdin.close()
    except (BrokenPipeError, OSError):
        pass  # the far side exited early; its exit code and stderr say why


def _parse(host, stdout: str, nonce: str, code: int, stderr: str) -> dict:
    try:
        body = contract.extract(stdout, nonce)
    except contract.MarkerError as exc:
        if host.route.ssh_failed(code):
            raise HostUnreachable(f"{host.alias}: host unreachable (ssh exit 255: {_tail(stderr, 2)})") from None
        raise AgentError(f"{host.alias}: {exc}; the command exited {code}; stderr: {_tail(stderr)}") from None
    try:
        doc = json.loads(body)
    except ValueError as exc:
        raise AgentError(f"{host.alias}: the agent's result is not valid JSON ({exc}); exit {code}") from None
    if not isinstance(doc, dict):
        raise AgentError(f"{host.alias}: the agent's result is not a JSON object; exit {code}")
    if doc.get(contract.USAGE_ERROR):
        raise ConfigError(f"{host.alias}: {doc[contract.USAGE_ERROR]}")
    return doc
