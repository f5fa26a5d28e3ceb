"""Parse psmisc `fuser` output beyond the PID list: file names and access letters (stderr).

Test-only: tests/agent/status/test_scan.py cross-checks the agent's /proc scan against a real `fuser -v`,
and tests/emergency/test_fuser_captures.py reads the H200 captures. The agent never runs fuser, so this does
not ship in its bundle; the PID list reader the local side needs is scripts/emergency/fuser_parse.py.
"""
import re
from typing import Any

from scripts.emergency.fuser_parse import FuserParseError, pids

__all__ = ["FuserParseError", "pids", "plain", "plain_files", "verbose"]

# stderr of `fuser -v`: the PID column goes to stdout, so a row is [FILE:] USER ACCESS COMMAND
# (or [FILE:] USER kernel ... for a mount, which has no PID on stdout).
_VERBOSE_ROW = re.compile(r"^(?:(?P<file>\S.*?):)?\s+(?P<user>\S+)\s+(?P<access>\S+)\s+(?P<command>.*)$")
_FILE_ONLY = re.compile(r"^\S.*:\s*$")
_WARNINGS = ("Cannot ", "Specified filename", "No such")


def _pid_sequence(stdout, end):
    if end is not None:
        stdout = stdout[:stdout.index(end)] if end in stdout else stdout
    seq = []
    for token in stdout.split():
        if not token.isdigit():
            raise FuserParseError("unexpected text %r in fuser's PID list" % token)
        seq.append(int(token))
    return seq


def plain_files(stderr):
    """[(file, access letters)] from plain `fuser FILES` stderr ('/dev/nvidia0:   mm')."""
    out = []
    for line in stderr.splitlines():
        if ":" in line and not line.startswith(_WARNINGS):
            name, _, letters = line.partition(":")
            out.append((name.strip(), letters.strip()))
    return out


def plain(stdout, stderr, end=None):
    """{'pids': [...], 'files': [(file, letters)], 'holders': {pid: [files]} or None}.

    Plain mode does not say which PID belongs to which file when stdout and stderr are
    captured apart; fuser lists each file's PIDs in ascending order, so when the ascending
    runs of the stdout sequence match the files one for one, that mapping is returned,
    else holders is None (use `fuser -v` for an exact map).
    """
    seq = _pid_sequence(stdout, end)
    files = plain_files(stderr)
    runs: list[list[int]] = []
    for pid in seq:
        if runs and pid > runs[-1][-1]:
            runs[-1].append(pid)
        else:
            runs.append([pid])
    holders: dict[int, list[str]] | None = None
    if files and len(runs) == len(files):
        holders = {}
        for (name, _), run in zip(files, runs, strict=True):
            for pid in run:
                holders.setdefault(pid, []).append(name)
    return {"pids": pids(stdout, end), "files": files, "holders": holders}


def verbose(stdout, stderr, end=None):
    """`fuser -v`: stderr rows pair one for one, in order, with the PIDs on stdout.

    Returns {'pids': [...], 'rows': [{file, user, pid, access, command}], 'holders': {pid: [files]}}.
    """
    seq = _pid_sequence(stdout, end)
    rows: list[dict[str, Any]] = []
    current, pid_iter, warnings = None, iter(seq), []
    for line in stderr.splitlines():
        if not line.strip() or line.strip().startswith("USER"):
            continue
        if line.startswith(_WARNINGS):  # fuser's own complaints, e.g. /proc entries it may not read
            warnings.append(line)
            continue
        if _FILE_ONLY.match(line):  # a long name stands alone; its rows follow
            current = line.strip()[:-1]
            continue
        m = _VERBOSE_ROW.match(line)
        if not m:
            raise FuserParseError("unexpected fuser -v line %r" % line)
        if m.group("file"):
            current = m.group("file").strip()
        if m.group("access") == "kernel":
            continue
        rows.append({"file": current, "user": m.group("user"), "pid": next(pid_iter, None),
                     "access": m.group("access"), "command": m.group("command").strip()})
    if len(rows) != len(seq):
        raise FuserParseError("fuser -v rows (%d) do not match the PIDs on stdout (%d)" % (len(rows), len(seq)))
    holders: dict[int, list[str]] = {}
    for r in rows:
        holders.setdefault(r["pid"], []).append(r["file"])
    return {"pids": pids(stdout, end), "rows": rows, "holders": holders, "warnings": warnings}
