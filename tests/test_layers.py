"""The import structure: each folder of scripts/ is one layer, and nothing imports upward.

Rules (read from the source with ast; a function-level import counts: a late import is still an
import, it only hides a circle from Python):
- A module imports only modules of its own folder, of folders in its layer (with no circle
  between those folders), and of lower layers. The layers are the folders, listed below lowest
  first, so a new module needs no entry here; a new folder must be given a layer.
- The agent (scripts/agent/) ships alone to the host: it imports nothing of the local side.
- The wire (scripts/agent/wire/) is what crosses between the two sides: it imports nothing of
  the agent outside itself, and each of its modules stays small.
- The local side imports of the agent only the wire and the primitives both sides must apply
  the same way (SHARED).
"""
from __future__ import annotations

import ast
import functools
import re
from collections import Counter
from pathlib import Path

from tests.conftest import REPO

AGENT = "scripts.agent"
WIRE = "scripts.agent.wire"
# scripts/gpuagent.py runs the agent from a checkout on the host (`python3 scripts/gpuagent.py
# ping`): the agent's launcher, at the top of the agent's stack.
AGENT_LAUNCHER = "scripts.gpuagent"
TOP = "(top)"  # the modules directly in scripts/agent/: the agent's command line

# Lowest first; each entry a layer: the folders in it.
AGENT_LAYERS = (
    ("the wire", ("wire",)),
    ("/proc primitives", ("procs",)),
    ("policy: what a process is and may be done to it", ("policy",)),
    ("the options record: the entry points' alone", ("options",)),
    ("the GPUs and the host's state", ("gpu", "state")),
    ("who holds each GPU: the scan engine", ("holders",)),
    ("subcommands", ("status", "teardown", "phases")),
    ("the agent's command line", (TOP,)),
)
LOCAL_LAYERS = (
    ("configuration", ("config",)),
    ("reaching a host", ("reach",)),
    ("operations", ("ops", "engines", "emergency")),
    ("views", ("views",)),
    ("tasks", ("cli", "tasks")),
)
# What the local side may import from the agent besides the wire: one copy for both sides,
# since a second copy would drift (a private state dir checked one way here and another there,
# a process signalled by another identity rule, a protect list the one-liner spells otherwise).
SHARED = {
    "scripts.agent.procs.procfs": "a process by pid + start time, signalled only if still that one",
    "scripts.agent.state.statedir": "private state directories and files, checked the same way",
    "scripts.agent.policy.builtin": "the built-in selection the emergency one-liner is generated from",
    "scripts.agent.policy.program": "what program a process runs: the views name it, the one-liner reads scripts so",
    "scripts.agent.procs.textsafe": "host text escaped for a terminal and kept byte-exact in JSON: one rule to test",
}
TOOLING = {"scripts.pins"}  # makes the requirements files: imports nothing of the project
WIRE_MAX_LINES = 350  # each module of the wire
# The wire's run-time modules together (all but rows.py and gpu_rows.py, TypedDicts mypy reads and nothing
# imports at run time): the argv, framing, codes, defaults and the fifteen typed records with
# their readers, what the two sides must agree on. A ceiling so it cannot grow by accretion:
# raised from 650 to 670 once, for issue 44's two new results (gpu-settings, release) and its
# probe, checkpoint-stop and lock-hold fields, after the wire's docstrings had been trimmed for them.
# Raised to 935 (by 265, less than requests.py's 300) for issue 45's typed requests: one per
# subcommand with its flags, argv and deadline, moved out of reach/transport.py (-136 lines) and
# the argv table of call.py (-27), which now derives from them.
WIRE_RUNTIME_MAX_LINES = 935


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def source_files() -> dict:
    files = [REPO / "tasks.py", *sorted((REPO / "scripts").rglob("*.py"))]
    return {module_name(p): p for p in files if "__pycache__" not in p.parts}


def imports_of(name: str, path: Path, known: set) -> set:
    """The project modules `name` imports, anywhere in its source."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()

    def resolve(target: str) -> str:
        if name == AGENT_LAUNCHER and target.split(".")[0] == "agent":
            target = "scripts." + target  # the launcher puts scripts/ on sys.path
        while target and target not in known:
            target = target.rpartition(".")[0]
        return target

    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found |= {resolve(a.name) for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for a in node.names:  # `from pkg import mod` imports the module pkg.mod
                found.add(resolve(f"{target}.{a.name}"))
    found.discard("")
    found.discard(name)
    return found


def graph() -> dict:
    """The project's import graph, read once per test process (every rule below walks it)."""
    return {name: set(found) for name, found in _graph().items()}


@functools.cache
def _graph() -> dict:
    files = source_files()
    return {name: imports_of(name, path, set(files)) for name, path in files.items()}


def is_agent(name: str) -> bool:
    return name == AGENT or name.startswith(AGENT + ".") or name == AGENT_LAUNCHER


def folder_of(name: str) -> str | None:
    """The folder a module's layer is read from: scripts/agent/<folder>/ or scripts/<folder>/;
    TOP for a module directly in scripts/agent/ (and the launcher); 'tasks' for tasks.py."""
    if name == "tasks":
        return "tasks"
    if name in (AGENT, AGENT_LAUNCHER):
        return TOP
    parts = name.split(".")
    if is_agent(name):
        return parts[2] if len(parts) > 3 or (REPO / "scripts" / "agent" / parts[2]).is_dir() else TOP
    return parts[1] if len(parts) > 1 else None


def layer_of(name: str) -> int | None:
    layers = AGENT_LAYERS if is_agent(name) else LOCAL_LAYERS
    folder = folder_of(name)
    return next((i for i, (_, folders) in enumerate(layers) if folder in folders), None)


def strongly_connected(g: dict) -> list:
    """Tarjan's algorithm: the strongly connected components of a graph."""
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


def test_every_folder_has_a_layer():
    g = graph()
    unplaced = sorted({folder_of(n) or n for n in g if n not in TOOLING and n != "scripts" and layer_of(n) is None})
    assert not unplaced, f"give these folders a layer in tests/test_layers.py: {unplaced}"


def test_nothing_imports_from_a_higher_layer():
    g = graph()
    upward = []
    for a, bs in sorted(g.items()):
        if a in TOOLING or a == "scripts":
            continue
        for b in sorted(bs):
            if is_agent(a) != is_agent(b) or b == "scripts":
                continue  # across the two sides: the tests below
            la, lb = layer_of(a), layer_of(b)
            if lb is not None and la is not None and lb > la:
                layers = AGENT_LAYERS if is_agent(a) else LOCAL_LAYERS
                upward.append(f"{a} ({layers[la][0]}) imports {b} ({layers[lb][0]})")
    assert not upward, "imports from a higher layer:\n  " + "\n  ".join(upward)


def test_no_circle_between_folders_of_one_layer():
    g = graph()
    folders: dict = {}
    for a, bs in g.items():
        for b in bs:
            fa, fb = folder_of(a), folder_of(b)
            if is_agent(a) == is_agent(b) and fa != fb and layer_of(a) == layer_of(b) and layer_of(a) is not None:
                folders.setdefault((is_agent(a), fa), set()).add((is_agent(b), fb))
    circles = [c for c in strongly_connected(folders) if len(c) > 1]
    assert not circles, f"folders of one layer that import each other: {circles}"


def test_no_import_circle():
    circles = [c for c in strongly_connected(graph()) if len(c) > 1]
    assert not circles, "import circles (function-level imports count):\n  " + "\n  ".join(
        " <-> ".join(c) for c in circles)


def test_views_import_neither_reach_nor_operations():
    """A view renders what it is given and runs nothing: it reads a fleet outcome's Failure and
    the records, never an error's type or an operation (the task hands the pivot its words)."""
    g = graph()
    bad = [f"{a} imports {b}" for a, bs in sorted(g.items()) if folder_of(a) == "views" and not is_agent(a)
           for b in sorted(bs) if not is_agent(b) and folder_of(b) in ("reach", "ops", "engines", "emergency")]
    assert not bad, "\n  ".join(["a view may not import what reaches a host or runs an operation:", *bad])


def test_the_agent_imports_nothing_of_the_local_side():
    g = graph()
    bad = [f"{a} imports {b}" for a, bs in sorted(g.items()) if is_agent(a) for b in sorted(bs)
           if not is_agent(b) and b != "scripts"]
    assert not bad, "\n  ".join(["the agent ships alone; it may not import:", *bad])


def test_the_wire_imports_nothing_of_the_agent_outside_it():
    g = graph()
    bad = [f"{a} imports {b}" for a, bs in sorted(g.items()) if a.startswith(WIRE)
           for b in sorted(bs) if b not in (AGENT, "scripts") and not b.startswith(WIRE)]
    assert not bad, "\n  ".join(bad)


def test_the_local_side_imports_only_the_wire_and_the_shared_primitives():
    g = graph()
    bad = [f"{a} imports {b}" for a, bs in sorted(g.items()) if not is_agent(a)
           for b in sorted(bs) if is_agent(b) and b != AGENT and not b.startswith(WIRE) and b not in SHARED]
    assert not bad, "the local side may import of the agent only the wire and SHARED:\n  " + "\n  ".join(bad)


def test_the_shared_primitives_stand_alone():
    """A shared primitive is imported by both sides: it may itself import only the wire and the
    other shared primitives, or the local side would load agent code through it."""
    g = graph()
    for name in SHARED:
        extra = {b for b in g[name] if b not in SHARED and b != AGENT and not b.startswith(WIRE)
                 and b != name.rpartition(".")[0]}
        assert not extra, f"{name} imports {sorted(extra)}"


def test_procs_imports_only_procs_and_the_wire():
    """Reading /proc is the agent's lowest layer but the wire: nothing above it (gpu, state, teardown)."""
    g = graph()
    bad = [f"{a} imports {b}" for a, bs in sorted(g.items()) if folder_of(a) == "procs" and is_agent(a)
           for b in sorted(bs) if b != AGENT and folder_of(b) not in ("procs", "wire")]
    assert not bad, "\n  ".join(bad)


def test_the_wire_is_small():
    sizes = {p.name: len(p.read_text().splitlines()) for p in (REPO / "scripts" / "agent" / "wire").glob("*.py")}
    big = {name: n for name, n in sizes.items() if n > WIRE_MAX_LINES}
    assert sizes and not big, f"wire modules over {WIRE_MAX_LINES} lines: {big}"
    runtime = sum(n for name, n in sizes.items() if not name.endswith("rows.py"))  # rows, gpu_rows: types only
    assert runtime <= WIRE_RUNTIME_MAX_LINES, f"the wire's run-time modules: {runtime} lines"


def test_the_checker_sees_late_imports_circles_and_folders():
    """The checker itself: a function-level import makes an edge, a two-module circle is found,
    and a module's layer is its folder's."""
    g = graph()
    assert "scripts.config.nodeset" in g["scripts.config.hostconfig"]  # imported inside select_hosts
    assert strongly_connected({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"], ["c"]]
    assert folder_of("scripts.agent.procs.procfs") == "procs" and folder_of("scripts.agent.cli") == TOP
    assert layer_of("scripts.agent.wire") == 0 and layer_of("scripts.views.render") == 3


def test_the_architecture_doc_is_the_folder_map():
    """docs/architecture.md is how a newcomer finds where a behaviour lives: a row for every
    folder of scripts/ (and scripts/agent/), and every file it names exists there."""
    section = (REPO / "docs" / "architecture.md").read_text()
    scripts = REPO / "scripts"
    row = r"^\| \d+ \| `(scripts/[a-z_/]+/)` \|"  # | layer | folder | what it holds |
    rows = set(re.findall(row, section, flags=re.M))
    folders = {f"{p.relative_to(REPO)}/" for p in [*scripts.iterdir(), *(scripts / "agent").iterdir()]
               if p.is_dir() and p.name != "__pycache__" and any(p.glob("*.py"))}
    assert folders <= rows, f"folders without a row in docs/architecture.md: {sorted(folders - rows)}"
    missing, checked = [], 0
    for line in section.splitlines():
        folder = re.match(row, line)
        for name in re.findall(r"`([a-z_/.]+\.(?:py|sh))`", line):
            rel = name.removeprefix("scripts/")
            bases = [REPO / folder.group(1)] if folder and "/" not in name else [REPO, scripts, scripts / "agent"]
            path = next((b / rel for b in bases if (b / rel).exists()), bases[0] / rel)
            checked += 1
            if not path.exists():
                missing.append(f"{name} (looked at {path.relative_to(REPO)})")
    assert checked > 15 and not missing, missing


# -- one of each: one proof wrapper, one ssh-option reader, nothing in scripts/ only tests use ----

def _sources(under: str = "scripts") -> dict:
    return {p: p.read_text() for p in sorted((REPO / under).rglob("*.py")) if "__pycache__" not in p.parts}


def test_the_proof_line_is_written_by_route_marked_alone():
    """Every command over ssh goes behind route.marked's proof line (an operator's `run` too):
    a second wrapper would be a second place to get the 255 rule wrong. runner.py reads it."""
    writers = {p.name for p, text in _sources().items() if '"%s\\\\n" "$1" >&2' in text}
    callers = {p.name for p, text in _sources().items() if re.search(r"\bran_line\(", text)}
    assert writers == {"route.py"}, writers
    assert callers <= {"route.py", "runner.py"}, callers


def test_ssh_options_are_read_only_by_config_sshopts():
    """The local side reads a host's ssh options only through config/sshopts.options (as ssh's
    getopt reads them: `-p2222`, `-vp 22`): a token compared with a one-letter flag is a parser
    of its own. The agent's readers of a process's argv (`python -m`) are not ssh's."""
    own = re.compile(r"""(?:==|\bin)\s*\(?\s*["']-[A-Za-z]["']""")
    found = [f"{p.relative_to(REPO)}:{n}" for p, text in _sources().items() if "agent" not in p.parts
             for n, line in enumerate(text.splitlines(), 1) if own.search(line)]
    assert not found, found


def test_scripts_defines_nothing_that_only_tests_or_benchmarks_use():
    """A public function or class of scripts/ that nothing on the product's side names (scripts/,
    tasks.py, ansible/) but a test or a benchmark does belongs in tests/support/ or bench/."""
    product = {**_sources(), REPO / "tasks.py": (REPO / "tasks.py").read_text(), **_sources("ansible")}
    named = Counter(re.findall(r"\w+", "\n".join(product.values())))
    users = set(re.findall(r"\w+", "\n".join([*_sources("tests").values(), *_sources("bench").values()])))
    only_tests = [f"{path.relative_to(REPO)}: {node.name}" for path in _sources()
                  for node in ast.parse(product[path]).body
                  if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("_")
                  and named[node.name] <= 1 and node.name in users]
    assert not only_tests, only_tests


# -- the options record at the agent's entry points only ------------------------------------------

# Entry points: the command line and the options themselves, and each subcommand's run and
# add_arguments (a module's, or the class's SUBCOMMAND_MODULES names, with its bases').
OPTIONS_TAKERS = {"scripts.agent.cli", "scripts.agent.options.record"}
ENTRY_NAMES = {"run", "add_arguments"}


def _takes_options(fn) -> bool:
    """A parameter named as the record is (opts, options, args) or annotated Options; *args is not one."""
    a = fn.args
    params = [*a.posonlyargs, *a.args, *a.kwonlyargs]
    return any(p.arg in ("opts", "options", "args")
               or (p.annotation is not None and "Options" in ast.unparse(p.annotation)) for p in params)


def _functions(tree):
    """(qualified name, class name or None, function) for every function, methods as Class.name."""
    def walk(node, prefix, cls):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield prefix + child.name, cls, child
                yield from walk(child, prefix + child.name + ".", None)
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, prefix + child.name + ".", child.name)
            else:
                yield from walk(child, prefix, cls)
    yield from walk(tree, "", None)


def _entry_classes(name: str, tree) -> set:
    """The classes of a module SUBCOMMAND_MODULES names, with the bases they inherit run from."""
    from scripts.agent.wire.call import SUBCOMMAND_MODULES
    named = {cls for module, cls in SUBCOMMAND_MODULES.values() if f"{AGENT}.{module}" == name and cls}
    bases = {b.id for node in ast.walk(tree) if isinstance(node, ast.ClassDef) and node.name in named
             for b in node.bases if isinstance(b, ast.Name)}
    return named | bases


def test_the_options_record_is_taken_only_by_entry_points():
    """Below a subcommand's run(opts), functions take the few values they read or a small record
    (policy/selection.py's Selection, a GpuSource, settle.Window), never the options record:
    a module that takes it can read any flag, and what it depends on no longer shows."""
    from scripts.agent.wire.call import SUBCOMMAND_MODULES
    entry_modules = {f"{AGENT}.{module}" for module, _ in SUBCOMMAND_MODULES.values()}
    found = set()
    for name, path in source_files().items():
        if not is_agent(name) or name in OPTIONS_TAKERS or name.startswith(WIRE):  # the wire: argv, not the record
            continue
        tree = ast.parse(path.read_text())
        classes = _entry_classes(name, tree) if name in entry_modules else set()
        for qual, cls, fn in _functions(tree):
            entry = name in entry_modules and fn.name in ENTRY_NAMES and (qual == fn.name or cls in classes)
            if not entry and _takes_options(fn):
                found.add(f"{name}:{qual}")
    assert not found, "take the values, not the options record:\n  " + "\n  ".join(sorted(found))


def test_each_entry_point_annotates_the_options_record():
    """Each subcommand's run takes the record annotated `Options`, so mypy checks every field it
    reads (a misspelt flag is a type error, not a None at run time)."""
    from scripts.agent.wire.call import SUBCOMMAND_MODULES
    unannotated = []
    for module, cls in sorted(set(SUBCOMMAND_MODULES.values()), key=str):
        tree = ast.parse((REPO / "scripts" / "agent" / (module.replace(".", "/") + ".py")).read_text())
        runs = [fn for qual, owner, fn in _functions(tree) if fn.name == "run" and owner == cls
                and qual == (f"{cls}.run" if cls else "run")]
        params = [p for fn in runs for p in fn.args.args if p.arg not in ("self", "cls")][:1] if runs else []
        if not params or params[0].annotation is None or ast.unparse(params[0].annotation) != "Options":
            unannotated.append(f"{module}:{cls or ''}.run")
    assert not unannotated, f"annotate the options record as Options: {unannotated}"


def test_the_options_check_sees_a_taker():
    """The check itself: a parameter named or annotated as the record counts, *args does not."""
    fns = {q: fn for q, _, fn in _functions(ast.parse(
        "def a(opts): pass\ndef b(x: Options): pass\ndef c(*args): pass\nclass K:\n    def d(self, args): pass\n"))}
    assert [q for q, fn in fns.items() if _takes_options(fn)] == ["a", "b", "K.d"]
# -- a teardown reaches a host only through its operation ------------------------------------

TEARDOWN_OP = "scripts/ops/teardown.py"
TEARDOWN_BUILDERS = ("Plan", "Teardown", "plan")  # the plan is the teardown's first half: what it would signal


def _names_a_teardown(expr, scope) -> bool:
    """Whether a request expression is a plan or a teardown: built by requests.Plan/Teardown,
    a request's .plan(), or a name assigned from one (or annotated so) in the same function."""
    if isinstance(expr, ast.Call):
        func = expr.func
        return (func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")) in TEARDOWN_BUILDERS
    if not isinstance(expr, ast.Name):
        return False
    for node in ast.walk(scope):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == expr.id for t in targets) and \
                    _names_a_teardown(node.value, scope):
                return True
        if isinstance(node, ast.arg) and node.arg == expr.id and node.annotation is not None:
            if any(b in ast.unparse(node.annotation) for b in ("Plan", "Teardown")):
                return True
    return False


def _teardown_calls(text: str) -> list:
    """Lines of calls that send a host its teardown or plan: call_agent(host, R) where R is a
    requests.Plan or requests.Teardown (see _names_a_teardown)."""
    found = []
    tree = ast.parse(text)
    scopes = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))]
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
        request = node.args[1] if name == "call_agent" and len(node.args) > 1 else None
        if request is None:
            continue
        around = [s for s in scopes if s.lineno <= node.lineno <= (s.end_lineno or s.lineno)]
        if any(_names_a_teardown(request, s) for s in around or [tree]):
            found.append(node.lineno)
    return found


def test_only_the_teardown_operation_sends_a_teardown():
    """tasks -> operations -> reach is the only path to a host's teardown: `invoke teardown`,
    `invoke plan`, the pivot's step, the Slurm epilog and the Ansible module all go through
    scripts/ops/teardown.py, so none can skip its approval or its audit record. The
    transport's call_agent (below it) is the primitive it calls."""
    allowed = {TEARDOWN_OP, "scripts/reach/transport.py"}
    found = [f"{p.relative_to(REPO)}:{n}" for p, text in _sources().items() if "agent" not in p.parts
             and str(p.relative_to(REPO)) not in allowed for n in _teardown_calls(text)]
    assert not found, "a teardown or plan sent outside " + TEARDOWN_OP + ":\n  " + "\n  ".join(found)
    assert _teardown_calls("call_agent(h, requests.Plan())\ncall_agent(h, req.plan())\ncall_agent(h, requests.Scan())\n"
                           "def f(h, r: requests.Teardown):\n    call_agent(h, r)\n"
                           "def g(h):\n    q = requests.Teardown(grace=1)\n    call_agent(h, q)\n") == [1, 2, 5, 8]

NVML_WRAPPER = "scripts/agent/gpu/nvml.py"  # the agent's one door to NVML
RAW_NVML = re.compile(r"^(?:c_)?nvml[A-Z]|^NVMLError")  # pynvml's functions, structs, constants, errors


def raw_nvml_uses(text: str) -> list:
    """Where a source imports pynvml or reaches one of its names: an import (`import pynvml`,
    `__import__("pynvml")`), an attribute or name (`nv.nvmlDeviceGetUUID`, `nv.NVMLError`), or
    such a name as a string handed to getattr/hasattr (a call made by name)."""
    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            found += [f"import {a.name}" for a in node.names if a.name.split(".")[0] == "pynvml"]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "pynvml":
            found.append(f"from {node.module} import ...")
        elif isinstance(node, ast.Attribute) and RAW_NVML.match(node.attr):
            found.append(f"line {node.lineno}: .{node.attr}")
        elif isinstance(node, ast.Name) and RAW_NVML.match(node.id):
            found.append(f"line {node.lineno}: {node.id}")
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("getattr", "hasattr", "setattr"):
            found += [f"line {node.lineno}: {node.func.id}(..., {a.value!r})" for a in node.args[1:2]
                      if isinstance(a, ast.Constant) and isinstance(a.value, str)
                      and (RAW_NVML.match(a.value) or a.value.startswith("NVML_"))]
        elif isinstance(node, ast.Constant) and node.value == "pynvml":
            found.append(f"line {node.lineno}: 'pynvml'")
    return found


def test_raw_nvml_calls_are_made_only_in_the_nvml_wrapper():
    """Every NVML call of the product goes through scripts/agent/gpu/nvml.py, which gives each
    field one answer for "no such thing here" (NA) and one error type: a second module calling
    pynvml would be a second set of guards to get wrong. Tests and benchmarks may call it."""
    assert (REPO / NVML_WRAPPER).exists()
    bad = [f"{p.relative_to(REPO)}: {use}" for p, text in _sources().items() if p != REPO / NVML_WRAPPER
           for use in raw_nvml_uses(text)]
    assert not bad, "raw NVML outside the wrapper:\n  " + "\n  ".join(bad)


def test_the_raw_nvml_checker_sees_each_form():
    forms = ["import pynvml", "from pynvml import nvmlInit", "nv.nvmlDeviceGetUUID(h)", "nvmlShutdown()",
             "try:\n    f()\nexcept nv.NVMLError:\n    pass", "getattr(nv, 'nvmlDeviceGetMPSComputeRunningProcesses')",
             "__import__('pynvml')", "hasattr(nv, 'NVML_CLOCK_MEM')", "nv.c_nvmlGpuFabricInfoV_t()"]
    assert [f for f in forms if not raw_nvml_uses(f)] == []
    assert raw_nvml_uses("nv.uuid(h)\n'nvmlDeviceSetComputeMode'\nnvml.NA\n") == []  # the wrapper's calls, a name
