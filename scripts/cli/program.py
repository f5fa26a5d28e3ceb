"""Invoke's Program, made to keep two promises of ours before any task runs.

1. A command line its parser cannot read is bad input: exit 2 with one line naming the word
   and the nearest task or flag (parse_errors.usage_line), not Invoke's exit 1, which is
   "done but not free".
2. `invoke TASK --help` ends with the exit codes that task can give, written from the one
   table of them (codes.EXIT_CODES) when the help is printed: a task names its codes
   (`@task(exit_codes=...)`, scripts/cli/flags.py) and never writes their meanings again.
   Why at print time: loading the tasks (`invoke --list`) imports nothing of the agent.
   The docstring is fitted to the screen too (80 columns: Invoke prints it as written).

The whole account: docs/design-notes.md (scripts/cli/program.py)."""
from __future__ import annotations

import inspect
import textwrap

import invoke


def exit_codes_help(names, width: int, meanings=None) -> str:
    """The lines `Exit codes:`, then one entry per code named (codes.EXIT_CODES' names, in the
    table's order) with its meaning, the task's own (`meanings`) where it has one, each wrapped
    to `width` without cutting a word."""
    from ..agent.wire.codes import EXIT_CODES

    known = {name for _, name, _ in EXIT_CODES} | {OWN}
    unknown = sorted(set(names) - known)
    if unknown:
        raise ValueError(f"no exit code named {', '.join(unknown)} in codes.EXIT_CODES")
    lines = ["Exit codes:"]
    for code, name, meaning in EXIT_CODES:
        if name in names:
            meaning = (meanings or {}).get(name, meaning)
            head = f"  {code:<4} "
            lines += textwrap.wrap(meaning, width, initial_indent=head, subsequent_indent=" " * len(head),
                                   break_long_words=False, break_on_hyphens=False)
    if OWN in names:  # a task that passes on another program's code (run): any number may come
        lines += textwrap.wrap((meanings or {}).get(OWN, "the command's own exit code"), width,
                               initial_indent="  any  ", subsequent_indent=" " * 7, break_long_words=False)
    return "\n".join(lines)


OWN = "own"  # exit_codes entry: the task exits with the code of the command it ran (run)


class Program(invoke.Program):
    """Invoke's Program: parse errors exit 2 (usage), a task's help lists its exit codes."""

    def _usage(self, error: invoke.ParseError) -> invoke.Exit:
        from ..agent.wire.codes import EXIT_USAGE
        from .parse_errors import usage_line

        names = list(getattr(getattr(self, "parser", None), "contexts", {}) or {})
        return invoke.Exit(usage_line(error, names), code=EXIT_USAGE)

    def parse_tasks(self) -> None:
        try:
            super().parse_tasks()
        except invoke.ParseError as error:
            raise self._usage(error) from None

    def parse_cleanup(self) -> None:
        try:
            super().parse_cleanup()
        except invoke.ParseError as error:
            raise self._usage(error) from None

    def print_task_help(self, name: str) -> None:
        """Invoke's task help, its docstring fitted to the screen (fit_paragraphs) and, for a
        task that names its exit codes, ending with them."""
        from ..views.render import width

        task = self.collection[name]
        room = width() - len(self.leading_indent)
        text = fit_paragraphs(inspect.getdoc(task) or "", room)
        names = getattr(task, "exit_codes", ())
        if names:
            text += "\n\n" + exit_codes_help(names, room, getattr(task, "exit_meanings", None))
        doc = task.__doc__
        task.__doc__ = text
        try:
            super().print_task_help(name)
        finally:
            task.__doc__ = doc


def fit_paragraphs(text: str, room: int) -> str:
    """`text` with each paragraph that has a line wider than `room` re-wrapped to it, never
    cutting a word; a paragraph that fits keeps its own line breaks."""
    out = []
    for paragraph in text.split("\n\n"):
        if any(len(line) > room for line in paragraph.splitlines()):
            paragraph = textwrap.fill(" ".join(line.strip() for line in paragraph.splitlines()), room,
                                      break_long_words=False,
                                      break_on_hyphens=False)
        out.append(paragraph)
    return "\n\n".join(out)


def install() -> None:
    """Give the Program that is running (Invoke's `invoke` and `python -m invoke`) this
    subclass; a Program of another class (someone else's) is left as it is."""
    from invoke import main

    if type(main.program) is invoke.Program:
        main.program.__class__ = Program

