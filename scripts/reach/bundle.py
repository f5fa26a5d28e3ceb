"""Bundle the agent package into one script for `python3 -` on the host.

Why: one ssh connection per call and nothing installed on the host. The payload holds the
sources of the agent's modules in a dict and a tiny import hook that serves them as the
package `agent` and its subpackages (`agent.procs`, `agent.teardown`, ...), so the agent
stays small modules in folders here and one stream on the wire. The
dict travels zlib-compressed (base64 text, about a third of the plain size): every call
sends it, and the sources themselves are unchanged, so a traceback on the host still
names the right file and line. A module is compiled on the host when it is first
imported, so a subcommand pays only for the modules it uses (cli.py imports them late).

The whole account: docs/design-notes.md (scripts/reach/bundle.py)."""
from __future__ import annotations

import base64
import importlib.util
import json
import marshal
import os
import re
import zlib
from functools import lru_cache
from pathlib import Path

from ..agent.wire.call import SUBCOMMAND_MODULES

AGENT_DIR = Path(__file__).resolve().parent.parent / "agent"
ENTRY = "cli"

_LOADER = r'''
import sys, marshal, importlib.util
if sys.argv[:2] == ["-c", "-"]:  # `python3 -S -c BOOT - SUBCOMMAND ...` (agent_stream): the same argv as `python3 -`
    del sys.argv[1]
_COMPILED = marshal.loads(_CODE) if _CODE and _CODE_MAGIC == importlib.util.MAGIC_NUMBER else {}
_PACKAGES = {n.rpartition(".")[0] + "." for n in _SOURCES}  # "agent.procs." where agent.procs.x ships
class _AgentSource:  # a meta path finder and loader by duck typing: importlib.abc costs importlib.resources
    def find_spec(self, name, path=None, target=None):
        if name in _SOURCES:
            return importlib.util.spec_from_loader(name, self, is_package=name + "." in _PACKAGES)
        return None
    def create_module(self, spec):
        return None
    def exec_module(self, module):
        name = module.__name__
        file = name.replace(".", "/") + ("/__init__.py" if name + "." in _PACKAGES else ".py")
        code = marshal.loads(_COMPILED[name]) if name in _COMPILED else compile(
            _SOURCES[name], "<gpu-pivot>/" + file, "exec")
        exec(code, module.__dict__)
sys.meta_path.insert(0, _AgentSource())
from agent.cli import main
_code = main()
try:  # the result is out: leave without Python's teardown of the agent's modules (~10-20 ms the CLI waits for)
    sys.stdout.flush()
    sys.stderr.flush()
except Exception:
    sys.exit(_code)
import os
os._exit(_code)
'''


# anywhere in a line (after `;` or `:` too: `if x: from . import y`). It starts with the literal
# `from` (no `^` or `\b` before it) so re finds candidates by a fast search: ~1 ms for the agent,
# where an anchored pattern cost ~10-25 ms of every call.
# Patterns as text, compiled by re (and cached there) when a stream is built: a call that reads
# the kept stream back (kept_stream) never compiles them.
_RELATIVE_IMPORT = r"from[ \t]+(\.+)([\w.]*)[ \t]+import[ \t]+(\([^)]*\)|[^\n;]*)"
_COMMENT = r"#[^\n]*"


def imported_modules(name: str, source: str) -> set:
    """The agent modules and packages one module (`name`, dotted within the agent, "" for the
    package itself) imports by relative import (`from . import a`, `from ..procs import b`,
    `from .c import d`), wherever the statement is (top level, a function, a try block). A
    line inside a string that reads like one counts too: at worst a module ships that is not
    needed. Names are dotted within the agent ("procs.procfs"), each with its packages."""
    modules, packages = _index()
    is_package = name in packages
    here = name.split(".") if name else []
    package = here if is_package else here[:-1]
    found = set()
    for dots, module, names in re.findall(_RELATIVE_IMPORT, source):
        base = package[: len(package) - (len(dots) - 1)]
        target = base + (module.split(".") if module else [])
        found.update(_with_packages(target))
        for item in re.sub(_COMMENT, "", names).strip("()").replace("\n", ",").split(","):
            leaf = item.split(" as ")[0].strip()
            if leaf and ".".join(target + [leaf]) in modules:
                found.update(_with_packages(target + [leaf]))
    found.discard("")
    return found


@lru_cache(maxsize=1)
def _index() -> tuple:
    """({every agent module and package}, {the packages}), dotted within the agent ("" the
    agent itself): one walk of the folder, where a stat per imported name cost ~10 ms a call."""
    modules, packages = set(), {""}
    for folder, dirs, files in os.walk(AGENT_DIR):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        rel = os.path.relpath(folder, AGENT_DIR)
        prefix = "" if rel == "." else rel.replace(os.sep, ".")
        for f in files:
            if not f.endswith(".py"):
                continue
            if f == "__init__.py":
                packages.add(prefix)
                modules.add(prefix)
            else:
                modules.add(f"{prefix}.{f[:-3]}" if prefix else f[:-3])
    modules.discard("")
    return modules, packages


def _with_packages(parts: list) -> set:
    """A module and every package above it inside the agent (each must ship for it to import)."""
    return {".".join(parts[:i]) for i in range(1, len(parts) + 1)}


def module_path(name: str) -> Path:
    """The file of an agent module or package, `name` dotted within the agent ("" the agent)."""
    path = AGENT_DIR.joinpath(*name.split(".")) if name else AGENT_DIR
    return path / "__init__.py" if name in _index()[1] else path.with_suffix(".py")


def agent_modules(subcommand: str | None = None) -> list:
    """The agent modules and packages a call of `subcommand` can import (every subcommand's
    with None): those reachable by import from cli.py and from the subcommand's own module,
    sorted (names dotted within the agent, without `agent.`)."""
    if subcommand is not None and subcommand not in SUBCOMMAND_MODULES:
        raise ValueError(f"unknown agent subcommand {subcommand!r}")
    runs = [SUBCOMMAND_MODULES[subcommand]] if subcommand is not None else SUBCOMMAND_MODULES.values()
    seen: set = set()
    todo = [ENTRY] + [module for module, _ in runs]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        path = module_path(name)
        if not path.exists():
            raise FileNotFoundError(f"scripts/agent/{name.replace('.', '/')}.py is imported by the agent "
                                    "but does not exist")
        seen.add(name)
        todo.extend((imported_modules(name, path.read_text()) | _with_packages(name.split(".")[:-1])) - seen)
    return sorted(seen)


def agent_sources(stripped: bool = True, subcommand: str | None = None) -> dict:
    """{module: source} of what ships for `subcommand` (agent_modules; dotted names: "agent",
    "agent.procs", "agent.procs.procfs"); `stripped`: docstrings and comment lines out
    (strip_source, kept beside Python's own cache: shipped_source), as every call sends them."""
    read = shipped_source if stripped else (lambda path: path.read_text())
    sources = {"agent": read(module_path(""))}
    for name in agent_modules(subcommand):
        sources[f"agent.{name}"] = read(module_path(name))
    return sources


def shipped_source(path: Path) -> str:
    """strip_source of one module, from __pycache__ when made there for this very file (its
    mtime and size in the first line), else made now and kept there. Why: stripping the ~40
    modules costs ~15 ms of every `invoke` call, before the agent starts; reading the kept
    copies costs what reading the sources does. Kept as Python keeps its .pyc (the same
    directory, the same trust; stamped with the source's and this file's mtime and size); a
    copy that cannot be written is only made again next time."""
    st, me = path.stat(), Path(__file__).stat()  # this file's too: a new strip_source makes new copies
    stamp = f"# {st.st_mtime_ns} {st.st_size} {me.st_mtime_ns}\n".encode()
    kept = path.parent / "__pycache__" / f"{path.stem}.shipped.py"
    return _kept(kept, stamp, lambda: strip_source(path.read_text()).encode()).decode()


def _kept(kept: Path, stamp: bytes, build) -> bytes:
    """build()'s bytes, read from `kept` when it starts with `stamp` (made from the very files
    the stamp names), else made now and kept there under the stamp (written aside, then renamed
    in place: a reader never sees half a copy; one that cannot be written is made again next time)."""
    try:
        data = kept.read_bytes()
        if data.startswith(stamp):
            return data[len(stamp):]
    except OSError:
        pass
    data = build()
    try:
        kept.parent.mkdir(exist_ok=True)
        part = kept.with_name(f"{kept.name}.{os.getpid()}")
        part.write_bytes(stamp + data)
        os.replace(part, kept)
    except OSError:
        pass
    return data


_QUOTES = ('"""', "'''")


_HEADER = r"^(?:async[ \t]+def|def|class)[ \t]"


def strip_source(text: str) -> str:
    """The source without its docstrings and comment lines, every line where it was.

    Why: every call sends the agent (about a third of it was docstrings and comments: the why
    that is for people reading here, not for the host), and a traceback on the host must
    still name the right line, so each removed line is left as an empty line. A docstring is
    a triple-quoted string that starts a line at the top of the module or right after a def's
    or a class's header (its lines up to the one ending in `:`); it keeps its first line only
    (agent/cli.py shows a module's or a class's as a subcommand's help). A comment line is
    one whose first character past its indent is `#`, outside a string that goes on over
    lines (one whose line holds an odd number of triple quotes) and not continued from the
    line before (a backslash); a comment after code goes too where no quote comes before its
    `#`. tests/reach/test_bundle_strip.py proves, module by module, that the code is the same as
    the original's with its docstrings removed (ast), so a string that only looks like these
    is caught there, not on a host."""
    lines = text.split("\n")
    out: list = []
    doc_may_follow = True  # at the top of the module, and after a def's or a class's header
    in_header = False
    i = 0
    while i < len(lines):
        line = lines[i]
        body = line.lstrip()
        quote = body[:3]
        if quote in _QUOTES and doc_may_follow:
            end = i if quote in body[3:] else next((j for j in range(i + 1, len(lines)) if quote in lines[j]), None)
            if end is not None and not lines[end].split(quote)[-1].strip():
                indent = line[:len(line) - len(body)]
                doc = "\n".join([body[3:]] + lines[i + 1:end + 1]).split(quote)[0]
                first = next((x.strip() for x in doc.splitlines() if x.strip()), "")
                out.append(indent + (repr(first) if first and "\\" not in first else '""'))
                out.extend([""] * (end - i))
                doc_may_follow = False
                i = end + 1
                continue
        if body.startswith("#"):
            out.append("")
            i += 1
            continue
        code, sharp, _ = line.partition("#")
        if sharp and "'" not in code and '"' not in code:  # a comment after code with no string before it
            line = code.rstrip()
            body = line.lstrip()
        out.append(line)
        if body:
            in_header = in_header or bool(re.match(_HEADER, body))
            doc_may_follow = in_header and body.endswith(":")
            in_header = in_header and not doc_may_follow
        i += 1
        opened = next((q for q in _QUOTES if line.count(q) % 2), None)
        continued = line.endswith("\\")
        while (opened or continued) and i < len(lines):  # a string or a line that goes on: kept as it is
            out.append(lines[i])
            opened = (None if lines[i].count(opened) % 2 else opened) if opened else \
                next((q for q in _QUOTES if lines[i].count(q) % 2), None)
            continued = lines[i].endswith("\\")
            i += 1
    return "\n".join(out)


def cached_code(path: Path) -> bytes | None:
    """The marshalled code of one module from Python's own __pycache__ (compiled there when
    missing or stale, as an import would), or None where it cannot be had. Accepted only as
    an import accepts it: this interpreter's magic number, a timestamp pyc, and the source's
    mtime and size in its header."""
    pyc = Path(importlib.util.cache_from_source(str(path)))
    st = path.stat()
    header = importlib.util.MAGIC_NUMBER + (0).to_bytes(4, "little") + \
        (int(st.st_mtime) & 0xFFFFFFFF).to_bytes(4, "little") + (st.st_size & 0xFFFFFFFF).to_bytes(4, "little")
    for attempt in range(2):
        try:
            data = pyc.read_bytes()
            if data[:16] == header:
                return data[16:]
        except OSError:
            pass
        if attempt == 0:
            import py_compile  # only when Python's own cache lacks it: not on a call that reads the kept stream

            try:
                py_compile.compile(str(path), cfile=str(pyc), doraise=True,
                                   invalidation_mode=py_compile.PycInvalidationMode.TIMESTAMP)
            except (OSError, py_compile.PyCompileError):
                return None
    return None


def compiled_code(names) -> bytes:
    """marshal of {module: this interpreter's bytecode} for the modules that have it cached."""
    code = {}
    for name in names:
        data = cached_code(module_path(name[len("agent."):] if name != "agent" else ""))
        if data is not None:
            code[name] = data
    return marshal.dumps(code) if code else b""


@lru_cache(maxsize=64)
def agent_payload(compiled: bool = False, subcommand: str | None = None) -> bytes:
    """The script for `python3 -` (stdin is the script): Ansible's task and direct runs.
    Cached: it is the same for every host of a run. `compiled`: see agent_stream();
    `subcommand`: only what that subcommand imports (agent_modules), else every one's."""
    sources = agent_sources(subcommand=subcommand)
    blob = base64.b64encode(zlib.compress(json.dumps(sources, sort_keys=True).encode(), 6)).decode()
    code = compiled_code(sources) if compiled else b""
    code_blob = base64.b64encode(zlib.compress(code, 6)).decode() if code else ""
    return ("# gpu-pivot agent (bundled: its modules' sources, zlib-compressed)\n"
            "import sys\nsys.path[:] = [p for p in sys.path if p]  # never the working directory: call.BOOT\n"
            "import binascii, json, zlib\n"
            f"_SOURCES = json.loads(zlib.decompress(binascii.a2b_base64({blob!r})))\n"
            f"_CODE_MAGIC = {importlib.util.MAGIC_NUMBER!r}\n"
            f"_CODE = zlib.decompress(binascii.a2b_base64({code_blob!r})) if {bool(code)!r} else b''\n"
            + _LOADER).encode()


_STREAM_HEAD = """# gpu-pivot agent (stream): _D is what call.BOOT read from stdin and decompressed
import json
_I = _D.index(bytes(1))
_J = _D.index(bytes(1), _I + 1)
_SOURCES = json.loads(_D[_I + 1:_J].decode())
_CODE = _D[_J + 1:]
"""


@lru_cache(maxsize=64)
def agent_stream(compiled: bool = False, subcommand: str | None = None) -> bytes:
    """What the transport writes to the agent's stdin, for `python3 -S -c call.BOOT - ...`
    (call.agent_argv(stream=True)): one zlib stream of the loader script, NUL, the
    sources as JSON, NUL, and with `compiled` the marshalled bytecode of this interpreter.

    Why not the script on stdin: Python parses a script read from stdin at ~0.25 ms per KB
    (~30 ms for the bundle) where raw bytes are read at once, and one compression of plain
    text beats base64 inside it. Why bytecode (the local host, whose Python is usually this
    one): compiling the ~30 modules of a teardown costs ~50 ms on every call, before the
    first signal; the host uses it only when its Python has the same magic number, else it
    compiles the sources as usual. Not for ssh hosts: their Python is often another, and the
    bytes would travel for nothing. `subcommand`: only what that subcommand imports
    (agent_modules), else every subcommand's.
    """
    name = f"{subcommand or 'all'}{'-compiled' if compiled else ''}"
    return kept_stream(name, lambda: _build_stream(compiled, subcommand))


def _build_stream(compiled: bool, subcommand: str | None) -> bytes:
    sources = agent_sources(subcommand=subcommand)
    script = _STREAM_HEAD + f"_CODE_MAGIC = {importlib.util.MAGIC_NUMBER!r}\n" + _LOADER
    body = b"\0".join([script.encode(), json.dumps(sources, sort_keys=True).encode(),
                       compiled_code(sources) if compiled else b""])
    return zlib.compress(body, 0 if compiled else 6)  # compiled: this machine's pipe, where size costs nothing


def kept_stream(name: str, build) -> bytes:
    """A stream as build() makes it, kept in the agent's __pycache__ as `stream-NAME.MAGIC.z` under
    tree_stamp(): used only while every agent file, this file and the interpreter are the
    very ones it was made from, else made again and kept. Why: building it (finding the
    modules, reading the kept sources and bytecode, JSON, zlib) costs ~20 ms of CPU on every
    call, on a feeding thread that shares the CPUs with the agent's start; reading it back
    costs ~1 ms. Kept as Python keeps its .pyc (the same directory, the same trust); a copy
    that cannot be written is only made again next time."""
    kept = AGENT_DIR / "__pycache__" / f"stream-{name}.{importlib.util.MAGIC_NUMBER.hex()}.z"  # one per Python
    return _kept(kept, tree_stamp(), build)


def tree_stamp() -> bytes:
    """The text naming what a built stream depends on: the interpreter's magic number (the
    bytecode), and the path, mtime and size of this file and of every agent module (what
    ships, what strip_source keeps, which modules a subcommand reaches)."""
    parts = [importlib.util.MAGIC_NUMBER.hex()]
    for folder, dirs, files in os.walk(AGENT_DIR):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        parts += [os.path.join(folder, f) for f in sorted(files) if f.endswith(".py")]
    stats = [(path, os.stat(path)) for path in [__file__] + parts[1:]]
    parts += [f"{path} {st.st_mtime_ns} {st.st_size}" for path, st in stats]
    return ("\n".join(parts) + "\n\0").encode()  # compared whole (no hash to import): a NUL ends it, no path has one
