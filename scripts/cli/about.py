"""The `version` task: which gpu-pivot, Invoke and Python answer, for a bug report or a runbook.

Why a task and not `invoke --version`: that flag belongs to Invoke and prints Invoke's
version only; the version of this tool is pyproject.toml's, read where the tasks live.
"""
from __future__ import annotations

from .common import dumps, guarded
from .flags import task


@task(help={"json": "print the versions as JSON"})
@guarded
def version(c, json=False):
    """Show gpu-pivot's version (pyproject.toml), and Invoke's and Python's. `invoke --version` is Invoke's alone."""
    import platform
    import tomllib
    from pathlib import Path

    import invoke

    project = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())["project"]
    doc = {"gpu-pivot": project["version"], "invoke": invoke.__version__, "python": platform.python_version()}
    print(dumps(doc) if json else f"gpu-pivot {doc['gpu-pivot']} (invoke {doc['invoke']}, python {doc['python']})")
