"""Agent command line: parse, run one subcommand, print one JSON document.

Each subcommand module exposes `add_arguments(parser)` and `run(args) -> (exit_code, doc)`.
Which subcommands exist, and which take the host's selection flags, is the contract's
(call.SUBCOMMANDS, call.SELECTING): the local side builds the argv from the same table.
With `--marker NONCE` the document is framed by marker lines (frame.frame); with `--json`
it is printed bare; otherwise a short human summary is printed. Progress lines
(`--progress`, frame.progress_line) go to stdout before the result.
"""
import argparse
import importlib
import json
import os
import sys

from . import options
from .procs import devices, rules
from .state import lastrun
from .wire import call, codes, defaults, frame, textsafe

# name -> (module, class) from call.SUBCOMMAND_MODULES, or a module or class with
# add_arguments(parser) and run(args) put here directly. A subcommand's module is imported
# only when it is the one asked for, by name (wire/call.py says why), so what a call
# imports is this module's own imports and that one module's: the bundle ships exactly that.
MODULES: dict = dict(call.SUBCOMMAND_MODULES)


def module_for(name):
    entry = MODULES[name]
    if hasattr(entry, "run"):
        return entry
    module, attr = entry
    loaded = importlib.import_module("." + module, __package__)
    return getattr(loaded, attr) if attr else loaded


def progress(args, **fields):
    """Emit one progress line when the caller asked for them; never fail on a closed pipe."""
    if not getattr(args, "progress", False):
        return
    try:
        sys.stdout.write(frame.progress_line(fields))
        sys.stdout.flush()
    except (BrokenPipeError, OSError):
        args.progress = False  # the connection dropped: keep working, stop talking


class HelpFormatter(argparse.HelpFormatter):
    """argparse's own, with the width found without shutil. argparse builds a formatter on
    every add_argument (to check the metavar), and the stock one imports shutil (with bz2 and
    lzma) to ask for the terminal's width: ~3 ms of every teardown's start, for a width that
    only --help uses. The same answer as shutil.get_terminal_size: COLUMNS, else the
    terminal on stdout, else 80; minus 2, as argparse does."""

    def __init__(self, prog, **kwargs):
        if kwargs.get("width") is None:
            kwargs["width"] = terminal_columns() - 2
        super().__init__(prog, **kwargs)


def terminal_columns():
    try:
        columns = int(os.environ.get("COLUMNS", ""))
        if columns > 0:
            return columns
    except ValueError:
        pass
    try:
        return os.get_terminal_size(sys.__stdout__.fileno()).columns or 80  # type: ignore[union-attr]
    except (AttributeError, ValueError, OSError):  # no stdout, or not a terminal
        return 80


def build_parser(only=None):
    """The parser; with `only` (the subcommand asked for) just that subcommand's, so no
    other subcommand's module is imported."""
    parser = argparse.ArgumentParser(prog="gpuagent", description="gpu-pivot agent (runs on the GPU host)",
                                     formatter_class=HelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="SUBCOMMAND")
    sub.required = True
    for name in call.SUBCOMMANDS:
        if only is not None and name != only:
            continue
        module = module_for(name)
        p = sub.add_parser(name, help=(module.__doc__ or "").strip().splitlines()[0], formatter_class=HelpFormatter)
        p.add_argument("--marker", help="frame the JSON result with marker lines carrying this nonce")
        p.add_argument("--json", action="store_true", help="print the JSON result")
        p.add_argument("--progress", action="store_true", help="print progress lines while working")
        p.add_argument("--devices", default=defaults.DEVICE_GLOB, help="glob of GPU device files")
        p.add_argument("--fake-devices", action="store_true",
                       help="the device glob may name plain files (sandbox, tests); otherwise every match must be "
                            "an NVIDIA character device")
        p.add_argument("--run-dir", default=None, help="where state, logs and the audit log are kept on the host")
        if name in call.SELECTING:
            options.add_selection(p)
        module.add_arguments(p)
    return parser


def emit(args, doc):
    text = textsafe.dumps(doc, sort_keys=True)  # valid Unicode: a non-UTF-8 byte is U+EF80+
    if args.marker:
        out = frame.frame(args.marker, text)
    elif args.json:
        out = text + "\n"
    else:
        out = human(doc)
    try:
        sys.stdout.write(out)
        sys.stdout.flush()
    except (BrokenPipeError, OSError):
        pass  # the result is also kept on the host where it matters (teardown)


def human(doc):
    lines = []
    for key in sorted(doc):
        value = doc[key]
        if isinstance(value, (dict, list)):
            value = json.dumps(value, sort_keys=True, default=str)
        lines.append("%s: %s" % (key, textsafe.printable(value)))
    return "\n".join(lines) + "\n"


def failure(exc):
    """One line naming an exception and where it was raised, for the operator to report:
    `IndexError: list index out of range (agent/procs/program.py:72 in names)`: the last frame
    outside the standard library (json's decoder is where a bad document was noticed, the
    agent's frame above it who passed it), an agent module with its folder (two are run.py). The traceback goes to
    stderr too. Why: a bare traceback reaches the operator as "the agent gave no result",
    and a crash in one subcommand must still be a result the local side reads."""
    import traceback  # only on this path: a teardown's start does not pay for it

    try:
        traceback.print_exc()
    except Exception:  # stderr gone too: the result below still names it
        pass
    frames = traceback.extract_tb(exc.__traceback__)
    stdlib = os.path.dirname(os.__file__) + os.sep  # its frames say where Python noticed, not who erred
    where = ([f for f in frames if not f.filename.startswith(stdlib)] or frames)[-1:]
    at = " (%s:%s in %s)" % (_agent_file(where[0].filename) or os.path.basename(where[0].filename),
                             where[0].lineno, where[0].name) if where else ""
    return "%s: %s%s" % (type(exc).__name__, exc, at)


def _agent_file(filename):
    """The path of an agent module from its package on ("agent/teardown/run.py"), or None for
    a file outside the agent: two modules share a name (teardown/run.py, phases/run.py)."""
    parts = filename.replace(os.sep, "/").split("/")
    return "/".join(parts[len(parts) - 1 - parts[::-1].index("agent"):]) if "agent" in parts[:-1] else None


def main(argv=None):
    words = sys.argv[1:] if argv is None else argv
    args = build_parser(words[0] if words and words[0] in MODULES else None).parse_args(argv)
    if args.run_dir:
        os.environ[lastrun.RUN_DIR_ENV] = args.run_dir
    args.emit_progress = lambda **f: progress(args, **f)
    rules.trust_own_names(getattr(args, "fake_devices", False))  # the sandbox's stand-ins (rules.py)
    try:
        options.check_patterns(args)
        code, doc = module_for(args.command).run(args)
    except (options.UsageError, devices.DeviceError) as exc:
        code, doc = codes.EXIT_USAGE, {codes.USAGE_ERROR: str(exc)}
    except Exception as exc:  # anything left (a bug, data no parser here understood): a result naming it
        code, doc = codes.EXIT_UNREACHABLE, {codes.AGENT_ERROR: failure(exc)}
    doc.setdefault("command", args.command)
    doc.setdefault("exit_code", code)
    emit(args, doc)
    return code
