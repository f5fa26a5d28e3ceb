"""What one run selects: which processes are targets and which are protected, where its GPUs
are read and when one counts as free.

Why a record of its own: the scan, the plan, the early batch, the settle window and the MPS
quit read these fields whichever subcommand runs them. The options record (options/record.py) stays
with the entry points, which make this once (Options.selection) and hand it down; frozen, so
nothing below can park state on it, and typed, so mypy checks each field read.
"""
from __future__ import annotations

from ..procs.devices import GpuSource
from ..wire import defaults

SWITCHES = ("only_matching", "stop_starters", "all_users", "disable")
FLAGS = ("protect", "target", "match", "scope", "scope_uid", "max_used_mib") + SWITCHES  # the options' names
FIELDS = FLAGS + ("gpus",)


class Selection:
    __slots__ = FIELDS

    protect: list[str] | None  # command lines never signalled, beyond the built-in list
    target: list[str] | None  # target patterns replacing the defaults
    match: list[str] | None  # target patterns added to them
    scope: str | None  # narrows the targets to command lines holding this text
    scope_uid: int | None  # ... and to this owner
    only_matching: bool
    stop_starters: bool
    all_users: bool
    disable: bool
    max_used_mib: int  # a GPU is free at or under this many MiB used
    gpus: GpuSource

    def __init__(self, gpus=None, **flags):
        """`flags` by the options' names (FLAGS); one not given is None, False for a switch."""
        unknown = sorted(set(flags) - set(FLAGS))
        if unknown:
            raise TypeError("Selection has no field %s" % ", ".join(unknown))
        for name in FLAGS:
            object.__setattr__(self, name, flags.get(name, False if name in SWITCHES else None))
        if self.max_used_mib is None:
            object.__setattr__(self, "max_used_mib", defaults.MAX_USED_MIB)
        object.__setattr__(self, "gpus", gpus if gpus is not None else GpuSource())

    def __setattr__(self, name, value):
        raise AttributeError("Selection is frozen: %s" % name)

    def __repr__(self):
        return "Selection(%s)" % ", ".join("%s=%r" % (n, getattr(self, n)) for n in FIELDS)
