"""The local audit log: one JSON line per signal or unit stop, as the host reported it.

Why both sides: the host's copy survives a dropped connection; the operator's copy
($XDG_STATE_HOME/gpu-pivot/audit.jsonl) gathers every host of a fleet in one place.
Why statedir: the directory is created 0700 and checked (a squatted or loose one is
refused with one line naming it), and the file is appended O_NOFOLLOW, created 0600,
so a planted symlink never makes us append to someone else's file.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from ..agent.state import statedir


def audit_dir() -> Path:
    return Path(statedir.state_home()) / "gpu-pivot"


def audit_path() -> Path:
    return audit_dir() / "audit.jsonl"


def append(alias: str, records: list) -> Path | None:
    """Append the records. It runs after the host has acted, so a failure (refused or
    full directory, planted link) must not hide that result: it is one line on stderr
    naming the path and what is wrong, and None is returned."""
    path = audit_path()
    try:
        statedir.private_dir(str(audit_dir()), parents=True)
        for rec in records:
            statedir.append_json(str(path), dict(rec, alias=alias))
    except OSError as exc:
        print(f"gpu-pivot: the local audit log was not written ({len(records)} record(s)): {exc}", file=sys.stderr)
        return None
    return path


def read() -> list:
    """Every record that can be read (read_counted); raises StateDirError when the directory
    or file is refused."""
    return read_counted()[0]


def read_counted() -> tuple:
    """(records, how many lines were skipped): a torn line (a writer killed or the disk full
    mid-write), text that is not JSON, or JSON that is not a record the table can show
    (`"argv": 5` made `invoke audit` exit 1 with a TypeError). One bad line must
    not hide the others, and the count is shown so none disappears unnoticed."""
    if not audit_dir().exists() and not audit_dir().is_symlink():
        return [], 0
    statedir.private_dir(str(audit_dir()))  # checks it (exists already): never read through a link
    try:
        data = statedir.read_bytes(str(audit_path()))
    except FileNotFoundError:
        return [], 0
    out, skipped = [], 0
    for line in data.decode("utf-8", "replace").split("\n"):  # JSON lines: \n ends one (splitlines: \x0b, \x85 too)
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except (ValueError, RecursionError):
            rec = None
        if usable(rec):
            out.append(rec)
        else:
            skipped += 1
    return out, skipped


_TEXT = ("time", "alias", "host", "operator", "signal", "event", "result", "verdict", "cmdline", "to")


def usable(rec) -> bool:
    """A record whose fields have the types the writers give them (text, a pid, an argv list),
    so that the table and --json show it as it is."""
    if not isinstance(rec, dict):
        return False
    if any(rec.get(k) is not None and not isinstance(rec[k], str) for k in _TEXT):
        return False
    pid = rec.get("pid")
    if pid is not None and (isinstance(pid, bool) or not isinstance(pid, int)):
        return False
    argv = rec.get("argv")
    return argv is None or (isinstance(argv, list) and all(isinstance(a, str) for a in argv))

