"""Agent flags shared by scan, verify, plan and teardown (what to protect, what to target)."""


def add_selection(parser):
    parser.add_argument("--protect", action="append", default=[], metavar="REGEX",
                        help="command lines never signalled, beyond the built-in list (repeatable)")
    parser.add_argument("--target", action="append", default=[], metavar="REGEX",
                        help="target patterns replacing the defaults (the host's TARGETS; repeatable)")
    parser.add_argument("--match", action="append", default=[], metavar="REGEX",
                        help="target patterns added to the defaults (repeatable)")
    parser.add_argument("--fake-gpus", default=None, metavar="DIR",
                        help="SANDBOX only: read fake GPU memory from DIR instead of NVML")


def add_threshold(parser):
    parser.add_argument("--max-used-mib", type=int, default=0,
                        help="a GPU counts as free at or under this many MiB used (NVML v2, excluding reserved)")
