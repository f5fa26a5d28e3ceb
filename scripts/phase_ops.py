"""Local side of phases: each operation is one agent call on the host (one round trip).

Why a module: `invoke start/stop/logs/lint-launch` and every step of `invoke pivot` use the
same calls; the pivot only orders them.
"""
from __future__ import annotations

import json
import subprocess

from .agent import contract
from .config_error import ConfigError, show
from .transport import agent_argv, call_agent, kill_and_reap


def phase_of(host, name: str):
    if not name:  # the flag was not given: say it is required, not "no such phase ''"
        known = ", ".join(sorted(host.phases)) or "none configured"
        raise ConfigError(f"--phase is required (host {host.alias} has: {known})")
    if name not in host.phases:
        known = ", ".join(sorted(host.phases)) or "none configured"
        raise ConfigError(f"--phase {show(name)}: host {host.alias} has no such phase (known: {known})")
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


def follow_logs(host, phase, lines: int):
    """Stream the log until Ctrl-C: the agent execs `tail -F` / `journalctl -f` on the host.

    Returns (exit code, the agent's result document or None). The agent answers with a
    result instead of following when it cannot (a phase never started there): that frame
    is read like any call's (transport), never printed raw. Errors as every call's: ssh's
    own failure is HostUnreachable (exit 3), its connect or keep-alive timeout HostTimedOut
    (exit 7); there is no deadline, following is open-ended. Ctrl-C ends the stream and is
    re-raised (exit 130 through `guarded`)."""
    import sys
    import tempfile
    import threading

    from .remote_cmd import follow_stderr
    from .render import safe
    from .route import ran_line, read_ssh_log, ssh_failure, ssh_log
    from .transport import AgentError, _feed as feed, _parse as parse_result, route_ran  # as every agent call

    nonce = contract.new_nonce()
    begin = contract.begin(nonce).encode()
    argv = agent_argv(host, "phase-logs", spec_args(phase) + ["--lines", str(lines), "--follow"], nonce, False)
    with ssh_log(host.route) as log, tempfile.TemporaryFile() as err:
        cmd = host.route.wrap(host.route.marked(argv, nonce), ssh_log=log.path if log else None)
        try:
            proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err)
        except OSError as exc:  # LOCAL_PYTHON names no program
            raise AgentError(f"{host.alias}: could not start {cmd[0]!r}: {exc.strerror or exc}") from None
        build_failed: list = []
        threading.Thread(target=feed, args=(proc, not host.route.hops, build_failed), daemon=True).start()
        seen: dict = {"ran": host.route.ssh is None, "err": [], "partial": b""}
        done = threading.Event()
        stderr_reader = threading.Thread(target=follow_stderr, args=(err, ran_line(nonce).encode(), seen, False, done),
                                         daemon=True)
        stderr_reader.start()
        frame: list = []  # the agent's result, when it answered instead of following
        assert proc.stdout is not None  # stdout=PIPE
        try:
            for raw in proc.stdout:
                if frame or raw.rstrip(b"\n") == begin:
                    frame.append(raw)
                    continue
                # a log line is the host's text: escaped (no escape sequence or bidi override reaches
                # the terminal raw: render.safe), one line out per line in
                sys.stdout.write(safe(contract.textsafe.decode(raw).rstrip("\n")) + "\n")
                sys.stdout.flush()
            code = proc.wait()
        except KeyboardInterrupt:
            _end(proc)
            raise
        finally:
            done.set()
            stderr_reader.join()
        ssh_said = read_ssh_log(log)
    if build_failed:
        raise AgentError(f"{host.alias}: could not build the agent bundle: {build_failed[0]}")
    stderr = b"".join(seen["err"]).decode("utf-8", "replace")
    ran = seen["ran"] or route_ran(host, stderr, nonce)
    if frame:
        return code, parse_result(host, b"".join(frame).decode("utf-8", "replace"), nonce, code, stderr, ran, ssh_said)
    failure = ssh_failure(host.route, host.alias, code, ran, ssh_said, stderr)
    if failure is not None:
        raise failure
    return code, None


def _end(proc) -> None:
    """Stop the stream's local process (ssh, or the agent's tail here) and reap it."""
    proc.terminate()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        kill_and_reap(proc)


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
