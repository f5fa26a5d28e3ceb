"""Teardown at the floor: what keeps the path from Enter to the first signal short.

The time itself is measured on the GPU machine (bench/gpu_teardown.py, its step breakdown in
bench/RESULTS.md section 5); these tests pin the structure the time rests on, so a later
change cannot quietly put work back in front of the signals:
- before its first SIGTERM the agent has imported only what signalling needs: the health
  pass, the settle window, the verdict, ping, subprocess, shutil and typing come after (they
  then run while the driver releases the targets' memory, 0.3 s and more);
- the agent bundle is built on the feeding thread after the spawn, and a bundle that cannot be
  built stops the call with one clear error and nothing done on the host;
- `--host gpu1` does not load ClusterShell (a bracketed node set still does, and a bad one is
  still one line);
- the /proc holder scan stat()s each fd once (no readlink first) and still tells a device
  from a socket, a pipe and a plain file; an O_PATH handle is no holder, nor is a mapped
  file whose name spells a device's identity;
- what moved after the signals cannot make them unsafe: an agent missing one of those
  modules sends nothing (NOT STARTED); one that cannot load it after the signals still sees
  the targets through and says NOT FREE with the reason (exit 3).
Every process is the test's own (fake device files in its temp dir, its dir as the scope).
"""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from scripts.agent.procs import devices, procscan
from scripts.agent.wire import call, codes, frame, requests
from scripts.config.errors import ConfigError
from scripts.config.hostconfig import build_host
from scripts.config.nodeset import expand
from scripts.reach import bundle, transport
from tests.conftest import REPO
from tests.support import scenario
from tests.support.procs import alive

# Runs the agent as the transport does (package `agent`, -S) and prints, at its first signal,
# every module loaded by then; then lets the teardown go on.
SPY = r"""
import json, sys
sys.path.insert(0, "scripts")
from agent.teardown import targets
real = targets.Targets.signal
def spy(self, items, sig, name):
    if not getattr(spy, "done", False):
        spy.done = True
        sys.stdout.write("LOADED " + json.dumps(sorted(sys.modules)) + "\n")
        sys.stdout.flush()
    return real(self, items, sig, name)
targets.Targets.signal = spy
from agent.cli import main
sys.exit(main(json.loads(sys.argv[1])))
"""

# shutil (with bz2 and lzma) too: plan and gpuinfo import it only to look a program up, and the
# agent's argparse formatter finds the terminal width without it
AFTER_THE_SIGNALS = ("agent.gpu.checkup", "agent.teardown.settle", "agent.teardown.verify", "agent.gpu.health",
                     "agent.gpu.xid", "agent.gpu.mps", "agent.gpu.mig", "agent.status.ping", "subprocess", "typing",
                     "platform", "getpass", "base64", "shutil", "bz2", "lzma")


def host(ps, **keys):
    base = dict(scenario.host_keys(ps), TARGETS=r"sandbox_roles\.py|sglang\.launch_server")
    base.update(keys)
    return dataclasses.replace(build_host("local", base, "test"), fake_gpus=str(ps.memdir))


def test_before_its_first_signal_the_agent_has_loaded_only_what_signalling_needs(ps):
    parent, workers = ps.server(tp=2)
    argv = transport.agent_argv(host(ps), requests.Teardown(grace=5, timeout=10, settle=0, operator="test@floor"),
                                frame.new_nonce(), False)
    words = argv[argv.index(call.STDIN) + 1:]
    out = subprocess.run([sys.executable, "-S", "-c", SPY, json.dumps(words)], cwd=REPO, capture_output=True,
                         text=True, timeout=60)
    loaded_lines = [line for line in out.stdout.splitlines() if line.startswith("LOADED ")]
    assert loaded_lines, out.stderr[-800:]
    loaded = set(json.loads(loaded_lines[0][len("LOADED "):]))
    assert "agent.teardown.run" in loaded and "agent.teardown.targets" in loaded  # the signal came from the agent
    assert sorted(m for m in AFTER_THE_SIGNALS if m in loaded) == []
    assert out.returncode == 0, out.stdout[-800:]  # and the teardown still went all the way: freed
    assert not [p for p in [parent, *workers] if alive(p)]


def test_a_bundle_that_cannot_be_built_stops_the_call_and_nothing_runs(ps, monkeypatch):
    parent, workers = ps.server(tp=1)

    def broken(compiled=False, subcommand=None):
        raise FileNotFoundError("scripts/agent/teardown/run.py is imported by the agent but does not exist")

    monkeypatch.setattr(transport, "agent_stream", broken)
    with pytest.raises(transport.AgentError) as caught:
        transport.call_agent(host(ps), requests.Teardown(grace=1, timeout=5, settle=0))
    text = str(caught.value)
    assert text.startswith("local: could not build the agent bundle: ") and "teardown/run.py" in text
    assert "\n" not in text
    assert all(alive(p) for p in [parent, *workers])  # the agent got no code: nothing was signalled


def test_a_plain_host_name_does_not_load_clustershell():
    probe = ("import sys; from scripts.config.nodeset import expand; "
             "assert expand('gpu1,GPU2') == ['gpu1', 'gpu2']; print('ClusterShell' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr[-500:]
    assert expand("gpu[1-3],big1") == ["gpu1", "gpu2", "gpu3", "big1"]  # a node set still expands
    with pytest.raises(ConfigError) as caught:
        expand("gpu[3-x]")
    assert "bad node set 'gpu[3-x]'" in str(caught.value) and "\n" not in str(caught.value)


def test_scan_tells_a_device_fd_from_sockets_pipes_and_files_with_one_stat_each(tmp_path):
    dev = tmp_path / "nvidia0"
    dev.write_bytes(b"")
    devset = devices.DeviceSet(str(tmp_path / "nvidia*"), fake=True)
    other = tmp_path / "plain.txt"
    other.write_text("x")
    child = subprocess.Popen([sys.executable, "-c", HOLDER, str(dev), str(other)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        held, problem = procscan.held_devices(child.pid, devset, 1, links={})
        assert (held, problem) == ([str(dev)], None)
        quiet = subprocess.Popen([sys.executable, "-c", HOLDER, str(other), str(other)], stdout=subprocess.PIPE,
                                 text=True)
        try:
            assert quiet.stdout.readline().strip() == "ready"
            assert procscan.held_devices(quiet.pid, devset, 1) == ([], None)
        finally:
            quiet.kill()
            quiet.wait()
    finally:
        child.kill()
        child.wait()


# Holds, open: the file argv[1] (the fake device, or a plain file), a plain file, a socket pair,
# a pipe and an eventfd-like anon inode where there is one.
HOLDER = r"""
import os, socket, sys, time
keep = [open(sys.argv[1], "rb"), open(sys.argv[2], "rb"), *socket.socketpair(), *os.pipe()]
if hasattr(os, "eventfd"):
    keep.append(os.eventfd(0))
print("ready", flush=True)
time.sleep(60)
"""


def test_holder_helper_is_what_the_scan_test_thinks(tmp_path):
    """The scan test's fixture holds what it says (so a pass means the scan skipped them right)."""
    plain = tmp_path / "p"
    plain.write_text("x")
    child = subprocess.Popen([sys.executable, "-c", HOLDER, str(plain), str(plain)], stdout=subprocess.PIPE,
                             text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        links = [os.readlink(f"/proc/{child.pid}/fd/{fd}") for fd in os.listdir(f"/proc/{child.pid}/fd")]
        assert any(x.startswith("socket:[") for x in links) and any(x.startswith("pipe:[") for x in links)
        assert links.count(str(plain)) == 2
    finally:
        child.kill()
        child.wait()


O_PATH_HOLDER = ("import os, sys, time; "
                 "fd = os.open(sys.argv[1], os.O_PATH if sys.argv[2] == 'path' else os.O_RDONLY); "
                 "print('ready', flush=True); time.sleep(60)")


def test_an_o_path_handle_on_the_device_is_not_holding_it(tmp_path):
    """An O_PATH fd names a file without opening it (no driver open, no context, no memory),
    and anyone who can see the path can make one: a process keeping one is not a holder (it
    would be planned for a signal). Its fdinfo flags tell it apart from a real open, which
    still counts (stat() through /proc/PID/fd looks the same for both)."""
    dev = tmp_path / "nvidia0"
    dev.write_bytes(b"")
    devset = devices.DeviceSet(str(tmp_path / "nvidia*"), fake=True)
    seen = {}
    for how in ("path", "open"):
        child = subprocess.Popen([sys.executable, "-c", O_PATH_HOLDER, str(dev), how], stdout=subprocess.PIPE,
                                 text=True)
        try:
            assert child.stdout.readline().strip() == "ready"
            seen[how] = procscan.held_devices(child.pid, devset, 1)
        finally:
            child.kill()
            child.wait()
    assert seen == {"path": ([], None), "open": ([str(dev)], None)}


def _stream_of(sources):
    """An agent stream (bundle.agent_stream's form) carrying these sources and no bytecode."""
    script = bundle._STREAM_HEAD + "_CODE_MAGIC = b''\n" + bundle._LOADER
    return zlib.compress(b"\0".join([script.encode(), json.dumps(sources).encode(), b""]))


def _stream_without(ps, sources):
    """The agent's argv for a teardown of ps's server, and a stream carrying `sources`."""
    argv = transport.agent_argv(host(ps), requests.Teardown(grace=2, timeout=5, settle=0, operator="test@floor"),
                                frame.new_nonce(), False)
    return argv, _stream_of(sources)


def test_an_agent_missing_a_module_it_needs_after_the_signals_sends_none(ps):
    parent, workers = ps.server(tp=1)
    sources = bundle.agent_sources()
    del sources["agent.teardown.settle"]  # a bundle that lost a module only the post-signal steps import
    argv, stream = _stream_without(ps, sources)
    out = subprocess.run(argv, input=stream, capture_output=True, timeout=60)
    assert out.returncode == codes.EXIT_UNREACHABLE, out.stderr.decode()[-500:]
    assert "the agent lacks module(s) settle (a broken bundle)" in out.stdout.decode()
    assert all(alive(p) for p in [parent, *workers])


def test_a_post_signal_module_that_cannot_load_still_sees_the_targets_through(ps):
    parent, workers = ps.server(tp=1)
    sources = bundle.agent_sources()
    sources["agent.teardown.settle"] = "def watch(:\n"  # present, but not Python this host can compile
    argv, stream = _stream_without(ps, sources)
    out = subprocess.run(argv, input=stream, capture_output=True, timeout=60)
    assert out.returncode == codes.EXIT_UNREACHABLE, out.stderr.decode()[-500:]
    text = out.stdout.decode()
    assert "not verified" in text and "SyntaxError" in text
    assert not [p for p in [parent, *workers] if alive(p)]  # signalled, and seen through to the end
    last = json.loads((Path(os.environ["GPU_PIVOT_RUN_DIR"]) / "last.json").read_text())  # conftest's run dir
    assert last["state"] == "finished" and last["verdict"] == "not verified" and "SyntaxError" in last["error"]
    assert {a["pid"] for a in last["actions"] if a["signal"] == "SIGTERM"} >= {parent, *workers}


MAPPER = ("import mmap, sys, time; f = open(sys.argv[1], 'rb'); m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ); "
          "f.close(); print('mapped', flush=True); time.sleep(60)")


def test_a_mapped_file_whose_name_spells_a_devices_identity_is_not_a_holder(tmp_path):
    """/proc/PID/maps is read for the device's MAJ:MIN and inode in their own columns only:
    any user can name a file '... 00:05 412 ...', and whoever mapped it was called a GPU
    holder (a default target). A real mapping of the device counts."""
    dev = tmp_path / "nvidia0"
    dev.write_bytes(b"x" * 4096)
    devset = devices.DeviceSet(str(tmp_path / "nvidia*"), fake=True)
    st = dev.stat()
    bait = tmp_path / ("innocent" + procscan._needle((st.st_dev, st.st_ino)).decode() + "data")
    bait.write_bytes(b"x" * 4096)
    needles = {procscan._needle(k): n for k, n in devset.inode_keys().items()}
    seen = {}
    for name, path in (("bait", bait), ("device", dev)):
        child = subprocess.Popen([sys.executable, "-c", MAPPER, str(path)], stdout=subprocess.PIPE, text=True)
        try:
            assert child.stdout.readline().strip() == "mapped"
            seen[name] = procscan.mapped_by_identity(child.pid, needles)
        finally:
            child.kill()
            child.wait()
    assert seen == {"bait": [], "device": [str(dev)]}


def test_the_operator_reads_what_happened_when_the_post_signal_steps_could_not_load(ps, monkeypatch):
    """Through the CLI's own transport and report: NOT FREE with the reason, the signals listed,
    exit 3 (the agent failed there), not a contract error about missing fields."""
    from scripts.views import teardown as teardown_view

    parent, workers = ps.server(tp=1)
    sources = bundle.agent_sources()
    sources["agent.teardown.settle"] = "def watch(:\n"
    monkeypatch.setattr(transport, "agent_stream", lambda compiled=False, subcommand=None: _stream_of(sources))
    result = transport.call_agent(host(ps), requests.Teardown(grace=2, timeout=5, settle=0))
    assert result.code == codes.EXIT_UNREACHABLE
    text = teardown_view.report("local", result)
    assert "NOT FREE" in text and "SyntaxError" in text and "SIGTERM" in text, text
    assert not [p for p in [parent, *workers] if alive(p)]


def test_the_operator_reads_not_started_when_the_agent_is_incomplete(ps, monkeypatch):
    from scripts.views import teardown as teardown_view

    parent, workers = ps.server(tp=1)
    sources = bundle.agent_sources()
    del sources["agent.teardown.verify"]
    monkeypatch.setattr(transport, "agent_stream", lambda compiled=False, subcommand=None: _stream_of(sources))
    result = transport.call_agent(host(ps), requests.Teardown(grace=2, timeout=5, settle=0))
    assert result.code == codes.EXIT_UNREACHABLE
    assert teardown_view.report("local", result) == (
        "== local: NOT STARTED: the agent lacks module(s) verify (a broken bundle) (nothing was signalled)")
    assert all(alive(p) for p in [parent, *workers])


def test_the_agents_help_is_argparses_own_at_the_terminal_width_without_shutil(monkeypatch):
    import argparse

    from scripts.agent import cli

    def teardown_help(formatter):
        parser = cli.build_parser("teardown")
        sub = parser._subparsers._group_actions[0].choices["teardown"]
        sub.formatter_class = formatter
        return sub.format_help()

    for columns in ("52", "131"):
        monkeypatch.setenv("COLUMNS", columns)
        ours = teardown_help(cli.HelpFormatter)
        assert ours == teardown_help(argparse.HelpFormatter)  # the stock one asks shutil for the width
        assert max(len(line) for line in ours.splitlines()) > int(columns) - 20  # wrapped at that width
    monkeypatch.setenv("COLUMNS", "not-a-number")
    assert cli.terminal_columns() >= 1  # a bad COLUMNS falls back to the terminal, else 80
