"""Run one function per host in parallel, bounded by a fanout, results in host order.

Why: a pivot across eight hosts should take as long as the slowest host, not the sum,
and one unreachable host must not stop the others. Each host's outcome is kept: a value,
or the exception it raised.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ..config.defaults import FANOUT as DEFAULT_FANOUT


@dataclass
class Outcome:
    host: object
    value: object = None
    error: BaseException | None = None


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
