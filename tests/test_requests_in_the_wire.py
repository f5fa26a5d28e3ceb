"""The agent's argv is built only from the wire's requests (scripts/agent/wire/requests.py).

Why a test: a caller that passes a subcommand string or a list of flags builds a second copy of
the argv, whose deadline and flags drift from the request's. Read from the source (ast), as
tests/test_layers.py reads the imports: every call of the transport's entry points in the
local side, and every string that is one of a request's flags. Tests and benchmarks are held
too: their calls (the in-process run_agent among them) send requests; an argv no request can
express goes to the agent's entry point (agent_inproc.run_words) only in RAW_ARGV's tests."""
from __future__ import annotations

import ast
from pathlib import Path

from scripts.agent.wire import call, requests

REPO = Path(__file__).resolve().parent.parent
ENTRY_POINTS = {"call_agent", "agent_argv", "send_agent", "run_agent"}  # (host or python, request, ...)
RAW = "run_words"  # tests/support/agent_inproc.py: the agent's cli.main on words as they are
# The tests that send the agent an argv no request can express, and why none can.
RAW_ARGV = {
    ("tests/agent/teardown/test_pivot_hold.py", "test_hold_flags_come_together"):
        "--hold-s without --hold-phase and --hold-token: requests.Teardown.hold is all three or none",
}
LITERALS = (ast.Constant, ast.List, ast.Tuple, ast.BinOp, ast.JoinedStr, ast.ListComp, ast.Starred)
# Flags other programs of the local side take too, where they appear: the sandbox's fake servers'.
OTHER_PROGRAMS = {"scripts/ops/sandbox_roles.py": {"--gpu", "--gpus"}, "scripts/config/sandbox.py": {"--gpus"}}
REQUEST_FLAGS = {f for r in requests.REQUESTS for f in r.flags} | set(call.SELECTION_FLAGS)


def local_sources() -> dict:
    files = [REPO / "tasks.py", *sorted((REPO / "scripts").rglob("*.py"))]
    paths = {str(p.relative_to(REPO)): p for p in files if "__pycache__" not in p.parts}
    return {name: ast.parse(p.read_text()) for name, p in paths.items() if not name.startswith("scripts/agent/")}


def held_sources() -> dict:
    """tests/ and bench/, but for this file (its examples are what it forbids)."""
    files = [p for d in ("tests", "bench") for p in sorted((REPO / d).rglob("*.py")) if "__pycache__" not in p.parts]
    paths = {str(p.relative_to(REPO)): p for p in files}
    return {name: ast.parse(p.read_text()) for name, p in paths.items() if name != "tests/test_requests_in_the_wire.py"}


def raw_calls(sources: dict) -> list:
    """(path, test) of each call of RAW, by the function it is in; agent_inproc's own is run_agent's."""
    found = []
    for path, tree in sources.items():
        for fn in ast.walk(tree):
            if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                found += [(path, fn.name) for n in ast.walk(fn) if isinstance(n, ast.Call)
                          and getattr(n.func, "id", getattr(n.func, "attr", None)) == RAW]
    return [f for f in found if f != ("tests/support/agent_inproc.py", "run_agent")]


def entry_calls(tree) -> list:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call)
            and getattr(n.func, "id", getattr(n.func, "attr", None)) in ENTRY_POINTS]


def bad_calls(sources: dict) -> list:
    """Calls whose request is a literal (a subcommand string, a list of flags) or that pass args."""
    bad = []
    for path, tree in sources.items():
        for node in entry_calls(tree):
            args = node.args[1:]
            if not args or isinstance(args[0], LITERALS) or any(isinstance(a, LITERALS[1:]) for a in args) or any(
                    k.arg in ("args", "subcommand") for k in node.keywords):
                bad.append(f"{path}:{node.lineno}: {ast.unparse(node)[:90]}")
    return bad


def flag_strings(sources: dict) -> list:
    """Strings that are a request's flag (or start --flag=) outside the wire."""
    bad = []
    for path, tree in sources.items():
        allowed = OTHER_PROGRAMS.get(path, set())
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                flag = node.value.split("=", 1)[0]
                if flag in REQUEST_FLAGS - allowed and (node.value == flag or node.value.startswith(flag + "=")):
                    bad.append(f"{path}:{node.lineno}: {node.value!r}")
    return bad


def test_the_local_side_calls_the_agent_only_with_a_request():
    sources = local_sources()
    assert sum(len(entry_calls(t)) for t in sources.values()) > 20  # the checker sees the callers
    bad = bad_calls(sources)
    assert not bad, "pass a request of scripts/agent/wire/requests.py:\n  " + "\n  ".join(bad)


def test_tests_and_benchmarks_call_the_agent_only_with_a_request():
    sources = held_sources()
    assert sum(len(entry_calls(t)) for t in sources.values()) > 50  # run_agent's callers among them
    bad = bad_calls(sources)
    assert not bad, "pass a request of scripts/agent/wire/requests.py:\n  " + "\n  ".join(bad)


def test_only_the_listed_tests_send_a_raw_argv():
    found = raw_calls(held_sources())
    unlisted = sorted(set(found) - set(RAW_ARGV))
    assert not unlisted, "send a request, or list the test in RAW_ARGV with why:\n  " + "\n  ".join(
        f"{path}::{name}" for path, name in unlisted)
    assert set(RAW_ARGV) <= set(found), "RAW_ARGV lists a test that sends none: take it out"


def test_the_agents_flags_are_spelled_only_in_the_wire():
    bad = flag_strings(local_sources())
    assert not bad, "an agent flag outside scripts/agent/wire/requests.py:\n  " + "\n  ".join(bad)


def test_the_checkers_see_what_they_forbid():
    sources = {"x.py": ast.parse('call_agent(h, "teardown", ["--grace", 1])\nt.call_agent(h, "ping")\n'
                                 'agent_argv(h, "scan", [], n, False)\nsend_agent(h, ["--spec", s], n, how)\n'
                                 'call_agent(h, requests.Ping(), deadline_s=3)\nx = ["--wait=3"]\n')}
    assert len(bad_calls(sources)) == 4
    inproc = {"t.py": ast.parse('run_agent(h, "plan", [])\nrun_agent(h, requests.Plan(), on_progress=f)\n'
                                'def test_x():\n    run_words(["teardown", "--hold-s", "5"])\n')}
    assert len(bad_calls(inproc)) == 1 and raw_calls(inproc) == [("t.py", "test_x")]
    assert sorted(b.split(": ", 1)[1] for b in flag_strings(sources)) == ["'--grace'", "'--spec'", "'--wait=3'"]
