"""Each call ships what its subcommand imports, nothing more and nothing missing: the bundle
is built per subcommand from the agent's import graph (cli.py's imports and the one module
call.SUBCOMMAND_MODULES names for it), so a status or a verify carries no teardown or phase
code. A module the graph misses would fail on the host only, so every subcommand is run
here from its own bundle in a fresh interpreter, as the transport starts the agent (`-S -c
BOOT`, a working directory holding nothing of ours): each of its modules imports, its
--help builds, and the ones that can run against this test's own fake GPUs run for real.
"""
from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
import sys
import zlib

import pytest

from scripts.agent import cli
from scripts.agent.wire import call, codes, frame, requests
from scripts.config.hostconfig import build_host
from scripts.reach import bundle, transport
from tests.support import scenario
from tests.support.procs import alive

# The modules only a teardown or a phase runs: signalling, the plan, the settle window, the
# host lock, the phases' HTTP. None of them may ride along with a status or a verify. (The audit
# log does: every call first thaws what a teardown that died left frozen, and logs it: state/frozen.py.)
TEARDOWN_AND_PHASES = re.compile(r"agent\.(teardown\.(run|plan|early|settle|hostlock|units|forkwatch|freeze)"
                                 r"|phases(\..*)?|procs\.wrappers)$")


def _run(argv_words: list, stream: bytes, cwd, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *call.STREAM_FLAGS, call.STDIN, *argv_words], input=stream,
                          cwd=cwd, capture_output=True, timeout=timeout)


def _host(ps):
    keys = dict(scenario.host_keys(ps), TARGETS=r"sandbox_roles\.py|sglang\.launch_server")
    return dataclasses.replace(build_host("local", keys, "test"), fake_gpus=str(ps.memdir))


def test_every_subcommand_has_one_module_to_run_it():
    assert list(call.SUBCOMMAND_MODULES) == list(call.SUBCOMMANDS)
    for name, (module, _) in call.SUBCOMMAND_MODULES.items():
        assert bundle.module_path(module).exists(), name


def test_a_subcommands_bundle_is_cli_and_its_own_modules_import_closure():
    """Exactly: the union over subcommands is the whole agent (tests/agent/wire/test_wire.py checks
    that is every file in scripts/agent), each subcommand's is a part of it holding cli.py's
    imports and its own module, and the Ansible payload (any subcommand) carries them all."""
    whole = set(bundle.agent_modules())
    per = {name: set(bundle.agent_modules(name)) for name in call.SUBCOMMAND_MODULES}
    assert set().union(*per.values()) == whole
    common = set.intersection(*per.values())
    assert {"cli", "wire.call", "wire.codes", "wire.frame"} <= common
    for name, (module, _) in call.SUBCOMMAND_MODULES.items():
        assert module in per[name]
        assert per[name] < whole, f"{name} ships every module"
    assert set(json.loads(zlib.decompress(bundle.agent_stream(subcommand="scan")).split(bytes(1))[1])) == \
        {f"agent.{m}" for m in per["scan"]} | {"agent"}
    with pytest.raises(ValueError, match="'bogus'"):
        bundle.agent_modules("bogus")


@pytest.mark.parametrize("name", ["scan", "verify", "ping"])
def test_status_and_verify_ship_no_teardown_or_phase_code(name):
    shipped = bundle.agent_sources(subcommand=name)
    assert sorted(m for m in shipped if TEARDOWN_AND_PHASES.match(m)) == []
    assert len(bundle.agent_stream(subcommand=name)) < 0.7 * len(bundle.agent_stream())
    assert TEARDOWN_AND_PHASES.match("agent.teardown.run") and TEARDOWN_AND_PHASES.match("agent.phases.drain")


def test_only_cli_imports_an_agent_module_by_name():
    """The graph is read from `from . import` statements; a module imported by name would be
    missed. cli.py is the one place that does, and only from call.SUBCOMMAND_MODULES."""
    by_name = re.compile(r"import_module\(|__import__\(|\bimport agent\b|\bfrom agent\b")
    users = sorted(n for n, src in bundle.agent_sources(stripped=False).items() if by_name.search(src))
    assert users == ["agent.cli"]
    assert "importlib.import_module(\".\" + module, __package__)" in bundle.agent_sources(stripped=False)["agent.cli"]


@pytest.mark.parametrize("name", list(call.SUBCOMMAND_MODULES))
def test_every_module_of_a_subcommands_bundle_imports_from_that_bundle_alone(name, tmp_path):
    """In a fresh interpreter with only this subcommand's bundle: every module it ships
    imports (a top-level import the graph missed fails here), and the subcommand's parser
    builds (its module and class found through cli.module_for, as a call finds them)."""
    script, sources, _ = zlib.decompress(bundle.agent_stream(subcommand=name)).split(bytes(1), 2)
    loader = script.decode().split("from agent.cli import main")[0]
    check = loader + ("import importlib\n"
                      "for _n in sorted(_SOURCES):\n    importlib.import_module(_n)\n"
                      "from agent.cli import main\nsys.exit(main())\n")
    stream = zlib.compress(b"\0".join([check.encode(), sources, b""]))
    out = _run([name, "--help"], stream, tmp_path)
    assert out.returncode == 0, out.stderr.decode()[-800:]
    assert f"usage: gpuagent {name}" in out.stdout.decode()


@pytest.mark.parametrize("name", ["ping", "scan", "verify", "plan", "teardown"])
def test_each_subcommand_runs_from_its_own_bundle(name, ps):
    """The real run, on this test's own fake GPUs and holders (its temp dir the scope): the
    modules imported inside functions are there too. The teardown stops the test's server."""
    parent, workers = ps.server(tp=1)
    request = {"ping": requests.Ping(), "scan": requests.Scan(), "verify": requests.Verify(wait=0),
               "plan": requests.Plan(), "teardown": requests.Teardown(grace=2, timeout=5, settle=0,
                                                                      operator="test@bundle")}[name]
    nonce = frame.new_nonce()
    argv = transport.agent_argv(_host(ps), request, nonce, False)
    out = _run(argv[argv.index(call.STDIN) + 1:], bundle.agent_stream(compiled=True, subcommand=name), ps.base)
    doc = json.loads(frame.extract(out.stdout.decode(), nonce))
    assert codes.AGENT_ERROR not in doc, doc[codes.AGENT_ERROR]
    assert "No module named" not in out.stderr.decode(), out.stderr.decode()[-800:]
    assert doc["command"] == name
    if name in ("scan", "verify", "plan"):  # the test's server holds a fake GPU: seen, and left running
        assert parent in [h["pid"] for h in doc["holders"]] or parent in [t["pid"] for t in doc.get("targets", [])]
        assert alive(parent)
    if name == "teardown":
        assert out.returncode == codes.EXIT_OK, doc
        assert not [p for p in [parent, *workers] if alive(p)]


def test_the_transport_sends_the_bundle_of_the_subcommand_it_runs(ps, monkeypatch):
    asked = []
    real = transport.agent_stream

    def spy(compiled=False, subcommand=None):
        asked.append(subcommand)
        return real(compiled=compiled, subcommand=subcommand)

    monkeypatch.setattr(transport, "agent_stream", spy)
    result = transport.call_agent(_host(ps), requests.Scan())
    assert result.code in (codes.EXIT_OK, codes.EXIT_NOT_FREE)
    assert asked == ["scan"]


def test_a_subcommand_put_in_the_table_directly_still_runs():
    """Tests replace a subcommand by a class with run(); the table's (module, class) names
    are imported by name, relative to the agent package wherever it is loaded from."""
    assert cli.module_for("smoke").__name__ == "Smoke"
    assert cli.module_for("scan").__name__.endswith("agent.status.scan")


@pytest.fixture
def agent_copy(tmp_path, monkeypatch):
    """A copy of the agent the bundle reads instead of scripts/agent (its caches cleared on
    both sides: they hold what they read from the folder)."""
    agent = tmp_path / "agent"
    shutil.copytree(bundle.AGENT_DIR, agent, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(bundle, "AGENT_DIR", agent)
    bundle._index.cache_clear()
    bundle.agent_stream.cache_clear()
    yield agent
    bundle._index.cache_clear()
    bundle.agent_stream.cache_clear()


def test_a_kept_stream_is_used_only_for_the_very_tree_it_was_made_from(agent_copy, monkeypatch):
    first = bundle.agent_stream(subcommand="ping")
    assert [p.name.split(".")[0] for p in (agent_copy / "__pycache__").glob("stream-*.z")] == ["stream-ping"]
    real = bundle._build_stream

    def not_again(compiled, subcommand):
        raise AssertionError("built again for the same tree")

    monkeypatch.setattr(bundle, "_build_stream", not_again)
    bundle.agent_stream.cache_clear()
    assert bundle.agent_stream(subcommand="ping") == first  # read back, not built
    ping = agent_copy / "status" / "ping.py"
    ping.write_text(ping.read_text() + "MARK_OF_THIS_TEST = 1\n")  # another size, another mtime
    monkeypatch.setattr(bundle, "_build_stream", real)
    bundle.agent_stream.cache_clear()
    again = bundle.agent_stream(subcommand="ping")
    assert b"MARK_OF_THIS_TEST" in zlib.decompress(again) and b"MARK_OF_THIS_TEST" not in zlib.decompress(first)
    before = bundle.tree_stamp()
    (agent_copy / "procs" / "scan.py").write_text("")  # any agent file: it may change what ping reaches
    assert bundle.tree_stamp() != before
