"""The seconds each long test took, so `make test` starts the longest work first.

Why: the suite's wall time on 2 cores is set by what starts last. A 60 s test that waits
for cron's next minute, started near the end, adds its whole minute; started first, it
waits beside everything else. The scheduler (workers.py) orders its work units by these
seconds; a test not listed counts as DEFAULT_S, so a stale or missing file only costs
order, never a result. `make test-durations` rewrites the file from a run's --durations.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

FILE = Path(__file__).with_name("durations.json")
DEFAULT_S = 0.5  # most tests take less
KEEP_FROM_S = 2.0  # shorter ones are left to DEFAULT_S: the file stays small
_LINE = re.compile(r"^(\d+(?:\.\d+)?)s (?:setup|call|teardown)\s+(\S+)")


def known() -> dict:
    """{nodeid: seconds} from FILE; {} when it is missing or unreadable."""
    try:
        data = json.loads(FILE.read_text())
    except (OSError, ValueError):
        return {}
    return {k: float(v) for k, v in data.items() if isinstance(v, (int, float))} if isinstance(data, dict) else {}


def from_log(text: str) -> dict:
    """{nodeid: seconds} summed over setup, call and teardown, from pytest's --durations=0 lines."""
    seconds: dict = {}
    for line in text.splitlines():
        m = _LINE.match(line)
        if m:
            seconds[m.group(2)] = seconds.get(m.group(2), 0.0) + float(m.group(1))
    return {k: round(v, 1) for k, v in sorted(seconds.items()) if v >= KEEP_FROM_S}


def main(argv: list) -> int:
    if len(argv) != 1:
        print("usage: python -m tests.support.durations PYTEST_LOG (a run with --durations=0)", file=sys.stderr)
        return 2
    found = from_log(Path(argv[0]).read_text(errors="replace"))
    if not found:
        print(f"{argv[0]}: no --durations lines; run pytest with --durations=0", file=sys.stderr)
        return 1
    FILE.write_text(json.dumps(found, indent=0, sort_keys=True) + "\n")
    print(f"{FILE}: {len(found)} tests of {KEEP_FROM_S} s or more")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
