"""Run one function per host in parallel, bounded by a fanout, results in host order.

Why: a pivot across eight hosts should take as long as the slowest host, not the sum,
and one unreachable host must not stop the others. Each host's outcome is kept: a value,
or the exception it raised with what that failure was (Failure), read here from reach's
error types so the views above say it without knowing them.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Literal

from ..agent.state.statedir import StateDirError
from ..config.defaults import FANOUT as DEFAULT_FANOUT
from ..config.errors import ConfigError
from ..reach.route import HostKeyFailed, HostTimedOut, HostUnreachable, LoginRefused, SudoRefused
from ..reach.transport import AgentError, exit_code_for

Kind = Literal["timed out", "host key", "login refused", "sudo refused", "unreachable", "agent error",
               "state dir", "usage", "error"]
# Most specific first: HostTimedOut, HostKeyFailed... are HostUnreachables.
_KINDS: tuple[tuple[type[BaseException], Kind], ...] = (
    (HostTimedOut, "timed out"), (HostKeyFailed, "host key"), (LoginRefused, "login refused"),
    (SudoRefused, "sudo refused"), (HostUnreachable, "unreachable"), (AgentError, "agent error"),
    (StateDirError, "state dir"), (ConfigError, "usage"))


@dataclass(frozen=True)
class Failure:
    """A host's failed call: its kind, the exit code it gives (transport.exit_code_for; None
    for an error no code documents, a bug) and the error's text."""

    kind: Kind
    code: int | None
    said: str

    @classmethod
    def of(cls, exc: BaseException) -> Failure:
        kind: Kind = next((k for t, k in _KINDS if isinstance(exc, t)), "error")
        return cls(kind, exit_code_for(exc), str(exc))


@dataclass
class Outcome:
    """One host's result: its value, or the error it raised and that error's Failure."""

    host: object
    value: object = None
    error: BaseException | None = None
    failure: Failure | None = field(init=False, default=None)

    def __post_init__(self):
        if self.error is not None:
            self.failure = Failure.of(self.error)


def each_host(hosts: list, fn, fanout: int = DEFAULT_FANOUT, on_done=None) -> list:
    """fn(host) for every host, at most `fanout` at once. on_done(outcome) as each ends."""

    def one(host):
        try:
            out = Outcome(host, value=fn(host))
        except Exception as exc:  # kept per host; the caller decides the exit code
            out = Outcome(host, error=exc)
        if on_done:
            on_done(out)
        return out

    if len(hosts) == 1:
        return [one(hosts[0])]
    with ThreadPoolExecutor(max_workers=max(1, min(fanout, len(hosts)))) as pool:
        return list(pool.map(one, hosts))
