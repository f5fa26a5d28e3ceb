"""A command line Invoke's parser cannot read exits 2 (usage) with one line, not 1.

Why: Invoke ends every ParseError (`invoke teardwon`, `invoke teardown --hots`, `--host`
without its value) with exit 1, the code that means "done but not free", and a line such as
"No idea what 'teardwon' is!". A script cannot tell that from a teardown that left a GPU
held. Here the parser's error becomes codes.EXIT_USAGE with one line that names the bad
word and, for a typo, the nearest task or flag ("did you mean teardown?"); nothing has run.

How: scripts/cli/program.py's Program turns a ParseError into Exit(code=2) with this line. A
ParseError of the core flags, read before tasks.py loads (`invoke -c` without its value),
gets exit 2 from output_guard, which is installed at interpreter start.
"""
from __future__ import annotations

import re

from invoke import ParseError

_UNKNOWN = re.compile(r"^No idea what '(.*)' is!$", re.S)
_NO_VALUE = re.compile(r"^Flag <Argument: ([^ >]+)")


def nearest(word: str, choices) -> str | None:
    """The choice a typo most likely meant (difflib's closest, or None when none is close)."""
    import difflib  # only on an error: --list and --help stay fast

    close = difflib.get_close_matches(word, sorted(set(choices)), n=1, cutoff=0.6)
    return close[0] if close else None


def _flag(name: str) -> str:
    return ("-" if len(name) == 1 else "--") + name


def usage_line(error: ParseError, task_names, program_name: str = "invoke") -> str:
    """The one line for Invoke's parse error: what was not understood, the nearest task or flag,
    and that nothing ran. `task_names`: every task name and alias Invoke knows."""
    message = str(error)
    context = getattr(error, "context", None)
    task = getattr(context, "name", None)  # None: the core flags, before any task was named
    unknown = _UNKNOWN.match(message)
    if unknown:
        word = unknown.group(1)
        if word.startswith("-"):
            guess = nearest(word, getattr(context, "flags", {}) or {})
            see = f"{program_name} {task} --help" if task else f"{program_name} --help"
            what = f"`{program_name} {task}` has no flag {word!r}" if task else f"no flag {word!r}"
        else:
            guess = nearest(word, task_names)
            see = f"{program_name} --list"
            what = (f"`{program_name} {task}` takes no word {word!r}, and no task is named so" if task
                    else f"no task named {word!r}")
        hint = f" (did you mean {guess}?)" if guess else ""
        return f"gpu-pivot: {what}{hint}; nothing ran; `{see}` lists them"
    no_value = _NO_VALUE.match(message)
    if no_value:
        return f"gpu-pivot: {_flag(no_value.group(1))} needs a value; nothing ran"
    return f"gpu-pivot: {message.rstrip('!')}; nothing ran"
