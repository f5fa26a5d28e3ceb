"""Agent flags shared by several subcommands: the selection (what to protect, what to
target; cli.py adds it to call.SELECTING), the free threshold and the phase spec.

Patterns are checked here too, not only on the local side: the agent is also run by
itself (an epilog, a test, a pasted command), and a pattern that matches the empty string
(`''`, `.*`, `x*`) would name every process.
"""
import re

from .procs import program
from .wire import call, defaults


class UsageError(ValueError):
    """Bad input to the agent: one line, exit 2, nothing done."""


def check_patterns(args):
    """Raise UsageError for a selection pattern that is not a regex or matches everything."""
    for flag in ("target", "match", "protect"):
        for pattern in getattr(args, flag, None) or []:
            try:
                empty = program.matches_empty(pattern)
            except (re.error, OverflowError, RecursionError) as exc:
                raise UsageError("--%s %r: not a valid regular expression (%s)" % (flag, pattern, exc)) from None
            if empty:
                raise UsageError("--%s %r: matches the empty string, so it would match every process; "
                                 "name a program (e.g. 'sglang\\.launch_server')" % (flag, pattern))


def add_selection(parser):
    parser.add_argument("--protect", action="append", default=[], metavar="REGEX",
                        help="command lines never signalled, beyond the built-in list (repeatable)")
    parser.add_argument("--target", action="append", default=[], metavar="REGEX",
                        help="target patterns replacing the defaults (the host's TARGETS; repeatable); a pattern "
                             "names a program: it must match its module, script, executable or process title "
                             "whole, never an argument of another program")
    parser.add_argument("--match", action="append", default=[], metavar="REGEX",
                        help="target patterns added to the defaults (repeatable; same rule as --target)")
    parser.add_argument("--fake-gpus", default=None, metavar="DIR",
                        help="SANDBOX only: read fake GPU memory from DIR instead of NVML")
    parser.add_argument("--scope", default=None, metavar="TEXT",
                        help="target only processes whose command line also contains TEXT (narrows, never widens)")
    parser.add_argument("--scope-uid", type=int, default=None, metavar="UID",
                        help="target only processes owned by UID (narrows, never widens)")


def add_spec(parser):
    parser.add_argument(call.SPEC_FLAG, required=True,
                        help="the phase, as base64 of its JSON (frame.encode_spec)")


def add_threshold(parser):
    parser.add_argument("--max-used-mib", type=int, default=defaults.MAX_USED_MIB,
                        help="a GPU counts as free at or under this many MiB used (NVML v2, excluding reserved)")
