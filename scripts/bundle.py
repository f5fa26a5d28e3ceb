"""Bundle the agent package into one script for `python3 -` on the host.

Why: one ssh connection per call and nothing installed on the host. The payload holds the
sources of the agent's modules in a dict and a tiny import hook that serves them as the
package `agent`, so the agent stays small modules here and one stream on the wire. The
dict travels zlib-compressed (base85 text, about a third of the plain size): every call
sends it, and the sources themselves are unchanged, so a traceback on the host still
names the right file and line.

Only what the agent imports ships: the modules reachable from agent/cli.py by import
(read with ast, function-level imports included), not every file in scripts/agent, so
a module the agent no longer uses stops costing bytes on every call.
"""
from __future__ import annotations

import ast
import base64
import json
import zlib
from functools import lru_cache
from pathlib import Path

AGENT_DIR = Path(__file__).resolve().parent / "agent"
ENTRY = "cli"

_LOADER = r'''
import sys, importlib.abc, importlib.util
class _AgentSource(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if name in _SOURCES:
            return importlib.util.spec_from_loader(name, self, is_package=(name == "agent"))
        return None
    def create_module(self, spec):
        return None
    def exec_module(self, module):
        if module.__name__ == "agent":
            module.__path__ = []
        code = compile(_SOURCES[module.__name__], "<gpu-pivot>/" + module.__name__.replace(".", "/") + ".py", "exec")
        exec(code, module.__dict__)
sys.meta_path.insert(0, _AgentSource())
from agent.cli import main
sys.exit(main())
'''


def imported_siblings(source: str) -> set:
    """Names of the agent modules one module imports (`from . import a`, `from .b import c`),
    wherever the import statement is (top level, a function, a try block)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                found.add(node.module.split(".")[0])
            else:
                found.update(alias.name for alias in node.names)
    return found


def agent_modules() -> list:
    """The agent modules reachable from cli.py by import, sorted (names without `agent.`)."""
    seen, todo = set(), [ENTRY]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        path = AGENT_DIR / f"{name}.py"
        if not path.exists():
            raise FileNotFoundError(f"scripts/agent/{name}.py is imported by the agent but does not exist")
        seen.add(name)
        todo.extend(imported_siblings(path.read_text()) - seen)
    return sorted(seen)


def agent_sources() -> dict:
    sources = {"agent": (AGENT_DIR / "__init__.py").read_text()}
    for name in agent_modules():
        sources[f"agent.{name}"] = (AGENT_DIR / f"{name}.py").read_text()
    return sources


@lru_cache(maxsize=1)
def agent_payload() -> bytes:
    """The script sent on stdin. Cached: it is the same for every host of a run."""
    blob = base64.b85encode(zlib.compress(json.dumps(agent_sources(), sort_keys=True).encode(), 9)).decode()
    return ("# gpu-pivot agent (bundled: its modules' sources, zlib-compressed)\nimport base64, json, zlib\n"
            f"_SOURCES = json.loads(zlib.decompress(base64.b85decode({blob!r})))\n" + _LOADER).encode()
