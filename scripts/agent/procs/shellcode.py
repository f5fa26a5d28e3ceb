"""Would this process start a target again by itself? Read from the code it runs.

Why: a loop that restarts the server after a pause longer than any settle window (`while
true; do python3 server.py; sleep 30; done`) is seen by no window: between its turns it holds
nothing and starts nothing. Its code says what it will do. A wrapper that only runs the server
once and then something else (`bash -c "SERVER; sleep 20"`, `for f in a b; do echo $f; done;
SERVER`, a `while true; do sleep 1000; done` that keeps a container up) does not restart it.

The rule (restarts()): a process restarts a target when
- it is a shell (by argv[0], a login shell's `-bash`, or its comm: `exec -a name bash`) and a
  loop of its code (while, until, for, select, arithmetic `for ((;;))` included) runs a
  command that is a target program (the caller's `names(argv)`), through launchers (sudo,
  setsid, nohup...) and nested `sh -c '...'`; or
- its code cannot be known: unreadable, cut (over SCRIPT_READ_MAX), read from a pipe, or
  opaque where a command could come from anywhere: eval, source / `.`, a function (it may
  call itself), `$0` (it may exec itself), a command from a variable (`$CMD`); or
- it is an interpreter running inline code or a script (python, perl, ruby, node) whose code
  loops and starts commands (subprocess, system, exec, spawn, Popen) or mentions a target; or
- it is a repeater (watch, xargs, parallel) whose arguments mention a target.
A comment or a quoted word (`echo "waiting for logs"`) is no loop: a loop has its `do ... done`.
Scripts are read as regular files only, on a thread given SCRIPT_READ_S (a script on a dead
mount must not hang the teardown), a pipe never (reading it would take its data).
"""
import os
import re
import shlex

from . import program

SCRIPT_READ_MAX = 1 << 20
SCRIPT_READ_S = 0.2

SHELLS = re.compile(r"^-?(bash|sh|dash|zsh|ksh|ash|busybox)$")
INTERPRETERS = re.compile(r"^(python[0-9.]*|perl[0-9.]*|ruby[0-9.]*|node|nodejs)$")
REPEATERS = ("watch", "xargs", "parallel")
LAUNCHERS = ("sudo", "su", "setpriv", "runuser", "doas", "setsid", "flock", "nohup", "env", "nice", "ionice",
             "taskset", "numactl", "chrt", "stdbuf", "timeout", "chpst", "setuidgid", "s6-setuidgid", "exec",
             "command", "time")
_SHELL_OPT_WITH_VALUE = ("--rcfile", "--init-file", "-O", "+O", "-o", "+o")
_KEYWORD = re.compile(r"(?<![\w.$/-])(while|until|for|select)(?=[\s(;]|$)")
_DO = re.compile(r"(?<![\w.$/-])(do|done)(?![\w.-])")
_OPAQUE = re.compile(r"(?<![\w.$/-])(eval|source)(?![\w.-])|(?:^|[;&|({\s])\.\s+\S|\$0|\$\{0\}"
                     r"|(?<![\w.-])[A-Za-z_][\w-]*\s*\(\)\s*\{|(?<![\w.-])function\s+\w")
_SPAWN = re.compile(r"subprocess|Popen|os\.system|os\.exec|os\.spawn|\bsystem\s*\(|\bexec\s*\(|spawn|`")
_INTERP_LOOP = re.compile(r"\b(while|for|loop|until)\b")
_SEPARATORS = {";", "&", "|", "&&", "||", "(", ")", ";;", "{", "}", "\n", "|&"}
_SKIP_WORDS = {"do", "then", "else", "elif", "if", "!", "{", "}", "done", "fi", "time"}


def shell_args(args):
    """(interactive, -c given, index of the first operand or None) of a shell's arguments: the
    operand is `-c`'s code or a script's path. `--rcfile FILE` and the other options that take a
    value are skipped with it (`bash --rcfile venv.rc -i` is a terminal)."""
    code = False
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in _SHELL_OPT_WITH_VALUE:
            i += 2
            continue
        if arg == "--":
            return False, code, i + 1 if i + 1 < len(args) else None
        if arg.startswith("--"):
            if arg == "--interactive":
                return True, code, None
        elif arg[:1] in "-+" and len(arg) > 1:
            if "i" in arg[1:]:
                return True, code, None
            code = code or "c" in arg[1:]
        else:
            return False, code, i
        i += 1
    return False, code, None


def is_shell(info):
    """A shell by its argv[0] (a login shell's `-bash` too) or, renamed (`exec -a name bash`),
    its comm."""
    argv = info.get("argv") or []
    base = os.path.basename(argv[0]) if argv and argv[0] else ""
    return bool(SHELLS.match(base) or SHELLS.match(info.get("comm") or ""))


def shell_form(info):
    """(how, operand) of a shell: "terminal" (interactive, or commands typed on a terminal),
    "inline" (-c and its code), "script" (and its path) or "stdin" (a script read from a file
    or a pipe: `bash < loop.sh`, `curl ... | bash`); (None, None) for a process that is no shell."""
    if not is_shell(info):
        return None, None
    argv = [a for a in (info.get("argv") or []) if a is not None]
    interactive, inline, i = shell_args(argv[1:])
    if interactive:
        return "terminal", None
    if inline or i is not None:
        return ("inline" if inline else "script"), (argv[1 + i] if i is not None else "")
    return ("stdin" if _stdin_unknown(info) else "terminal"), None


def code_of(info):
    """(text, complete) of what a shell or interpreter runs: its inline code (-c / -e), or its
    script (through /proc/PID/cwd for a relative path); (None, False) when it cannot be read."""
    how, operand = shell_form(info)
    if how == "inline":
        return operand, True
    if how == "script":
        return _read_within([(info["pid"], operand)]).get(info["pid"], (None, False))
    if how is not None:
        return None, False
    argv = [a for a in (info.get("argv") or []) if a is not None]
    for i, arg in enumerate(argv[1:], 1):
        if arg in ("-c", "-e", "-E") and i + 1 < len(argv):
            return argv[i + 1], True
        if not arg.startswith("-"):
            return _read_within([(info["pid"], arg)]).get(info["pid"], (None, False))
    return None, False


def read_scripts(infos):
    """{pid: (text, complete)} of the shells among `infos` that run inline code or a script:
    inline code at once, scripts read within one SCRIPT_READ_S for all (_read_within)."""
    out: dict = {}
    scripts = []
    for info in infos:
        how, operand = shell_form(info)
        if how == "inline":
            out[info["pid"]] = (operand, True)
        elif how == "script":
            scripts.append((info["pid"], operand))
    out.update(_read_within(scripts))
    return out


def _read_within(scripts):
    """{pid: (text, complete)} of [(pid, path)]: read one after another on one thread, all of
    them given one SCRIPT_READ_S (a script on a dead mount stops that thread, never the
    teardown: what it had not read by then is left out)."""
    import threading  # here: only when a script's code is asked for
    import time

    read: dict = {}
    if not scripts:
        return read

    def read_all():
        for pid, path in scripts:
            read[pid] = _read_script(path, pid)

    worker = threading.Thread(target=read_all, daemon=True)
    deadline = time.monotonic() + SCRIPT_READ_S
    worker.start()
    worker.join(max(0.0, deadline - time.monotonic()))
    return dict(read)


def _read_script(path, pid):
    """(text, complete): a regular file's first SCRIPT_READ_MAX bytes (opened without blocking:
    a FIFO is never read), complete False when cut there; (None, False) when it cannot be read."""
    import stat

    if not path.startswith("/"):
        path = "/proc/%d/cwd/%s" % (pid, path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError:
        return None, False
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            data = os.read(fd, SCRIPT_READ_MAX + 1)
            return data[:SCRIPT_READ_MAX].decode("utf-8", "replace"), len(data) <= SCRIPT_READ_MAX
    except OSError:
        pass
    finally:
        os.close(fd)
    return None, False


def restarts(info, names):
    """Does this process's code start a target again (see the module's docstring)? `names`: a
    Names (does an argv run a target program; does a text mention one)."""
    argv = info.get("argv") or []
    base = os.path.basename(argv[0]) if argv and argv[0] else ""
    if base in REPEATERS:
        return names.mentions(" ".join(argv[1:]))
    how, _ = shell_form(info)
    if how == "terminal":
        return False  # what is typed there leaves no text to read (the window sees it)
    if how == "stdin":
        return True  # a script nobody can read here without taking it: unknown, so it may restart
    if how is not None:
        text, complete = code_of(info)
        return text is None or not complete or shell_restarts(text, names)
    if INTERPRETERS.match(base):
        text, complete = code_of(info)
        if text is None:
            return False  # `python3 server.py` args we cannot read are not a loop we know of
        return bool(_INTERP_LOOP.search(text)) and (bool(_SPAWN.search(text)) or names.mentions(text))
    return False


def _stdin_unknown(info):
    """Is a shell with no operand reading a script from its stdin: a file or a pipe, not a
    terminal (nor /dev/null)?"""
    try:
        link = os.readlink("/proc/%d/fd/0" % info["pid"])
    except OSError:
        return False
    return not (link.startswith("/dev/pts/") or link.startswith("/dev/tty") or link == "/dev/null")


def shell_restarts(text, names, depth=0):
    """Does shell code restart a target: opaque, or a loop whose body runs one (module doc)?"""
    code = _strip_comments(text)
    if _OPAQUE.search(code):
        return True
    for body in _loop_bodies(code):
        for argv in _commands(body):
            if _runs_target(argv, names, depth):
                return True
    return False


def _strip_comments(text):
    """Shell comments out (a `#` that begins a word, outside quotes): a word in a comment is no code."""
    out = []
    for line in text.split("\n"):
        quote = None
        for i, ch in enumerate(line):
            if quote:
                quote = None if ch == quote else quote
            elif ch in "'\"":
                quote = ch
            elif ch == "#" and (i == 0 or line[i - 1] in " \t;&|("):
                line = line[:i]
                break
        out.append(line)
    return "\n".join(out)


def _loop_bodies(code):
    """The text between `do` and its `done` of every loop (while, until, for, select)."""
    bodies = []
    for kw in _KEYWORD.finditer(code):
        marks = [m for m in _DO.finditer(code, kw.end())]
        depth, start = 0, None
        for m in marks:
            if m.group(1) == "do":
                depth += 1
                if start is None:
                    start = m.end()
            elif start is not None:
                depth -= 1
                if depth == 0:
                    bodies.append(code[start:m.start()])
                    break
        else:
            if start is not None:  # no `done` (cut code): the rest is the body
                bodies.append(code[start:])
    return bodies


def _commands(body):
    """The simple commands of a piece of shell code, as argv lists (assignments, launchers and
    keywords dropped); a word that is a variable in command position is kept ($CMD: unknown)."""
    body = body.replace("\n", " ; ")
    try:
        lexer = shlex.shlex(body, posix=True, punctuation_chars=";&|()")
        lexer.whitespace_split = True
        lexer.whitespace = " \t\r"
        words = list(lexer)
    except ValueError:  # unbalanced quotes: take the words as they come
        words = body.replace(";", " ; ").replace("&", " & ").replace("|", " | ").split()
    out: list = []
    current: list = []
    for word in words + [";"]:
        if word in _SEPARATORS:
            if current:
                out.append(current)
            current = []
            continue
        current.append(word)
    return [argv for argv in map(_strip_launchers, out) if argv]


def _strip_launchers(argv):
    """argv without leading assignments (X=1), keywords, launchers and their options."""
    i = 0
    while i < len(argv):
        word = argv[i]
        if word in _SKIP_WORDS or re.match(r"^[A-Za-z_]\w*=", word):
            i += 1
        elif os.path.basename(word) in LAUNCHERS:
            i += 1
            while i < len(argv) and argv[i].startswith("-"):
                i += 1
        else:
            break
    return argv[i:]


def _runs_target(argv, names, depth):
    """Does this simple command run a target: itself, a command from a variable (unknown), or
    a nested `sh -c CODE` whose code does?"""
    if argv[0].startswith("$") or argv[0].startswith("`"):
        return True
    if names(argv):
        return True
    if SHELLS.match(os.path.basename(argv[0])) and depth < 3:
        _, inline, i = shell_args(argv[1:])
        if inline and i is not None:
            inner = argv[1 + i]
            return any(_runs_target(a, names, depth + 1) for a in _commands(inner)) or \
                shell_restarts(inner, names, depth + 1)
    return False


class Names:
    """names(argv) and names.mentions(text) for restarts(): does an argv run a program a
    target pattern names (program.match) or that a target ran (its program.identity)?"""

    def __init__(self, patterns, identities=()):
        self.patterns, self.identities = list(patterns), set(identities)
        self._rx = [re.compile(p) for p in self.patterns]

    def __call__(self, argv):
        proc = {"pid": 0, "argv": list(argv), "comm": os.path.basename(argv[0])[:15]}
        return bool(program.match(proc, self.patterns) or program.identity(proc) & self.identities)

    def mentions(self, text):
        return any(rx.search(text) for rx in self._rx) or any(name in text for name in self.identities if
                                                               len(name) > 3)
