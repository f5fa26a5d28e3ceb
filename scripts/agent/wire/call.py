"""The agent's argv: how it is started (stdin, BOOT), the flags every subcommand and each
one takes, which agent module runs each subcommand, and how to know an agent call in /proc.

Why here: the local side builds the argv, the agent parses it and knows another agent by it
(agent_call: never signalled), the bundle ships the modules named below: one definition."""
import os

from .defaults import DEVICE_GLOB
from .requests import REQUESTS, SPEC_FLAG  # noqa: F401 (SPEC_FLAG: the agent's options read it here)

STDIN = "-"  # the agent's source comes on stdin: `python3 - SUBCOMMAND ...`
# The transport's form: `python3 -S -c BOOT - SUBCOMMAND ...`, stdin = the bundle zlib-compressed
# (bundle.agent_stream). Why: reading a script from stdin costs ~0.25 ms per KB, raw bytes nothing;
# -S skips site (.pth files: 50-85 ms on a torch host; pynvml's import adds it later). BOOT first
# drops '' (the working directory) from sys.path: a zlib.py another user left there is never run.
BOOT = ("import sys;sys.path[:]=[p for p in sys.path if p];import zlib;"
        "_D=zlib.decompress(sys.stdin.buffer.read());exec(_D[:_D.index(bytes(1))])")
STREAM_FLAGS = ("-S", "-c", BOOT)

# Every subcommand takes these (the transport sends the first ones; --json is for people).
COMMON_FLAGS = ("--marker", "--json", "--progress", "--devices", "--fake-devices", "--run-dir")
# What the host's configuration selects (targets, protect list, scope); only SELECTING take them.
SELECTION_FLAGS = ("--protect", "--target", "--match", "--fake-gpus", "--scope", "--scope-uid")
# Each subcommand and its own flags (beyond COMMON_FLAGS, and SELECTION_FLAGS for SELECTING), read off
# its request; the parser is built in this order (tests/agent/wire/test_wire.py: exactly these).
SUBCOMMANDS = {r.name: r.flags for r in REQUESTS}
SELECTING = tuple(r.name for r in REQUESTS if r.selecting)


# Which agent module runs each subcommand: (module, the class in it or None), each with
# add_arguments(parser) and run(args). Names, not imports: cli.py imports only the one asked
# for, and the bundle (reach/bundle.py) ships only the modules that subcommand can import.
SUBCOMMAND_MODULES = {
    "ping": ("status.ping", None),
    "scan": ("status.scan", None),
    "verify": ("teardown.verify", None),
    "plan": ("teardown.plan", None),
    "teardown": ("teardown.run", None),
    "phase-start": ("phases.run", "Start"),
    "phase-ready": ("phases.run", "Ready"),
    "phase-stop": ("phases.run", "Stop"),
    "phase-logs": ("phases.run", "Logs"),
    "smoke": ("phases.run", "Smoke"),
    "drain": ("phases.drain", None),
    "gates": ("phases.gates", None),
    "lint": ("phases.lint", None),
    "deploy": ("phases.deploy", None),
    "reset": ("teardown.reset", None),
    "gpu-settings": ("gpu.settings_cmd", None),
    "release": ("teardown.hold", None),
}


def agent_argv(python, request, nonce, devices=DEVICE_GLOB, progress=False, run_dir=None,  # noqa: PLR0913
               fake_devices=False, targets=(), protect=(), fake_gpus=None, scope=None, scope_uid=None,
               stream=False):  # one keyword per hosts.env key and flag the agent takes
    """The agent's argv on the host: `PYTHON - SUBCOMMAND --devices GLOB --marker NONCE ...`,
    or with `stream` `PYTHON -S -c BOOT - SUBCOMMAND ...` (stdin: bundle.agent_stream()).

    The selection (targets, protect, fake_gpus, scope, scope_uid) goes only to the
    subcommands that take it; the `request` (requests.py) gives the subcommand and its own flags.
    """
    subcommand = request.name
    # Values go as --flag=VALUE: a value that starts with '-' (a scope such as '--token', a
    # pattern such as '-serve') would otherwise be read by argparse as another flag.
    argv = [python] + list(STREAM_FLAGS if stream else ()) + [STDIN, subcommand, "--devices=" + devices, "--marker",
                                                              nonce]
    if progress:
        argv.append("--progress")
    if run_dir:
        argv.append("--run-dir=" + run_dir)
    if fake_devices:
        argv.append("--fake-devices")
    if subcommand in SELECTING:
        argv += ["--target=" + p for p in targets]
        argv += ["--protect=" + p for p in protect]
        if fake_gpus:
            argv.append("--fake-gpus=" + fake_gpus)
        if scope is not None:  # "" too: the agent refuses a scope that narrows nothing, never drops it
            argv.append("--scope=" + scope)
        if scope_uid is not None:
            argv.append("--scope-uid=%d" % scope_uid)
    return argv + [str(a) for a in request.argv()]


def agent_call(argv):
    """The subcommand of an argv shaped as agent_argv() makes it, or None.

    What the agent uses to know another gpu-pivot agent when it sees one in /proc (to protect
    it, or to find another user's teardown): interpreter `pythonX.Y`, `-`, a known
    subcommand, and `--marker` followed by a hex nonce (either form of agent_argv()).
    """
    if list(argv[1:1 + len(STREAM_FLAGS)]) == list(STREAM_FLAGS):
        argv = argv[:1] + argv[1 + len(STREAM_FLAGS):]
    if len(argv) < 5 or argv[1] != STDIN or argv[2] not in SUBCOMMANDS:
        return None
    exe = os.path.basename(argv[0])
    if not (exe.startswith("python") and all(c.isdigit() or c == "." for c in exe[len("python"):])):
        return None
    for i, word in enumerate(argv[:-1]):
        if word == "--marker":
            nonce = argv[i + 1]
            return argv[2] if nonce and all(c in "0123456789abcdef" for c in nonce) else None
    return None
