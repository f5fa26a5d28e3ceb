"""What every task module shares: errors to exit codes, host selection, exit status, Ctrl-C.

Imports only Invoke and scripts.config.defaults when it loads (see scripts/cli/__init__.py). The
exit codes are the wire's (scripts/agent/wire/codes.py), imported where a code is chosen,
so that `invoke --list` loads no more of ours than the defaults.
"""
from __future__ import annotations

import functools
import os
import signal
import sys

from invoke import Exit

from scripts.config import defaults

from .output_guard import guard_stdout

HOST_HELP = f"host alias(es): 'gpu1', 'gpu1,gpu2', 'gpu[1-8]' (default: ${defaults.HOST_ENV} or 'sandbox')"
READ_FANOUT_HELP = f"hosts read at once (default {defaults.READ_FANOUT}; this command signals nothing)"


def fanout_width(fanout) -> int:
    """--fanout: a whole number of hosts worked on at once, at least 1 (every fleet task)."""
    from scripts.config import cliargs

    return cliargs.whole("fanout", fanout, minimum=1)


def code_for(exc: BaseException) -> int | None:
    """The documented exit code for an error users cause or meet; None for a bug (a traceback):
    transport.exit_code_for, and a sandbox that did not start (exit 1: nothing to use). Both
    imported only when an error is being handled: loading the tasks must not load the
    transport, and a module not yet imported cannot have raised its error."""
    from scripts.agent.wire import codes as wire_codes
    from scripts.ops.sandbox_procs import SandboxStartError
    from scripts.reach.transport import exit_code_for

    if isinstance(exc, SandboxStartError):
        return wire_codes.EXIT_FAILED
    return exit_code_for(exc)


INTERRUPTED_LINE = "gpu-pivot: interrupted (Ctrl-C): stopped here"


def json_error(message: str, code: int) -> None:
    """With --json, an error that ends a task before it printed its document (a bad flag or
    value, an unknown alias, a refused directory) is still one JSON document on stdout:
    {"error": "<the line stderr gets, without `gpu-pivot: `>", "exit_code": N}. Nothing is
    printed when the task already printed its document (a failed host is in it)."""
    out = sys.stdout
    if getattr(out, "written", True):  # not guarded (a test calling a task directly), or printed already
        return
    text = str(message)
    print(dumps({"error": text[len("gpu-pivot: "):] if text.startswith("gpu-pivot: ") else text, "exit_code": code}),
          flush=True)


def guarded(fn):
    """Turn the errors users cause or meet into one line and the documented exit code.

    Ctrl-C outside a teardown (which has its own handler, ctrl_c_continues) is one line and
    exit 130: Invoke alone would print a bare ^C and exit 1, which the exit-code table defines as
    "done but not free". A reader that closes stdout early does not stop the task
    (output_guard.guard_stdout). With --json, each of those errors is also a JSON document on stdout
    (json_error)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        guard_stdout()
        as_json = kwargs.get("json") is True
        try:
            result = fn(*args, **kwargs)
        except Exit as exc:
            if as_json and exc.code and exc.message:
                json_error(exc.message, exc.code)
            output_failed(exc.code or 0)
            if exc.message and one_line(exc.message) != exc.message:  # host text in our words: escaped
                raise Exit(one_line(exc.message), code=exc.code) from None
            raise
        except KeyboardInterrupt:
            if as_json:
                json_error(INTERRUPTED_LINE, 130)
            raise Exit(INTERRUPTED_LINE, code=130) from None
        except Exception as exc:
            code = code_for(exc)
            if code is None:
                raise
            if as_json:
                json_error(str(exc), code)
            output_failed(code)
            raise Exit(one_line(f"gpu-pivot: {exc}"), code=code) from None
        output_failed(0)
        return result

    return wrapper


def one_line(text) -> str:
    """An error line as a terminal gets it: what a host sent in it (an agent's stderr, a lock
    holder's name) escaped, one visible line (render.safe's rule)."""
    from scripts.agent.procs import textsafe

    return textsafe.printable(text)


def output_failed(code: int) -> None:
    """After a task: stdout's last buffered text is flushed, and if stdout could not be
    written (output_guard.GuardedStdout.write_error) the task ends with one line on stderr naming the
    task's own exit code, and exit 10, which no script reads as "not free". What the task did
    stands: a teardown ran to its end, its record is in the host's last.json and audit log."""
    out = sys.stdout
    try:
        out.flush()
    except (OSError, ValueError):
        pass
    error = getattr(out, "write_error", None)
    if error is None:
        return
    from scripts.agent.wire import codes as wire_codes

    raise Exit(f"gpu-pivot: the output could not be written ({error.strerror or error}); the task ran to its end "
               f"with exit {code} ({wire_codes.exit_name(code)}); a teardown's result stays on the host: `invoke "
               "status`", code=wire_codes.EXIT_OUTPUT)


def hosts_of(spec: str) -> list:
    """The hosts a --host value names, from hosts.env and the built-ins (ConfigError if bad,
    naming GPU_PIVOT_HOST instead of --host when the value came from there)."""
    from scripts.config import cliargs, hosts

    with cliargs.named("--host", cliargs.source_of("--host", "-H", defaults.HOST_ENV)):
        return hosts.select(spec)


def one_host(spec: str):
    hosts = hosts_of(spec)
    if len(hosts) != 1:
        from scripts.config import cliargs
        from scripts.config.errors import ConfigError, show

        with cliargs.named("--host", cliargs.source_of("--host", "-H", defaults.HOST_ENV)):
            raise ConfigError(f"--host {show(spec)}: this task takes exactly one host")
    return hosts[0]


def exit_worst(codes: list) -> None:
    from scripts.agent.wire import codes as wire_codes

    worst = wire_codes.worst(codes)
    if worst:
        raise Exit(code=worst)


def codes(outcomes: list, agent_code: bool = False) -> list:
    """Each host's exit code: the agent's own (when it decides, e.g. verify) or 0 when it
    answered; for a host whose call failed, its error (printed here) decides as in
    `guarded` (code_for), else not free."""
    from scripts.agent.wire import codes as wire_codes

    out = []
    for o in outcomes:
        if o.error is None:
            out.append(o.value.code if agent_code else wire_codes.EXIT_OK)
            continue
        print(one_line(f"gpu-pivot: {o.error}"), file=sys.stderr)
        out.append(code_for(o.error) or wire_codes.EXIT_NOT_FREE)
    return out


def operator() -> str:
    """Who acts, as the host's audit log records it: user@this-machine."""
    import getpass
    import socket

    return f"{getpass.getuser()}@{socket.gethostname()}"


def print_views(host, result, *views, file=None) -> None:
    """The host's header line, then each non-empty view of the agent's result (its record),
    to `file` (default stdout; stderr where stdout holds --json)."""
    from scripts.views import status as status_view

    print(status_view.header(host.alias, result, host.sandbox), file=file)
    for view in views:
        text = view(result)
        if text:
            print(text, file=file)


def dumps(value) -> str:
    """--json text: valid Unicode whatever the host sent (a non-UTF-8 byte as U+EF80+: textsafe)."""
    from scripts.agent.procs import textsafe

    return textsafe.dumps(value, indent=1, sort_keys=True)


class ctrl_c_continues:
    """While a teardown runs, Ctrl-C says the host side continues and how to see it; exit 130.

    The agent does not stop: behind ssh it ignores the hangup, and on this machine it runs
    in its own session (transport.call_agent). Why a SIGINT handler and os._exit rather
    than `except KeyboardInterrupt`: a fleet's worker threads would be joined on the way
    out, i.e. we would wait for every host's teardown before exiting; and the message is
    written with os.write, since the interrupted code may hold sys.stdout's lock.
    """

    def __init__(self, hosts, what: str):
        from scripts.agent.wire import codes as wire_codes

        self.code = wire_codes.EXIT_INTERRUPTED  # looked up now: the handler must not import
        names = ",".join(h.alias for h in hosts)
        self.line = f"interrupted: {what} on {names}; see its result with `invoke status --host {names}`\n"

    def _on_sigint(self, signum, frame):
        try:
            sys.stdout.flush()
        except Exception:  # reentrant flush, closed pipe: the line below matters more
            pass
        # on a terminal the line starts a line of its own: not after the ^C the terminal
        # echoed, nor at the end of a progress line rewritten in place
        os.write(2, ("\n" if os.isatty(2) else "").encode() + self.line.encode())
        os._exit(self.code)

    def __enter__(self):
        self.old = signal.signal(signal.SIGINT, self._on_sigint)

    def __exit__(self, *exc):
        signal.signal(signal.SIGINT, self.old)
