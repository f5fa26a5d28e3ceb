"""What ships to a host is the agent without its docstrings and comment lines (every call
sends it), and is still the same code on the same lines: a traceback on the host names the
line it would name here."""
from __future__ import annotations

import ast
import json
import zlib

import pytest

from scripts.reach import bundle


def _without_docstrings(source: str) -> str:
    tree = ast.parse(source)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and body and \
                isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and \
                isinstance(body[0].value.value, str):
            del body[0]  # with its own place: a shipped docstring is shorter
            if not body:  # a class that is only its docstring ends where the shorter one does
                node.end_lineno = node.end_col_offset = None
    return ast.dump(tree, include_attributes=True)


@pytest.mark.parametrize("name", sorted(bundle.agent_sources(stripped=False)))
def test_each_module_ships_the_same_code_on_the_same_lines(name):
    original = bundle.agent_sources(stripped=False)[name]
    shipped = bundle.agent_sources()[name]
    assert shipped.count("\n") == original.count("\n")
    assert _without_docstrings(shipped) == _without_docstrings(original)  # positions included


@pytest.mark.parametrize("name", ["agent.teardown.run", "agent.phases.run"])
def test_a_docstrings_first_line_stays_for_the_subcommands_help(name):
    """agent/cli.py shows a module's docstring, or a class's (phase.Start), as a subcommand's help."""
    def firsts(source):
        return [ast.get_docstring(n).splitlines()[0] for n in ast.walk(ast.parse(source))
                if isinstance(n, (ast.Module, ast.ClassDef)) and ast.get_docstring(n)]

    assert firsts(bundle.agent_sources()[name]) == firsts(bundle.agent_sources(stripped=False)[name])
    assert len(firsts(bundle.agent_sources()[name])) >= 1


def test_strip_keeps_strings_that_only_look_like_docstrings_or_comments():
    source = 'X = (\n    """not a docstring"""\n)\nY = """\n# not a comment\n"""\ndef f():\n    """doc"""\n    # note\n'
    assert bundle.strip_source(source) == 'X = (\n    """not a docstring"""\n)\nY = """\n# not a comment\n"""\n' \
                                          "def f():\n    'doc'\n\n"


def test_the_bundle_is_at_least_a_quarter_smaller():
    """Measured as it travels: the sources as JSON in one zlib stream (bundle.agent_stream)."""
    def size(sources):
        return len(zlib.compress(json.dumps(sources, sort_keys=True).encode(), 6))

    before, after = size(bundle.agent_sources(stripped=False)), size(bundle.agent_sources())
    print(f"bundle sources on the wire: {before} -> {after} bytes per call")
    assert after <= 0.75 * before
    assert abs(len(bundle.agent_stream()) - after) < 0.05 * after  # the stream is the sources and a small loader


def test_a_kept_copy_is_used_only_for_the_very_file_it_was_made_from(tmp_path):
    module = tmp_path / "m.py"
    module.write_text('"""Doc.\n\nMore."""\nX = 1  # one\n')
    assert bundle.shipped_source(module) == "'Doc.'\n\n\nX = 1\n"
    kept = tmp_path / "__pycache__" / "m.shipped.py"
    assert kept.exists()
    module.write_text('"""Doc.\n\nMore."""\nX = 22  # two\n')  # another size, another mtime
    assert bundle.shipped_source(module) == "'Doc.'\n\n\nX = 22\n"


@pytest.mark.parametrize("source", [
    'HELP = {"teardown":\n        """Stop the targets.\n\n        Then verify."""\n}\n',  # a value after a `:` line
    'X = "a \\\n# b"\n',  # a line continued by a backslash is not a comment line
    'Y = "a \\\nb # c"\n',
    'def f(a,\n      b):\n    """Doc.\n\n    More."""\n    return {"k":\n        """v\n# not a comment"""}\n',
])
def test_strip_source_never_changes_what_the_code_does(source):
    def run(text, name):
        scope: dict = {}
        exec(compile(text, name, "exec"), scope)
        return {k: v for k, v in scope.items() if k not in ("__builtins__", "f")} | (
            {"f": scope["f"](1, 2)} if "f" in scope else {})

    assert run(bundle.strip_source(source), "shipped") == run(source, "original")
    assert bundle.strip_source(source).count("\n") == source.count("\n")
