"""Expand a --host value into aliases: 'gpu1,gpu2', 'gpu[1-8]', 'gpu[01-16],big1'.

Why ClusterShell: its NodeSet is the parser HPC operators already type (pdsh/clush syntax),
with zero-padding and ranges done right; writing our own would be a second, worse dialect.
"""
from __future__ import annotations

import re

from .errors import ConfigError

MAX_HOSTS = 4096  # a fleet larger than this is a typo ('gpu[1-99999999]'), not a teardown


def expand(spec: str) -> list:
    """Aliases in the order given, duplicates removed. Raises ConfigError on bad syntax."""
    if not spec or not spec.strip():
        raise ConfigError("--host is empty: name a host alias (see `invoke hosts`)")
    names: list = []
    for part in _top_level_split(spec):
        count = _count(part)
        if count + len(names) > MAX_HOSTS:  # counted from the text: ClusterShell would build every name first
            raise ConfigError(f"--host {spec!r}: names {count + len(names)} hosts or more; at most {MAX_HOSTS} at once")
        try:
            expanded = _node_set(part) if "[" in part else [part]
        except ValueError as exc:
            raise ConfigError(f"--host {spec!r}: bad node set {part!r} ({exc})") from None
        for name in expanded:
            name = name.strip().lower()
            if not name:
                raise ConfigError(f"--host {spec!r}: empty host name")
            if name not in names:
                names.append(name)
    return names


def _node_set(part: str) -> list:
    """ClusterShell's expansion of one bracketed part; its parse error as ValueError. Imported
    here, not at the top: ClusterShell costs ~7 ms a start, and `--host gpu1` has no brackets."""
    from ClusterShell.NodeSet import NodeSet, NodeSetParseError

    try:
        return list(NodeSet(part))
    except NodeSetParseError as exc:
        raise ValueError(str(exc)) from None


def _count(part: str) -> int:
    """How many names a node set names, from its text alone (an upper bound; 1 if unparsable:
    ClusterShell then says what is wrong)."""
    total = 1
    for group in re.findall(r"\[([^\]]*)\]", part):
        size = 0
        for item in group.split(","):
            m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?(?:/\s*(\d+)\s*)?", item)
            if not m:
                return 1
            lo, hi, step = int(m.group(1)), int(m.group(2) or m.group(1)), int(m.group(3) or 1)
            size += max(0, hi - lo) // max(step, 1) + 1
        total *= max(size, 1)
    return total


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
