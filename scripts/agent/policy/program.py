"""What program a process IS, as opposed to what text its command line contains.

Why: matching a pattern anywhere in a command line is `pkill -f` again. It made targets of
`tail -f sglang.launch_server.log`, `grep "vllm serve"`, a script run with
`--grep sglang::scheduler`, and a tmux server whose session is named `torchrun` (with every
pane's job under it). A process is identified instead by the names of the program it runs:

- its executable: argv[0]'s basename and path, and its comm (for a `#!` script the kernel
  sets comm to the script's file name, e.g. `torchrun`);
- for an interpreter (python, perl, node, bash, ...

The whole account: docs/design-notes.md (scripts/agent/policy/program.py)."""
import os
import re

# The agent names a process by its program (targets are programs, not text); the local side
# shows the same name in its tables (scripts/views/render.py): one parser for both.
INTERPRETERS = re.compile(r"^(python[0-9.]*m?|pypy[0-9.]*|perl[0-9.]*|ruby[0-9.]*|node|nodejs|bash|sh|dash|zsh|ksh)$")
# interpreter options that take the next argument as their value
_OPT_WITH_VALUE = {"-X", "-W", "-Q", "-I", "-e", "-E", "-r", "-o", "-O"}
_PY_OPT_WITH_VALUE = {"-X", "-W", "-Q"}
_CODE_FLAGS = {"-c", "-e", "-E", "--eval", "-p", "--print"}


def interpreted(argv):
    """(kind, value, rest) for what an interpreter argv runs: ('module', 'a.b', rest),
    ('script', '/x/y.py', rest), ('code', None, []) or (None, None, [])."""
    name = os.path.basename(argv[0])
    python = name.startswith("python") or name.startswith("pypy")
    with_value = _PY_OPT_WITH_VALUE if python else _OPT_WITH_VALUE
    i = 1
    while i < len(argv):
        arg = argv[i]
        if arg == "-m" and python and i + 1 < len(argv):
            return "module", argv[i + 1], argv[i + 2:]
        if python and arg.startswith("-m") and len(arg) > 2:
            return "module", arg[2:], argv[i + 1:]
        if arg in _CODE_FLAGS or (python and arg.startswith("-c")):
            return "code", None, []
        if arg == "--":
            i += 1
            break
        if arg.startswith("-") and arg != "-":
            i += 2 if arg in with_value else 1
            continue
        break
    if i < len(argv) and argv[i] != "-":
        return "script", argv[i], argv[i + 1:]
    return None, None, []


def program_of(argv):
    """([words naming the program], [its arguments]), without the interpreter: `python3 -m
    sglang.launch_server X` is `sglang.launch_server`, `python3 /x/train.py` is `train.py`,
    `/usr/bin/nvidia-persistenced` is `nvidia-persistenced`; a title the program set
    (`sglang::scheduler_TP0`) stays whole. How a process is named to people, on both sides."""
    first = argv[0]
    if "::" in first or " " in first.strip():
        return [first.strip()], list(argv[1:])
    base = os.path.basename(first) or first
    if not INTERPRETERS.match(base):
        return [base], list(argv[1:])
    kind, value, rest = interpreted(argv)
    if kind == "module":
        return [value], list(rest)
    if kind == "script":
        return [os.path.basename(value) or value], list(rest)
    return [base], list(argv[1:])  # inline code (-c) or a bare interpreter: its arguments say what it is


_SUBCOMMAND = re.compile(r"^[a-z][a-z0-9_-]*$")


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
        kind, value, rest = interpreted(argv)
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


def alternatives(pattern):
    """The top-level alternatives of a regex: `x\\.launch_server|x serve` is two patterns,
    each judged on its own terms (a single name, or `program subcommand`). A `|` inside a
    group, a character class or after a backslash does not split."""
    out, depth, in_class, escaped, start, last = [], 0, False, False, 0, 0
    for i, ch in enumerate(pattern):
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif in_class:
            in_class = ch != "]" or i == start
        elif ch == "[":  # a `]` first in the class (after an optional `^`) is a literal
            in_class, start = True, i + (2 if pattern[i + 1:i + 2] == "^" else 1)
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth = max(0, depth - 1)
        elif ch == "|" and depth == 0:
            out.append(pattern[last:i])
            last = i + 1
    return out + [pattern[last:]]


def match(proc, patterns):
    """(pattern, why) for the first pattern naming this process's program, or None.

    Each top-level alternative of a pattern (alternatives()) is matched on its own: one
    with a space only against `program subcommand` names, one without a space only against
    single names. Either must match the whole name."""
    prefilter, compiled = _matcher(tuple(patterns))
    if prefilter is not None and not prefilter.search(_text(proc)):
        return None  # no name of this process can match: see _matcher
    known = names(proc)
    for pattern, alts in compiled:
        for spaced, rx in alts:
            for name, why in known:
                if (" " in name) == spaced and rx.fullmatch(name):
                    return pattern, why
    return None


def _text(proc):
    """Every name names() gives is a piece of this text: argv joined by spaces, comm, and the
    `program subcommand` of a titled process (its title's first word, then argv[1])."""
    argv = [a for a in (proc.get("argv") or []) if a is not None]
    words = (argv[0].strip() or (proc.get("comm") or "")).split() if argv else []  # as names() reads a blank one
    first = os.path.basename(words[0]) if words else ""
    return "%s\0%s\0%s %s" % (" ".join(argv), proc.get("comm") or "", first, argv[1] if len(argv) > 1 else "")


_MATCHERS: dict = {}
# anchors, lookarounds, backreferences, conditional groups and inline flags (which Python
# before 3.11 applies to the whole joined prefilter, not to its own alternative)
_CONTEXT = re.compile(r"\\[AZbBG0-9]|[$^]|\(\?(?:[=!<(]|P=|[aiLmsux-]+[:)])")


def _matcher(patterns):
    """(prefilter, [(pattern, [(spaced, compiled alternative)])]), built once per pattern list.

    The prefilter: a scan matches every process of the host against the patterns (20,000 on a
    big host, before the first signal), and names() for each costs more than one search. A
    regex that fully matches a name also finds a match in any text the name is a piece of,
    unless it depends on what surrounds the match (an anchor, a lookaround, a backreference):
    with none of those, a process whose text has no match has no name that matches. Otherwise
    there is no prefilter."""
    found = _MATCHERS.get(patterns)
    if found is None:
        compiled = [(p, [(" " in alt, _compiled(alt)) for alt in alternatives(p)]) for p in patterns]
        alts = [alt for p in patterns for alt in alternatives(p)]
        safe = alts and not any(_CONTEXT.search(alt) for alt in alts)
        try:
            prefilter = re.compile("|".join("(?:%s)" % alt for alt in alts)) if safe else None
        except re.error:  # an inline flag, valid alone, is refused inside a group
            prefilter = None
        found = _MATCHERS[patterns] = (prefilter, compiled)
    return found


_COMPILED: dict = {}


def _compiled(pattern):
    """re.compile, memoised here: a scan matches every process against every alternative."""
    rx = _COMPILED.get(pattern)
    if rx is None:
        rx = _COMPILED[pattern] = re.compile(pattern)
    return rx


def identity(proc):
    """The names that say WHICH program a process runs: its module (whole, not its package),
    script, executable or title, never a bare interpreter's name (`python3 -c ...` shares
    `python3` with every Python on the host). What "runs the same program as a target" compares."""
    return {n for n, why in names(proc) if " " not in n and not why.startswith("is the interpreter")
            and not INTERPRETERS.match(n) and not _package_of(n, why)}


def _package_of(name, why):
    """Is this name only the package of the module a process runs (`sglang` for `-m
    sglang.launch_server`)? A package is not a program: `-m sglang.bench_serving` is a client."""
    return why.startswith("runs module ") and name != why[len("runs module "):].split(" ")[0]


def matches_empty(pattern):
    """True when the regex, or one of its alternatives, matches the empty string (and so
    would match everything). Raises re.error for an alternative that does not compile alone."""
    return any(re.compile(p).search("") is not None for p in [pattern] + alternatives(pattern))
