"""The agent stays Python 3.8 code: every module the bundle ships compiles and imports there.

Why: the agent runs on the GPU host's own python3 (>= 3.8), while ruff and mypy read it with
3.11 grammar, so a `match`, a parenthesized `with`, or an annotation like `int | None` or
`list[int]` that is evaluated at run time would pass both and fail on an older host. With a
real 3.8 here (pyenv's, as on the development machine) the bundle is compiled, imported
module by module and run as shipped; without one (CI) each module is parsed with the 3.8
grammar instead. The annotation check runs everywhere: the 3.8 grammar accepts `int | None`
and `list[int]`, and importing only evaluates what a module's top level reaches.
"""
from __future__ import annotations

import ast
import json
import os
import subprocess

import pytest

from scripts.reach import bundle

PY38 = "/root/.pyenv/versions/3.8.18/bin/python3"
HAVE_PY38 = os.access(PY38, os.X_OK)
SOURCES = bundle.agent_sources()  # {"agent": ..., "agent.cli": ..., ...}: what ships to a host


def test_the_bundle_holds_the_agent():
    assert "agent.cli" in SOURCES and len(SOURCES) > 10


def parse_38(name: str, text: str) -> None:
    """Fail naming the line when `text` is not Python 3.8 grammar (without a 3.8 at hand)."""
    try:
        ast.parse(text, filename=name, feature_version=(3, 8))
    except SyntaxError as exc:
        pytest.fail(f"{name} line {exc.lineno}: not Python 3.8 syntax: {exc.msg}")


_NEW_GENERICS = {"list", "dict", "tuple", "set", "frozenset", "type"}  # subscriptable from 3.9


def _too_new(annotation) -> str:
    """What in an annotation fails when 3.8 evaluates it ('' when nothing does)."""
    for node in ast.walk(annotation):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
            return "`X | Y` (3.10)"
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id in _NEW_GENERICS:
            return f"`{node.value.id}[...]` (3.9)"
    return ""


def evaluated_annotations(tree):
    """Annotations Python 3.8 evaluates when the module runs: function signatures and
    module- or class-level variables. Not local variables (never evaluated), and none
    under `from __future__ import annotations`."""
    if any(isinstance(n, ast.ImportFrom) and n.module == "__future__" and any(a.name == "annotations" for a in n.names)
           for n in tree.body):
        return
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]:
                if arg is not None and arg.annotation is not None:
                    yield arg.annotation
            if node.returns is not None:
                yield node.returns
        if isinstance(node, (ast.Module, ast.ClassDef)):
            for stmt in node.body:
                if isinstance(stmt, ast.AnnAssign):
                    yield stmt.annotation


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_annotations_evaluated_at_run_time_are_38(name):
    bad = [f"line {a.lineno}: {why}" for a in evaluated_annotations(ast.parse(SOURCES[name]))
           if (why := _too_new(a))]
    assert not bad, f"{name}: annotations Python 3.8 cannot evaluate: {bad}"


def test_the_annotation_check_catches_new_forms():
    """The check above can fail: each of these is refused, the 3.8 spellings are not."""
    for text in ("def f(x: int | None): pass", "def f() -> list[int]: pass", "X: dict[str, int] = {}",
                 "class C:\n    y: tuple[int, ...] = ()"):
        assert [_too_new(a) for a in evaluated_annotations(ast.parse(text))] != [""], text
    for text in ("def f(x: 'int | None'): pass", "X: dict = {}", "def f():\n    y: list[int] = []",
                 "from __future__ import annotations\ndef f(x: int | None): pass"):
        assert all(not _too_new(a) for a in evaluated_annotations(ast.parse(text))), text


_IMPORT_ALL = """
import importlib, json, os, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the package `agent` sits beside this script
sources = json.loads(sys.stdin.read())
failed = {}
for name in sorted(sources):
    try:
        compile(sources[name], "<gpu-pivot>/" + name.replace(".", "/") + ".py", "exec")
        importlib.import_module(name)
    except Exception as exc:
        failed[name] = "%s: %s" % (type(exc).__name__, exc)
print(json.dumps(failed))
"""


def test_every_module_is_python_38(tmp_path):
    """With a real 3.8: the sources as a package `agent` in a temp dir, compiled and imported
    one by one there. Without one (CI): each parsed with the 3.8 grammar."""
    if not HAVE_PY38:
        for name, text in SOURCES.items():
            parse_38(name, text)
        return
    for name, text in SOURCES.items():
        path = tmp_path.joinpath(*name.split("."))
        is_package = any(other.startswith(name + ".") for other in SOURCES)
        path = path / "__init__.py" if is_package else path.with_suffix(".py")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (tmp_path / "check.py").write_text(_IMPORT_ALL)
    out = subprocess.run([PY38, "-I", str(tmp_path / "check.py")], input=json.dumps(SOURCES), capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {}


def test_the_shipped_bundle_runs_on_38():
    """The payload exactly as the transport sends it (its loader included), on stdin to a 3.8
    `python3 -`; without a 3.8, the payload parsed with the 3.8 grammar."""
    if not HAVE_PY38:
        parse_38("the bundle", bundle.agent_payload().decode())
        return
    out = subprocess.run([PY38, "-I", "-", "--help"], input=bundle.agent_payload(), capture_output=True, timeout=60)
    assert out.returncode == 0, out.stderr.decode()
    assert b"gpuagent" in out.stdout and b"teardown" in out.stdout
