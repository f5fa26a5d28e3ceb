"""One task per command line.

Why: Invoke runs the tasks of one command line one after another, and ours check their flags
when each starts. `invoke teardown --host gpu1 --yes verify --host gpu1 --wait abc` tore the
host down and only then said "--wait 'abc': not a number" with exit 2, the code that promises
"bad input, nothing ran". Refusing a second task before the first runs
keeps that promise without checking every task's flags ahead of time. Invoke takes this class
from `tasks.executor_class` in invoke.json beside tasks.py (its project configuration).
"""
from __future__ import annotations

import os

from invoke import Executor, Exit

# Invoke reads ONE project configuration file beside tasks.py, the first of these it finds;
# one named before invoke.json would replace it and silently turn the refusal off.
READ_BEFORE_OURS = ("invoke.yaml", "invoke.yml")


def check_project_config(project_dir: str) -> None:
    """Refuse to load the tasks (exit 2, one line) when a project file Invoke reads instead of
    invoke.json sits beside tasks.py: every command would lose one task per command line."""
    for name in READ_BEFORE_OURS:
        path = os.path.join(project_dir, name)
        if os.path.lexists(path):
            raise Exit(f"gpu-pivot: {path}: Invoke reads it instead of invoke.json, which keeps one task per "
                       "command line; move its settings into invoke.json and remove it", code=2)


class OneTaskExecutor(Executor):
    """Invoke's Executor, refusing a command line that names more than one task (exit 2)."""

    def execute(self, *tasks):
        if len(tasks) > 1:
            names = ", ".join(getattr(t, "name", None) or str(t) for t in tasks)
            first = getattr(tasks[0], "name", "TASK")
            line = (f"gpu-pivot: one task per command line, got {len(tasks)}: {names}; nothing ran "
                    f"(run them one after another: `invoke {first} ... && invoke ...`)")
            if any((getattr(t, "as_kwargs", None) or {}).get("json") is True for t in tasks):
                from .common import json_error
                from .output_guard import guard_stdout

                guard_stdout()
                json_error(line, 2)  # --json asked: the refusal is a JSON document too
            raise Exit(line, code=2)
        return super().execute(*tasks)
