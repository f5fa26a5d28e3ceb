"""Read the PID list psmisc `fuser` prints on stdout (the emergency teardown's report uses it).

Why a parser: fuser prints each PID once per device file, space-padded and with no final
newline, so whatever prints next is glued to the last PID (`803rc=0`, `1649750`,
`3653done` in captured output). We never guess where a glued PID ends: the caller marks
the end of fuser's stdout (e.g. prints a marker right after it) and passes it as `end`;
text that is not a PID is an error that names it.

Local side only: the agent finds holders in /proc (agent/procs/procscan.py), never through fuser.
The parsers of fuser's file/access columns, used by tests to cross-check that scan, are in
tests/support/parsers/fuser.py.
"""
from __future__ import annotations


class FuserParseError(ValueError):
    pass


def pids(stdout: str, end: str | None = None) -> list:
    """PIDs in first-seen order, each once. `end`: where fuser's output stops in `stdout`."""
    if end is not None:
        cut = stdout.find(end)
        if cut < 0:
            raise FuserParseError("end marker %r not found in fuser output" % end)
        stdout = stdout[:cut]
    out: list = []
    for token in stdout.split():
        if not token.isdigit():
            raise FuserParseError("unexpected text %r in fuser's PID list (is other output glued on? pass end=)"
                                  % token)
        pid = int(token)
        if pid not in out:
            out.append(pid)
    return out
