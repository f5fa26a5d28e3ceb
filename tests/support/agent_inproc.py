"""The agent run in the test's own process: its entry point (agent cli.main) with the argv a
call sends, its document read as a call reads it (transport.read_document, records.read).

Why: the agent's units test the agent, not the transport; a call through call_agent starts
an interpreter and ships the bundle each time. The wire end to end is tests/reach's.
In-process the agent's pid is the test worker's: the test's processes are its children, and
the worker and its ancestors are protected, as they are for an agent the worker started.
Each run starts with what a fresh agent process has (no worker pids, no cached user names,
no sandbox-uid trust), and what it changes in the process is put back: the environment
(cli.main sets the run dir) and signal handlers (a teardown ignores SIGINT and SIGHUP).
Its run dir is the test's (conftest _private_state), never the machine's.
"""
from __future__ import annotations

import contextlib
import os
import signal
import time

from scripts.agent import cli
from scripts.agent.policy import rules
from scripts.agent.procs import procfs, procscan
from scripts.agent.wire import call, frame, records, requests
from scripts.reach.transport import AgentError, AgentResult, agent_argv, for_host, read_document

_SIGNALS = (signal.SIGINT, signal.SIGHUP, signal.SIGPIPE, signal.SIGTERM)


class _Stdout:
    """The agent's stdout: progress lines to `on_progress` as they come, the rest kept."""

    def __init__(self, on_progress):
        self.on_progress, self.kept = on_progress, []

    def write(self, text):
        fields = frame.parse_progress(text) if self.on_progress else None
        if fields is None:
            self.kept.append(text)
        else:
            self.on_progress(fields)
        return len(text)

    def flush(self):
        pass


@contextlib.contextmanager
def _restored():
    env, handlers = dict(os.environ), {s: signal.getsignal(s) for s in _SIGNALS}
    per_run = (procfs.OWN_WORKERS, procfs.OWN_PROBES, procscan._USER_NAMES, rules._state)
    saved = [type(kept)(kept) for kept in per_run]
    for kept in per_run:
        kept.clear()
    rules._state.update(sandbox_uid=None, uid_min=None)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(env)
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        for kept, value in zip(per_run, saved, strict=True):
            kept.clear()
            kept.update(value)  # type: ignore[attr-defined]


def run_agent(host, request: requests.Request, on_progress=None) -> AgentResult:
    """One agent request on `host` (a local host config) in this process, as call_agent sends
    it (for_host): what call_agent gives (code, doc, the typed record), and raises as it does
    for a refused flag (ConfigError) or the agent's own failure (AgentError)."""
    nonce = frame.new_nonce()
    request = for_host(host, request)
    argv = agent_argv(host, request, nonce, on_progress is not None)
    started = time.monotonic()
    code, out = run_words(argv[argv.index(call.STDIN) + 1:], on_progress)
    doc = read_document(host.alias, out, nonce, code)
    try:
        result = records.read(request.name, code, doc)
    except records.ContractError as exc:
        raise AgentError(f"{host.alias}: {exc} (exit {code})") from None
    return AgentResult(host.alias, code, doc, time.monotonic() - started, result)


def run_words(words: list, on_progress=None) -> tuple:
    """The agent's cli.main on `words` (its subcommand first) in this process: (exit code, what
    it printed but progress lines). Only run_agent and the tests of an argv no request can
    express (tests/test_requests_in_the_wire.py lists them) call it."""
    out = _Stdout(on_progress)
    with _restored(), contextlib.redirect_stdout(out):  # type: ignore[type-var]
        try:
            code = cli.main(words)
        except SystemExit as exc:  # argparse refused the argv: exit 2 and its message on stderr
            code = exc.code if isinstance(exc.code, int) else 2
    return code, "".join(out.kept)
