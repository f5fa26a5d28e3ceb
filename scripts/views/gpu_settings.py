"""A gpu-settings result in words: one line for the pivot's step, and a line per setting
written or failed, with its value before and after (`GPU 1 power limit 500 -> 700 W`)."""
from __future__ import annotations

from ..agent.wire import records
from .status import SETTING_WORDS


def _value(row, key: str) -> str:
    unit = SETTING_WORDS.get(row.get("field", ""), ("", ""))[1]
    return "?" if row.get(key) is None else f"{row[key]}{unit}"


def settings_lines(r: records.SettingsResult) -> list:
    """Each setting written ("set") or not ("FAILED", with its GPU, field and error)."""
    out = []
    for row in r.rows:
        words = SETTING_WORDS.get(row.get("field", ""), (row.get("field", "?"), ""))[0]
        head = f"GPU {row.get('gpu')} {words}"
        if row.get("result") == "set":
            out.append(f"{head}: {_value(row, 'before')} -> {_value(row, 'after')}")
        elif row.get("result") == "FAILED":
            out.append(f"{head}: FAILED (wanted {_value(row, 'want')}, reads {_value(row, 'after')}): "
                       f"{row.get('error')}")
    return out + ([r.note] if r.note else [])


def settings_line(r: records.SettingsResult) -> str:
    """`2 set, 6 already right` or `FAILED on GPU 1: power limit`."""
    failed = [x for x in r.rows if x.get("result") == "FAILED"]
    if failed or not r.rows:
        return "FAILED: " + ("; ".join(f"GPU {x.get('gpu')} {x.get('field')}" for x in failed) or r.note or "none set")
    n_set = sum(1 for x in r.rows if x.get("result") == "set")
    return f"{n_set} set, {len(r.rows) - n_set} already right ({len({x.get('gpu') for x in r.rows})} GPUs)"
