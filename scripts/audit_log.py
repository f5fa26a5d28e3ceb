"""The local audit log: one JSON line per signal or unit stop, as the host reported it.

Why both sides: the host's copy survives a dropped connection; the operator's copy
($XDG_STATE_HOME/gpu-pivot/audit.jsonl) gathers every host of a fleet in one place.
"""
from __future__ import annotations

import json
import os
from pathlib import Path


def audit_path() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "gpu-pivot" / "audit.jsonl"


def append(alias: str, records: list) -> Path:
    path = audit_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        for rec in records:
            f.write(json.dumps(dict(rec, alias=alias), sort_keys=True) + "\n")
    return path


def read() -> list:
    path = audit_path()
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
