"""GPU settings as hosts.env gives them: the host's baseline (ALIAS_GPU_BASELINE) and a
phase's own (ALIAS_PHASE_X_GPU_SETTINGS), one JSON object of the same fields, checked whole.

Why checked whole: a typo in a field would otherwise compare (and set) nothing, and every GPU
would read as matching. One line names the key, its value and what is wrong.
"""
from __future__ import annotations

import json

from .errors import ConfigError, show

# The fields: {field: (the words it takes, or None: a positive number; its unit)}
FIELDS: dict = {
    "persistence": (("on", "off"), ""), "compute_mode": (("default", "exclusive_process", "prohibited"), ""),
    "graphics_clock_mhz": (None, "MHz"), "memory_clock_mhz": (None, "MHz"), "power_limit_w": (None, "W"),
    "mig": (("on", "off"), ""),
}


def parse(key: str, value: str) -> dict:
    """{field: value} of `value`, or ConfigError naming `key`, the value and the bad field."""
    try:
        doc = json.loads(value)
    except ValueError:
        doc = None
    if not isinstance(doc, dict) or not doc:
        raise ConfigError(f"{key}={show(value)}: not a JSON object of GPU settings, e.g. "
                          '{"persistence": "on", "compute_mode": "default", "power_limit_w": 700}')
    for name, want in doc.items():
        if name not in FIELDS:
            raise ConfigError(f"{key}={show(value)}: unknown setting {name!r} (known: {', '.join(FIELDS)})")
        words, unit = FIELDS[name]
        if words is not None and want not in words:
            raise ConfigError(f"{key}={show(value)}: {name} must be {' or '.join(words)}, not {json.dumps(want)}")
        if words is None and (isinstance(want, bool) or not isinstance(want, (int, float)) or not 0 < want < 1e6):
            raise ConfigError(f"{key}={show(value)}: {name} must be a positive number ({unit}), not {json.dumps(want)}")
    return doc
