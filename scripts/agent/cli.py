"""Agent command line: parse, run one subcommand, print one JSON document.

Each subcommand module exposes `add_arguments(parser)` and `run(opts) -> (exit_code, doc)`,
`opts` the run's Options (options/record.py), made once from argparse's answer (parse).
Which subcommands exist, and which take the host's selection flags, is the wire's
(wire/call.py SUBCOMMANDS, SELECTING): the local side builds the argv from the same table.
With `--marker NONCE` the document is framed by marker lines (frame.frame); with `--json`
it is printed bare; otherwise a short human summary is printed. Progress lines
(`--progress`, Options.emit_progress) go to stdout before the result.
"""
import argparse
import importlib
import json
import os
import sys

from .options import flags
from .options.record import Options, check_patterns, check_values
from .policy import rules
from .procs import devices, textsafe
from .state import frozen, lastrun
from .wire import call, codes, frame

# name -> (module, class) from call.SUBCOMMAND_MODULES, or a module or class with
# add_arguments(parser) and run(opts) put here directly. A subcommand's module is imported
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
        flags.add_shared(p, name)
        module.add_arguments(p)
    return parser


def emit(opts: Options, doc):
    text = textsafe.dumps(doc, sort_keys=True)  # valid Unicode: a non-UTF-8 byte is U+EF80+
    if opts.marker:
        out = frame.frame(opts.marker, text)
    elif opts.json:
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
    `IndexError: list index out of range (agent/policy/program.py:72 in names)`: the last frame
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
    a file outside the agent: two modules share a name (teardown/run.py, phases/run.py). The
    agent's package is the folder "agent" in the folder this module's own code sits in
    (scripts/ here; <gpu-pivot>/, the name a bundle compiles each module under): another
    folder so named (a test's) is not it. Its own code's name, as a bundle sets no __file__."""
    roots = {_agent_file.__code__.co_filename.replace(os.sep, "/").split("/")[-3:][0], "<gpu-pivot>"}
    parts = filename.replace(os.sep, "/").split("/")
    at = [i for i in range(1, len(parts) - 1) if parts[i] == "agent" and parts[i - 1] in roots]
    return "/".join(parts[at[-1]:]) if at else None


def parse(argv=None) -> Options:
    """The options of one run (options/record.py Options), from the command line: the one place
    they are made (tests make theirs here too, or as Options(**fields))."""
    words = sys.argv[1:] if argv is None else argv
    return Options.of(build_parser(words[0] if words and words[0] in MODULES else None).parse_args(argv))


def main(argv=None):
    opts = parse(argv)
    if opts.run_dir:
        os.environ[lastrun.RUN_DIR_ENV] = opts.run_dir
    rules.trust_own_names(opts.fake_devices)  # the sandbox's stand-ins (rules.py)
    thawed = frozen.recover()  # what a teardown that died left frozen runs again first (state/frozen.py)
    try:
        check_values(opts)
        check_patterns(opts)
        code, doc = module_for(opts.command).run(opts)
    except (codes.UsageError, devices.DeviceError) as exc:
        code, doc = codes.EXIT_USAGE, {codes.USAGE_ERROR: str(exc)}
    except Exception as exc:  # anything left (a bug, data no parser here understood): a result naming it
        code, doc = codes.EXIT_UNREACHABLE, {codes.AGENT_ERROR: failure(exc)}
    if thawed:
        doc["thawed"] = thawed
    doc.setdefault("command", opts.command)
    doc.setdefault("exit_code", code)
    emit(opts, doc)
    return code
