"""The docs a newcomer reads stay short and whole.

Rules (issue 45): README.md takes a newcomer to a real host, a teardown and a pivot in at most
300 lines, and links every reference file of docs/; every docstring in scripts/ and tasks.py
says why in at most 15 lines (the long account goes to docs/design-notes.md); every relative
link in README.md, docs/*.md and runbooks/*.md names a file that exists.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.conftest import REPO

README_MAX_LINES = 300
DOCSTRING_MAX_LINES = 15
LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")


def broken_links(path: Path) -> list[str]:
    """Each relative link in a markdown file whose target file is missing, as `FILE: TARGET`."""
    bad = []
    for target in LINK.findall(path.read_text()):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL, mailto:, or an anchor in the same file
        if not (path.parent / target.split("#", 1)[0]).exists():
            bad.append(f"{path.relative_to(REPO)}: {target}")
    return bad


def long_docstrings(path: Path) -> list[str]:
    """Each module, class or function docstring of a file longer than the cap, as `FILE:LINE NAME (N lines)`."""
    tree = ast.parse(path.read_text())
    found = []
    for node in [tree, *ast.walk(tree)]:
        if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if isinstance(node, ast.Module) and node is not tree:
            continue
        doc = ast.get_docstring(node, clean=False)
        if doc is not None and len(doc.splitlines()) > DOCSTRING_MAX_LINES:
            line = node.body[0].lineno
            found.append(f"{path.relative_to(REPO)}:{line} {getattr(node, 'name', '<module>')} "
                         f"({len(doc.splitlines())} lines)")
    return sorted(set(found))


def test_readme_is_at_most_300_lines():
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move reference text to docs/"


def test_readme_links_every_reference_doc():
    readme = (REPO / "README.md").read_text()
    docs = sorted(p.name for p in (REPO / "docs").glob("*.md"))
    assert docs, "docs/ holds no reference files"
    unlinked = [name for name in docs if f"](docs/{name})" not in readme]
    assert not unlinked, f"README.md does not link: {unlinked}"


def test_docstrings_are_at_most_15_lines():
    files = [*sorted((REPO / "scripts").rglob("*.py")), REPO / "tasks.py"]
    too_long = [entry for path in files for entry in long_docstrings(path)]
    assert not too_long, "docstrings over %d lines (say why in a few; the rest to docs/):\n%s" % (
        DOCSTRING_MAX_LINES, "\n".join(too_long))


def test_relative_links_resolve():
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "runbooks").glob("*.md"))]
    bad = [entry for page in pages for entry in broken_links(page)]
    assert not bad, "links to missing files:\n" + "\n".join(bad)


def test_the_checks_find_what_they_look_for(tmp_path, monkeypatch):
    """The two readers report a broken link and a long docstring, and pass good ones."""
    monkeypatch.setattr("tests.test_docs.REPO", tmp_path)
    (tmp_path / "there.md").write_text("x\n")
    page = tmp_path / "page.md"
    page.write_text("[ok](there.md) [anchor](there.md#a) [web](https://x.org) [gone](docs/gone.md#b)\n")
    assert broken_links(page) == ["page.md: docs/gone.md#b"]
    module = tmp_path / "m.py"
    body = "\n".join(f"    line {i}" for i in range(DOCSTRING_MAX_LINES))
    module.write_text(f'"""Short."""\n\n\nclass C:\n    """Long\n{body}\n    """\n\n\ndef f():\n    """Fine."""\n')
    assert long_docstrings(module) == [f"m.py:5 C ({DOCSTRING_MAX_LINES + 2} lines)"]
