"""The flags several subcommands share (add_shared: every one's, the selection of what to
protect and target, the free threshold, the phase spec), added by the command line as the
wire's SUBCOMMANDS table gives them: the local side builds the argv from the same table, and
each subcommand's module adds only its own flags after these."""
from __future__ import annotations

from ..wire import defaults
from ..wire.call import SELECTING, SPEC_FLAG, SUBCOMMANDS


def add_shared(parser, subcommand):
    """The flags several subcommands take: every one's, then the selection, the free threshold
    and the phase spec where the wire's SUBCOMMANDS table gives them to `subcommand` (the local
    side builds the argv from the same table). The subcommand's module adds its own after these."""
    parser.add_argument("--marker", help="frame the JSON result with marker lines carrying this nonce")
    parser.add_argument("--json", action="store_true", help="print the JSON result")
    parser.add_argument("--progress", action="store_true", help="print progress lines while working")
    parser.add_argument("--devices", default=defaults.DEVICE_GLOB, help="glob of GPU device files")
    parser.add_argument("--fake-devices", action="store_true",
                        help="the device glob may name plain files (sandbox, tests); otherwise every match must be "
                             "an NVIDIA character device")
    parser.add_argument("--run-dir", default=None, help="where state, logs and the audit log are kept on the host")
    if subcommand in SELECTING:
        add_selection(parser)
    if "--max-used-mib" in SUBCOMMANDS[subcommand]:
        add_threshold(parser)
    if SPEC_FLAG in SUBCOMMANDS[subcommand]:
        add_spec(parser)


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
    parser.add_argument(SPEC_FLAG, required=True,
                        help="the phase, as base64 of its JSON (frame.encode_spec)")


def add_threshold(parser):
    parser.add_argument("--max-used-mib", type=int, default=defaults.MAX_USED_MIB,
                        help="a GPU counts as free at or under this many MiB used (NVML v2, excluding reserved)")
