"""What program a process IS, as opposed to what text its command line contains.

Why: matching a pattern anywhere in a command line is `pkill -f` again. It made targets of
`tail -f sglang.launch_server.log`, `grep "vllm serve"`, a script run with
`--grep sglang::scheduler`, and a tmux server whose session is named `torchrun` (with every
pane's job under it). A process is identified instead by the names of the program it runs:

- its executable: argv[0]'s basename and path, and its comm (for a `#!` script the kernel
  sets comm to the script's file name, e.g. `torchrun`);
- for an interpreter (python, perl, node, bash, ...): the module it runs (`-m
  sglang.launch_server`, also each dotted parent: `sglang`) or the script (`/x/launch_server.py`,
  `launch_server.py`, `launch_server`) - and then NOT the interpreter's own name, so a
  pattern `python3` cannot name every Python program on the host;
- the title a server gives its processes (setproctitle): `sglang::scheduler_TP0`,
  `VLLM::EngineCore` (argv[0] taken whole);
- `program subcommand` (`vllm serve`, `sglang serve`) when the first argument is a plain
  word: used only by patterns that contain a space.

A pattern (a regex) must match one of these names completely (re.fullmatch), never a
piece of an argument. Patterns that match the empty string are refused by the callers.
"""
import os
import re

from . import contract

INTERPRETERS = contract.INTERPRETERS
_SUBCOMMAND = re.compile(r"^[a-z][a-z0-9_-]*$")
_interpreted = contract.interpreted  # in the contract: the local side names programs in its tables the same way


def _first_word(rest):
    return rest[0] if rest and _SUBCOMMAND.match(rest[0]) else None


def names(proc):
    """[(name, why)] for every name the process's program goes by; `why` is for people."""
    argv = [a for a in (proc.get("argv") or []) if a is not None]
    comm = proc.get("comm") or ""
    out = []

    def add(name, why):
        if name and (name, why) not in out:
            out.append((name, why))

    if not argv:
        add(comm, "is process %s" % comm)
        return out
    argv0 = argv[0].strip() or comm.strip()  # `exec -a '' sleep 100`: the kernel's comm names it
    if not argv0:
        return out
    base = os.path.basename(argv0.split()[0])
    if INTERPRETERS.match(base):
        kind, value, rest = _interpreted(argv)
        if kind == "module":
            parts = value.split(".")
            for n in range(len(parts), 0, -1):
                add(".".join(parts[:n]), "runs module %s" % value)
            sub = _first_word(rest)
            if sub:
                add("%s %s" % (value, sub), "runs module %s %s" % (value, sub))
            return out
        if kind == "script":
            script = os.path.basename(value)
            add(script, "runs script %s" % value)
            add(value, "runs script %s" % value)
            add(os.path.splitext(script)[0], "runs script %s" % value)
            sub = _first_word(rest)
            if sub:
                add("%s %s" % (script, sub), "runs %s %s" % (script, sub))
            return out
        add(base, "is the interpreter %s" % base)
        return out
    if argv0 != argv0.split()[0] or "::" in argv0:  # a title set with setproctitle
        add(argv0, "is titled %r" % argv0)
        add(argv0.split()[0], "is titled %r" % argv0)
    add(base, "is program %s" % base)
    add(argv0, "is program %s" % argv0)
    if comm and not INTERPRETERS.match(comm):
        add(comm, "is process %s" % comm)
    sub = _first_word(argv[1:])
    if sub:
        add("%s %s" % (base, sub), "runs '%s %s'" % (base, sub))
    return out


def match(proc, patterns):
    """(pattern, why) for the first pattern naming this process's program, or None.

    A pattern with a space is matched only against `program subcommand` names; one
    without a space only against single names. Both must match the whole name."""
    known = names(proc)
    for pattern in patterns:
        spaced = " " in pattern
        rx = re.compile(pattern)
        for name, why in known:
            if (" " in name) == spaced and rx.fullmatch(name):
                return pattern, why
    return None


def matches_empty(pattern):
    """True when the regex matches the empty string (and so would match everything)."""
    return re.compile(pattern).search("") is not None
