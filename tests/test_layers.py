"""The import structure: no circle, nothing imported from a higher layer, and the two sides
meet only in scripts/agent/wire/ (and the shared primitives the local side reads).

Read from the source with ast (function-level imports count: a late import is still an
import, it only hides a circle from Python). The layers, lowest first, are below; a module
may import its own layer and those under it. A new module must be given a layer here.
"""
from __future__ import annotations

import ast
from fnmatch import fnmatch
from pathlib import Path

from tests.conftest import REPO

WIRE = "scripts.agent.wire"
# What the local side may import of the agent: the wire, and the primitives both sides must
# apply alike (one copy: a second would drift).
SHARED = ("scripts.agent.procs.procfs", "scripts.agent.procs.rules", "scripts.agent.procs.program",
          "scripts.agent.state.statedir")
AGENT = "scripts.agent"
# scripts/gpuagent.py runs the agent from a checkout on the host (`python3 scripts/gpuagent.py
# ping`): it is the agent's launcher, not the local side, and imports agent.cli by design.
AGENT_LAUNCHER = "scripts.gpuagent"

LOCAL_LAYERS = (
    ("base", ("scripts", "scripts.config", "scripts.config.errors", "scripts.config.nodeset", "scripts.config.defaults",
              "scripts.views.render", "scripts.pins", "scripts.ops.floor", "scripts.emergency.fuser_parse",
              "scripts.ops.sandbox_roles")),
    ("input", ("scripts.config.envfile", "scripts.config.sshopts", "scripts.config.patterncheck",
               "scripts.config.cliargs", "scripts.config.route", "scripts.reach", "scripts.emergency.ere")),
    ("config", ("scripts.config.phases", "scripts.config.hostconfig", "scripts.config.sandbox",
                "scripts.config.hosts")),
    ("transport", ("scripts.reach.ssh", "scripts.reach.route", "scripts.reach.transport", "scripts.reach.runner",
                   "scripts.reach.bundle", "scripts.ops.audit_log", "scripts.ops.sandbox_fs", "scripts.emergency",
                   "scripts.emergency.shell_teardown", "scripts.ops.sandbox_procs")),
    ("operations and views", ("scripts.views", "scripts.views.*", "scripts.ops", "scripts.ops.*",
                              "scripts.reach.remote_cmd", "scripts.emergency.runbook",
                              "scripts.engines", "scripts.engines.*")),
    ("tasks", ("tasks", "scripts.cli", "scripts.cli.*")),
)
# The agent is its own stack: the wire, the primitives the local side shares, the subcommands
# and what they share, and the command line on top.
AGENT_LAYERS = (
    ("wire", (WIRE, WIRE + ".*")),
    ("primitives", ("scripts.agent.procs", "scripts.agent.procs.*", "scripts.agent.state",
                    "scripts.agent.state.statedir")),
    ("agent", ("scripts.agent", "scripts.agent.*")),
    ("command line", ("scripts.agent.cli", AGENT_LAUNCHER)),
)

# Edges known to be wrong and waiting for a change in a file another change owns, with what
# to do. Each entry must still exist (test_pending_edges_still_exist): remove it when fixed.
PENDING = {
}


def module_name(path: Path) -> str:
    rel = path.relative_to(REPO).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def source_files() -> dict:
    files = [REPO / "tasks.py", *sorted((REPO / "scripts").rglob("*.py"))]
    return {module_name(p): p for p in files if "__pycache__" not in p.parts}


def imports_of(name: str, path: Path, known: set) -> set:
    """The project modules `name` imports, anywhere in its source."""
    is_package = path.name == "__init__.py"
    package = name if is_package else name.rpartition(".")[0]
    found = set()

    def add(target: str, names=()):
        for n in names:  # `from pkg import mod` imports the module pkg.mod
            if f"{target}.{n}" in known:
                found.add(f"{target}.{n}")
                continue
            if target in known:
                found.add(target)
        if not names and target in known:
            found.add(target)

    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = alias.name
                if name == AGENT_LAUNCHER and target.split(".")[0] == "agent":
                    target = "scripts." + target
                while target and target not in known:
                    target = target.rpartition(".")[0]
                if target:
                    found.add(target)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
                if name == AGENT_LAUNCHER and target.split(".")[0] == "agent":
                    target = "scripts." + target
            add(target, [a.name for a in node.names])
    found.discard(name)
    return found


def graph() -> dict:
    files = source_files()
    known = set(files)
    return {name: imports_of(name, path, known) for name, path in files.items()}


def is_agent(name: str) -> bool:
    return name == AGENT or name.startswith(AGENT + ".") or name == AGENT_LAUNCHER


def layer_of(name: str, layers) -> int | None:
    for i, (_, patterns) in enumerate(layers):
        if any(name == p for p in patterns):  # an exact name wins over a pattern
            return i
    for i, (_, patterns) in enumerate(layers):
        if any(fnmatch(name, p) for p in patterns):
            return i
    return None


def strongly_connected(g: dict) -> list:
    """Tarjan's algorithm: the strongly connected components of the import graph."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in g.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def without_pending(g: dict) -> dict:
    return {a: {b for b in bs if (a, b) not in PENDING} for a, bs in g.items()}


def is_wire(name: str) -> bool:
    return name == WIRE or name.startswith(WIRE + ".")


def test_the_local_side_imports_only_the_wire_and_the_shared_primitives_from_the_agent():
    g = without_pending(graph())
    agent_packages = {AGENT, "scripts.agent.procs", "scripts.agent.state"}  # what importing a shared module loads
    bad = [f"{a} imports {b}" for a, bs in sorted(g.items()) if not is_agent(a)
           for b in sorted(bs) if is_agent(b) and not is_wire(b) and b not in SHARED and b not in agent_packages]
    assert not bad, ("the local side may import of the agent only scripts.agent.wire and " + ", ".join(SHARED) +
                     ":\n  " + "\n  ".join(bad))


def test_the_agent_imports_nothing_of_the_local_side():
    g = graph()
    bad = [f"{a} imports {b}" for a, bs in sorted(g.items()) if is_agent(a) for b in sorted(bs) if not is_agent(b)]
    assert not bad, "\n  ".join(["the agent ships alone; it may not import:", *bad])


def test_no_import_circle():
    circles = [c for c in strongly_connected(without_pending(graph())) if len(c) > 1]
    assert not circles, "import circles (function-level imports count):\n  " + "\n  ".join(
        " <-> ".join(c) for c in circles)


def test_every_module_has_a_layer_and_nothing_imports_upward():
    g = without_pending(graph())
    unplaced = [n for n in sorted(g) if layer_of(n, AGENT_LAYERS if is_agent(n) else LOCAL_LAYERS) is None]
    assert not unplaced, f"give these modules a layer in tests/test_layers.py: {unplaced}"
    upward = []
    for a, bs in sorted(g.items()):
        layers = AGENT_LAYERS if is_agent(a) else LOCAL_LAYERS
        for b in sorted(bs):
            la, lb = layer_of(a, layers), layer_of(b, layers)
            if lb is not None and lb > la:
                upward.append(f"{a} ({layers[la][0]}) imports {b} ({layers[lb][0]})")
    assert not upward, "imports from a higher layer:\n  " + "\n  ".join(upward)


def test_the_wire_imports_nothing_of_the_agent_outside_it():
    """What crosses between the two sides stands alone: both sides read it, so it may lean on neither."""
    g = graph()
    bad = [f"{a} imports {b}" for a, bs in sorted(g.items()) if is_wire(a) for b in sorted(bs)
           if not is_wire(b) and b != AGENT]
    assert not bad, "\n  ".join(["the wire imports only the wire:", *bad])


def test_the_procs_primitives_import_only_procs_and_the_wire():
    """Reading /proc is the agent's lowest layer: nothing above it (rules, gpu, state, teardown)."""
    g = graph()
    procs = "scripts.agent.procs"
    bad = [f"{a} imports {b}" for a, bs in sorted(g.items()) if a == procs or a.startswith(procs + ".")
           for b in sorted(bs) if not (is_wire(b) or b == AGENT or b == procs or b.startswith(procs + "."))]
    assert not bad, "\n  ".join(["procs/ imports only procs/ and the wire:", *bad])


def test_pending_edges_still_exist():
    g = graph()
    stale = [edge for edge in PENDING if edge[1] not in g.get(edge[0], ())]
    assert not stale, f"fixed: remove from PENDING in tests/test_layers.py: {stale}"


def test_the_checker_sees_late_imports_and_circles(tmp_path):
    """The checker itself: a function-level import makes an edge, and a two-module circle is found."""
    g = graph()
    assert "scripts.config.nodeset" in g["scripts.config.hostconfig"]  # imported inside select_hosts
    assert strongly_connected({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"], ["c"]]


def test_every_module_the_layers_name_exists():
    """A layer that names a module no longer there says nothing, and hides that it is gone."""
    names = set(graph())
    listed = [p for _, patterns in LOCAL_LAYERS + AGENT_LAYERS for p in patterns]
    missing = [p for p in listed if not any(fnmatch(n, p) for n in names)]
    assert not missing, f"tests/test_layers.py names modules that do not exist: {missing}"


def test_the_readmes_architecture_names_modules_that_exist():
    """The README's Architecture section is how a newcomer finds where a behaviour lives: every
    file it names must be there (a bare name in a folder's row: in that folder)."""
    import re

    text = (REPO / "README.md").read_text()
    section = text[text.index("## Architecture"):text.index("## Tests and benchmarks")]
    scripts = REPO / "scripts"
    missing, checked = [], 0
    for line in section.splitlines():
        folder = re.match(r"\| `(scripts/[a-z_/]+/)`", line)
        for name in re.findall(r"`([a-z_/.]+\.(?:py|sh))`", line):
            rel = name.removeprefix("scripts/")
            bases = [REPO / folder.group(1)] if folder and "/" not in name else [REPO, scripts, scripts / "agent"]
            path = next((b / rel for b in bases if (b / rel).exists()), bases[0] / rel)
            checked += 1
            if not path.exists():
                missing.append(f"{name} (looked at {path.relative_to(REPO)})")
    assert checked > 40 and not missing, missing
