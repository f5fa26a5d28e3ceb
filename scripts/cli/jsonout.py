"""The --json shape of a host whose call failed: {alias: {"error": "...", "exit_code": N}}.

Why one place: a script reading --json must tell "no answer" from "nothing to report", so a
failed host is never left out of the document (nor `{}`, `[]`, or nothing at all when the
one host failed), whichever task printed it. Every --json task prints
each failed host with the one line it printed on stderr and the exit code it gives.
"""
from __future__ import annotations

import contextlib

from .common import code_for, dumps


def failed(error: BaseException) -> dict:
    """A failed host's document: its error line and the exit code that error gives."""
    from scripts.agent.wire import codes

    return {"error": str(error), "exit_code": code_for(error) or codes.EXIT_NOT_FREE}


def docs(outcomes: list) -> dict:
    """{alias: the agent's document, or failed() for a host whose call failed}."""
    return {o.host.alias: o.value.doc if o.error is None else failed(o.error) for o in outcomes}


@contextlib.contextmanager
def one_host(alias: str, json: bool):
    """Around a one-host task's call: with --json, a documented failure (unreachable, timed
    out, a refused value) still prints {alias: failed(...)} on stdout before `guarded`
    prints its line on stderr and exits with the code."""
    try:
        yield
    except Exception as exc:
        if json and code_for(exc) is not None:
            print(dumps({alias: failed(exc)}), flush=True)
        raise
