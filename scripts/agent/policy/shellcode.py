"""What form a shell takes: an interactive terminal, -c code, a script, or a script on stdin.

Why only the form: whether a process can start a server again is decided from how it relates
to the server and what the kernel shows (relation.py), never from the text of its code. The
form is argv and fd facts: `bash --rcfile venv.rc -i` is someone's terminal, `bash -c CODE`
and `bash loop.sh` run code, `bash < loop.sh` or `curl ... | bash` read a script from stdin.
"""
import os
import re

from .builtin import SHELLS as SHELL_NAMES

SHELLS = re.compile(r"^-?(%s)$" % "|".join(SHELL_NAMES))
_SHELL_OPT_WITH_VALUE = ("--rcfile", "--init-file", "-O", "+O", "-o", "+o")


def shell_args(words):
    """(interactive, -c given, index of the first operand or None) of a shell's arguments: the
    operand is `-c`'s code or a script's path. `--rcfile FILE` and the other options that take a
    value are skipped with it (`bash --rcfile venv.rc -i` is a terminal)."""
    code = False
    i = 0
    while i < len(words):
        arg = words[i]
        if arg in _SHELL_OPT_WITH_VALUE:
            i += 2
            continue
        if arg == "--":
            return False, code, i + 1 if i + 1 < len(words) else None
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


def _stdin_unknown(info):
    """Is a shell with no operand reading a script from its stdin: a file or a pipe, not a
    terminal (nor /dev/null)?"""
    try:
        link = os.readlink("/proc/%d/fd/0" % info["pid"])
    except OSError:
        return False
    return not (link.startswith("/dev/pts/") or link.startswith("/dev/tty") or link == "/dev/null")
