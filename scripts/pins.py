"""The requirements files, made from pyproject.toml: the one place the pins are written.

Why: `make setup` and CI install requirements-dev.txt (pip reads it fast, with no build step),
and `pip install .` reads pyproject.toml; pins kept by hand in both drift apart. Here the files are
made from pyproject's lists (`make requirements`), with the comment each pin carries there, and
tests/test_requirements.py checks the files are what this makes.

  python -m scripts.pins runtime > requirements.txt
  python -m scripts.pins dev > requirements-dev.txt
"""
from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"
HEADERS = {
    "runtime": "# Runtime: what the operator's machine needs to run the invoke tasks. Made from pyproject.toml\n"
               "# [project] dependencies by `make requirements`: edit the pins there, not here.\n",
    "dev": "# Development: the runtime pins plus the test suite, linter and type checker. Made from\n"
           "# pyproject.toml [project.optional-dependencies] dev by `make requirements`: edit the pins there.\n"
           "-r requirements.txt\n",
}


def _comments(kind: str) -> dict:
    """{pin: the comment after it in pyproject.toml's list}, so the why travels with the pin."""
    text = PYPROJECT.read_text()
    block = text[text.index("dependencies = [" if kind == "runtime" else "dev = ["):]
    block = block[:block.index("]")]
    return {m[1]: m[2] for m in re.finditer(r'^\s*"([^"]+)",\s*#\s*(.*)$', block, re.M)}


def text(kind: str) -> str:
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    pins = project["dependencies"] if kind == "runtime" else project["optional-dependencies"]["dev"]
    notes = _comments(kind)
    return HEADERS[kind] + "".join(f"{p}  # {notes[p]}\n" if p in notes else f"{p}\n" for p in pins)


if __name__ == "__main__":
    if sys.argv[1:] not in (["runtime"], ["dev"]):
        sys.exit("usage: python -m scripts.pins runtime|dev")
    sys.stdout.write(text(sys.argv[1]))
