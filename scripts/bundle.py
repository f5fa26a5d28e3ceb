"""Bundle the agent package into one script for `python3 -` on the host.

Why: one ssh connection per call and nothing installed on the host. The payload holds the
sources of scripts/agent/*.py in a dict and a tiny import hook that serves them as the
package `agent`, so the agent stays small modules here and one stream on the wire.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

AGENT_DIR = Path(__file__).resolve().parent / "agent"

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


def agent_sources() -> dict:
    sources = {}
    for path in sorted(AGENT_DIR.glob("*.py")):
        name = "agent" if path.stem == "__init__" else f"agent.{path.stem}"
        sources[name] = path.read_text()
    return sources


@lru_cache(maxsize=1)
def agent_payload() -> bytes:
    """The script sent on stdin. Cached: it is the same for every host of a run."""
    return ("# gpu-pivot agent (bundled)\n_SOURCES = " + repr(agent_sources()) + "\n" + _LOADER).encode()
