"""Check a target or protect pattern before it is used: it must name some programs, not all.

Why: `TARGETS=` or `--match ''` was accepted and matched every process, like `pkill -f ''`;
an empty `PROTECT=` protected everything, so nothing was stopped and the GPUs still read
as busy. A pattern (one Python regex per key or flag; alternation `a|b` lists several)
identifies PROGRAMS: an executable, the module or script an interpreter runs, or a process
title such as `sglang::scheduler_TP0`. One that matches the empty string ('', '.*', 'x*',
'^', '|foo') or every ordinary program ('.', '\\w', '[^!]') can name nothing in particular,
so it is refused with one line naming the key or flag and the value.
"""
from __future__ import annotations

import re

from .envfile import check_value
from .errors import ConfigError, show

# Programs found on any machine and never a GPU job; a pattern matching all of them matches anything.
_ORDINARY = ("/sbin/init", "systemd", "sshd", "-bash", "sh", "sleep", "tail", "tmux: server",
             "cron", "/usr/lib/postfix/sbin/master", "kworker/0:1", "python3")


def _label(name: str, value: str) -> str:
    return f"{name} {show(value)}" if name.startswith("-") else f"{name}={show(value)}"


def check_pattern(name: str, value: str) -> str:
    """Return `value` if it is a usable pattern, else raise ConfigError naming `name` (a key or flag)."""
    check_value(name, value)
    try:
        rx = re.compile(value)
    except (re.error, OverflowError, RecursionError) as exc:  # 'a{99999999999}', 1200 nested groups
        raise ConfigError(f"{_label(name, value)}: not a valid regular expression ({exc})") from None
    effect = "would protect every process" if name.endswith("PROTECT") else "would target every process"
    if rx.search("") is not None:
        raise ConfigError(f"{_label(name, value)}: matches the empty string, so it {effect}; "
                          "name the programs (e.g. sglang\\.launch_server|vllm), or omit it")
    if all(rx.search(p) for p in _ORDINARY):
        raise ConfigError(f"{_label(name, value)}: matches every program (even sshd, sleep, init), so it {effect}; "
                          "name the programs (e.g. sglang\\.launch_server|vllm)")
    return value
