"""The task decorator of every gpu-pivot task: one meaning per short flag, and `-h` is help.

Why not Invoke's own short flags: Invoke gives each flag the first free letter of its name,
task by task, so `-a` was --action in one task, --drain in another and --max-used-mib in a
third, `-m` was --match or --max-used-mib, `-t` --timeout or --to, and `-h` was --host (so
`invoke teardown -h` did not show help). Here a flag gets a short form only from SHORT,
the same in every task; a flag not in it (a new one, a dangerous one such as --disable
or --force) has its long form only. With no task taking `-h`, Invoke reads `-h` as its own
--help for the task, as Fabric does (which gives --host `-H` for the same reason).

A task module uses `from .flags import task` instead of `from invoke import task`;
tests/cli/test_tasks_cli.py checks every task of tasks.py was made this way.
"""
from __future__ import annotations

import invoke

# flag (the Python parameter name) -> its one short form, in every task that has the flag
SHORT = {
    "host": "H",
    "json": "j",
    "yes": "y",
    "match": "m",
    "only_matching": "o",
    "dry_run": "n",      # as make -n and rsync -n
    "grace": "g",
    "settle": "s",
    "timeout": "T",      # Invoke's own -T is its command timeout too
    "wait": "w",
    "phase": "p",
    "lines": "l",
    "follow": "f",       # as tail -f
    "action": "a",
}


# The codes every task can give: done, bad input (a flag's value, words after `--`), stdout that
# could not be written (common.guarded), Ctrl-C.
EVERY_TASK = ("ok", "usage", "output-failed", "interrupted")


class Task(invoke.Task):
    """An Invoke task whose short flags come from SHORT only (see the module docstring), and
    that refuses words after `--` unless it takes a command there (`remainder=True`: run,
    oneliner, lint-launch). Why: Invoke hands those words to every task, and `invoke status
    -- foo` silently ignored foo; a word the user typed is either used or refused (exit 2)."""

    def __init__(self, *args, remainder: bool = False, exit_codes: tuple = (), **kwargs):
        super().__init__(*args, **kwargs)
        self.remainder = remainder
        # the names (codes.EXIT_CODES) of every code this task can give, EVERY_TASK's with its
        # own: its --help lists them with their meanings from that table (scripts/cli/program.py),
        # or with this task's own where a code means something narrower here: (name, meaning)
        # (`status` exits 1 only when no GPU is visible, never because one is held)
        named = [c if isinstance(c, str) else c[0] for c in exit_codes]
        self.exit_meanings = {c[0]: c[1] for c in exit_codes if not isinstance(c, str)}
        self.exit_codes = tuple(dict.fromkeys(EVERY_TASK + tuple(named)))

    def __call__(self, *args, **kwargs):
        if not self.remainder:
            from scripts.config import cliargs

            extra = cliargs.remainder()
            if extra:
                import shlex

                line = f"gpu-pivot: {self.name}: takes no words after `--` (got: {shlex.join(extra)})"
                if kwargs.get("json") is True:
                    from .common import json_error
                    from .output_guard import guard_stdout

                    guard_stdout()
                    json_error(line, 2)  # --json asked: the refusal is a JSON document too
                raise invoke.Exit(line, code=2)
        return super().__call__(*args, **kwargs)

    def arg_opts(self, name, default, taken_names):
        opts = super().arg_opts(name, default, taken_names)
        long_names = [n for n in opts["names"] if len(n) > 1]
        short = SHORT.get(name)
        opts["names"] = long_names + ([short] if short and short not in taken_names else [])
        return opts


def task(*args, **kwargs):
    """invoke.task with this module's Task (explicit short flags)."""
    kwargs.setdefault("klass", Task)
    return invoke.task(*args, **kwargs)
