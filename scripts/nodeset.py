"""Expand a --host value into aliases: 'gpu1,gpu2', 'gpu[1-8]', 'gpu[01-16],big1'.

Why ClusterShell: its NodeSet is the parser HPC operators already type (pdsh/clush syntax),
with zero-padding and ranges done right; writing our own would be a second, worse dialect.
"""
from __future__ import annotations

from ClusterShell.NodeSet import NodeSet, NodeSetParseError

from .config_error import ConfigError


def expand(spec: str) -> list:
    """Aliases in the order given, duplicates removed. Raises ConfigError on bad syntax."""
    if not spec or not spec.strip():
        raise ConfigError("--host is empty: name a host alias (see `invoke hosts`)")
    names: list = []
    for part in _top_level_split(spec):
        try:
            expanded = list(NodeSet(part)) if "[" in part else [part]
        except NodeSetParseError as exc:
            raise ConfigError(f"--host {spec!r}: bad node set {part!r} ({exc})") from None
        for name in expanded:
            name = name.strip().lower()
            if not name:
                raise ConfigError(f"--host {spec!r}: empty host name")
            if name not in names:
                names.append(name)
    return names


def _top_level_split(spec: str) -> list:
    """Split on commas outside brackets, so 'gpu[1,3],big1' keeps its set together."""
    parts, depth, cur = [], 0, ""
    for ch in spec:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return [p.strip() for p in parts]
