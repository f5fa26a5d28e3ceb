"""Read the emergency one-liner's report (scripts/emergency/teardown.sh's output between its
markers) into lists and decisions. Test-only: the operator reads the report on screen; the
tests read what it says to check it against what ran."""
from __future__ import annotations

import re

# the lines teardown.sh prints around its report
BEGIN, END = "==gpu-pivot-oneliner begin==", "==gpu-pivot-oneliner end=="
LISTS = ("holders", "protected", "outside-scope", "sigTERM", "sigKILL", "remaining", "protected-mapped")
_ITEM = re.compile(r"(\d+) \(([^()\s]*)\)")
_DECISION = re.compile(r"^(TERM|keep|leave) (\d+) \(([^()\s]*)\): (.*)$")


def parse_report(text: str) -> dict:
    """{'holders': [pids], 'protected': [...], 'outside-scope': [...], 'sigTERM': [...], 'sigKILL': [...],
    'remaining': [...], 'protected-mapped': [...], 'verdict': 'free'|'not-free'|'NO GPU VISIBLE',
    'no-gpu-visible': why (only then), 'names': {pid: name},
    'decisions': {pid: (verb, why and command line)}, 'waiting': [lines]} from the script's output
    (noise around it ignored)."""
    lines = text.splitlines()
    # the markers as whole lines: a command line shown in the report may hold their text
    if BEGIN not in lines or END not in lines[lines.index(BEGIN):]:
        raise ValueError("no gpu-pivot one-liner report in the output")
    begin = lines.index(BEGIN)
    body = lines[begin + 1:lines.index(END, begin)]
    out: dict = {"names": {}, "decisions": {}, "waiting": []}
    for line in body:
        decision = _DECISION.match(line)
        if decision:
            verb, pid, name, why = decision.groups()
            out["decisions"][int(pid)] = (verb, why)
            out["names"][int(pid)] = name
            continue
        key, _, rest = line.partition(":")
        if key.startswith("waiting"):
            out["waiting"].append(line)
        elif key in ("verdict", "not-root", "restarters"):
            out[key] = rest.strip()
        elif key == "NO GPU VISIBLE":
            out["no-gpu-visible"] = rest.strip()
        elif key == "gpus-with-memory-used":
            out[key] = int(rest.strip())
        elif key in LISTS:
            items = _ITEM.findall(rest)
            if rest.strip() != "none" and len(items) != len(rest.split()) // 2:
                raise ValueError(f"unexpected text in the report's {key} line: {rest.strip()!r}")
            out[key] = [int(pid) for pid, _ in items]
            out["names"].update((int(pid), name) for pid, name in items)
    return out
