"""The measured physical floor of a teardown: signal a whole tree -> NVML shows it freed.

Why: a teardown's wall time only means something next to this floor (0.26-0.37 s on an
H200, tests/fixtures/h200-driver580/release-floor.json); reports quote both.
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path


def release_floor(path: Path) -> dict:
    runs = json.loads(Path(path).read_text())
    times = [r["nvml_free_s"] for r in runs if r.get("nvml_free_s") is not None]
    return {"min_s": min(times), "max_s": max(times), "median_s": statistics.median(times), "runs": len(times)}
