"""Targets are programs, not text: what a pattern may and may not name.

The real-process test starts, next to a real target server, processes that only MENTION a
server in their command line (a log tail, a grep, a script's flag, a tmux server whose
session is named `torchrun` with a job in its pane) and checks the default patterns plan
and tear down the server alone. Every process is scoped to the test's temp dir
(`--scope`), so nothing else on the machine can be planned.
"""
from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys

import pytest
from hypothesis import given, settings, strategies as st

from scripts.agent.policy import program
from scripts.agent.wire import requests
from scripts.config.hostconfig import build_host
from tests.support import scenario
from tests.support.agent_inproc import run_agent
from tests.support.procs import ProcessSet, alive, wait_for

TARGETS = ("sglang\\.launch_server", "sglang serve", "sglang::.*", "vllm serve", "vllm\\.entrypoints", "VLLM::.*",
           "torchrun")


def proc(*argv, comm=None):
    return {"pid": 10, "argv": list(argv), "comm": comm or os.path.basename(argv[0])[:15]}


@pytest.mark.parametrize("argv,comm,why", [
    (["python3", "-m", "sglang.launch_server", "--model", "m"], "python3", "runs module sglang.launch_server"),
    (["/venv/bin/python3.11", "-u", "-X", "dev", "-m", "sglang.launch_server"], "python3.11", "runs module"),
    (["sglang::scheduler_TP0"], "sglang::schedul", "is titled"),
    (["VLLM::EngineCore"], "VLLM::EngineCor", "is titled"),
    (["/venv/bin/python3", "/venv/bin/vllm", "serve", "meta/llama"], "vllm", "runs vllm serve"),
    (["/venv/bin/vllm", "serve", "meta/llama"], "vllm", "runs 'vllm serve'"),
    (["python", "-m", "vllm.entrypoints.openai.api_server"], "python", "runs module vllm.entrypoints"),
    (["/usr/bin/python3", "/venv/bin/torchrun", "--nproc-per-node", "8", "train.py"], "torchrun", "torchrun"),
    (["torchrun", "--nproc-per-node", "8", "train.py"], "torchrun", "is program torchrun"),
])
def test_servers_are_named_by_their_program(argv, comm, why):
    hit = program.match(proc(*argv, comm=comm), TARGETS)
    assert hit is not None, argv
    assert why in hit[1]


@pytest.mark.parametrize("argv,comm", [
    (["tail", "-f", "/var/log/sglang.launch_server.log"], "tail"),
    (["grep", "vllm serve", "notes.txt"], "grep"),
    (["grep", "-r", "sglang::scheduler", "."], "grep"),
    (["python3", "/home/u/tools/logscan.py", "--grep", "sglang::scheduler"], "python3"),
    (["tmux", "new-session", "-d", "-s", "torchrun"], "tmux: server"),
    (["bash", "-c", "python3 -m sglang.launch_server --port 30000"], "bash"),
    (["less", "torchrun.log"], "less"),
    (["python3", "-m", "sglang.bench_serving", "--backend", "sglang"], "python3"),
    (["vim", "vllm serve.md"], "vim"),
    (["python3", "-c", "import sglang.launch_server"], "python3"),
])
def test_mentions_in_arguments_are_not_targets(argv, comm):
    assert program.match(proc(*argv, comm=comm), TARGETS) is None, argv


def test_interpreter_name_alone_names_only_the_bare_interpreter():
    assert program.match(proc("python3", "/x/train.py"), ["python3"]) is None
    assert program.match(proc("python3"), ["python3"]) is not None
    assert program.match(proc("python3", "/x/launch_server.py", "--port", "1"), ["launch_server\\.py"])[1] == \
        "runs script /x/launch_server.py"


@pytest.mark.parametrize("pattern", ["", ".*", "x*", "^", "|sglang", "(?:)"])
def test_agent_refuses_patterns_matching_the_empty_string(pattern, tmp_path):
    ps = ProcessSet(tmp_path)
    for flag in ("--match", "--target", "--protect"):
        out = subprocess.run([sys.executable, "scripts/gpuagent.py", "plan", "--json", "--fake-devices", "--devices",
                              ps.glob, flag, pattern], capture_output=True, text=True, timeout=30,
                             cwd=scenario.__file__.rsplit("/tests/", 1)[0])
        assert out.returncode == 2, out.stdout + out.stderr
        assert "matches the empty string" in out.stdout and repr(pattern) in out.stdout




def _tmux_pids(sock):
    out = subprocess.run(["tmux", "-S", str(sock), "list-panes", "-a", "-F", "#{pid}"], capture_output=True, text=True)
    server = subprocess.run(["tmux", "-S", str(sock), "display-message", "-p", "#{pid}"],
                            capture_output=True, text=True)
    return int(server.stdout.strip()), [int(p) for p in out.stdout.split()]


def test_default_patterns_spare_log_tails_greps_flags_and_multiplexers(ps, tmp_path):
    server = scenario._server(ps, "--tp", "1", "--memdir", str(ps.memdir))
    log = tmp_path / "sglang.launch_server.log"
    log.write_text("started\n")
    script = tmp_path / "logscan.py"
    script.write_text("import time\ntime.sleep(600)\n")
    bystanders = {
        "tail": subprocess.Popen(["tail", "-f", str(log)], stdout=subprocess.DEVNULL, start_new_session=True),
        "grep": subprocess.Popen(["grep", "vllm serve", "-", str(log)], stdin=subprocess.PIPE,
                                 stdout=subprocess.DEVNULL, start_new_session=True),
        "flag": subprocess.Popen([sys.executable, str(script), "--grep", "sglang::scheduler"], start_new_session=True),
    }
    for p in bystanders.values():
        ps.adopt(p.pid)
    pids = {name: p.pid for name, p in bystanders.items()}
    sock = tmp_path / "tmux.sock"
    if subprocess.run(["sh", "-c", "command -v tmux"], capture_output=True).returncode == 0:
        subprocess.run(["tmux", "-S", str(sock), "new-session", "-d", "-s", "torchrun", f"sleep 600 # {tmp_path}"],
                       check=True, env=dict(os.environ, TMUX=""))
        tmux_server, panes = wait_for(lambda: _tmux_pids(sock)[1] and _tmux_pids(sock), "tmux pane")
        ps.adopt(tmux_server)
        ps.pids.extend(panes)
        pids["tmux server"] = tmux_server
        pids.update({f"tmux pane {p}": p for p in panes})
    keys = dict(scenario.host_keys(ps))
    del keys["TARGETS"]  # the built-in defaults, as a user gets them
    host = dataclasses.replace(build_host("local", keys, "test"), fake_gpus=str(ps.memdir))
    plan = run_agent(host, requests.Plan()).doc["plan"]
    reasons = {t["pid"]: t["reason"] for t in plan["targets"]}
    assert reasons[server].startswith("runs module sglang.launch_server")
    for name, pid in pids.items():
        assert pid not in reasons, f"{name} (pid {pid}) was planned: {reasons.get(pid)}"
    result = run_agent(host, requests.Teardown(grace=2, timeout=10, settle=0.3))
    assert result.code == 0, result.doc.get("problems")
    assert not alive(server)
    for name, pid in pids.items():
        assert alive(pid), f"{name} was killed"
    bystanders["grep"].stdin.close()


_WORDS = ["python3", "-m", "sglang.launch_server", "vllm", "serve", "sglang::scheduler_TP0", "/opt/x/vllm",
          "launch_server.py", "bash", "-c", "torchrun", "x y", "VLLM::EngineCore", "--port", "serve.py", ""]
_PATTERNS = [r"sglang\.launch_server", r"sglang serve", r"sglang::.*", r"vllm serve", r"vllm\.entrypoints",
             r"VLLM::.*", r"torchrun", r"x\.launch_server|x serve", r"launch_server", r"serve\.py|bash",
             r"[a-z]+ serve", r"(vllm|sglang) serve", r"VLLM::Engine\w+"]


@settings(max_examples=300, deadline=None)
@given(argv=st.lists(st.sampled_from(_WORDS), max_size=5), comm=st.sampled_from(["python3", "vllm", "bash", ""]),
       patterns=st.lists(st.sampled_from(_PATTERNS), min_size=1, max_size=4))
def test_the_prefilter_never_hides_a_name_that_matches(argv, comm, patterns):
    """program.match's prefilter (one search over the process's text) is only a shortcut: it
    answers what matching every name of the process answers."""
    proc = {"argv": argv, "comm": comm}
    slow = None
    for pattern in patterns:
        for alt in program.alternatives(pattern):
            hit = next((why for name, why in program.names(proc)
                        if (" " in name) == (" " in alt) and re.fullmatch(alt, name)), None)
            if hit and slow is None:
                slow = (pattern, hit)
    assert program.match(proc, patterns) == slow


def _slow_match(proc, patterns):
    for pattern in patterns:
        for alt in program.alternatives(pattern):
            hit = next((why for name, why in program.names(proc)
                        if (" " in name) == (" " in alt) and re.fullmatch(alt, name)), None)
            if hit:
                return pattern, hit
    return None


@pytest.mark.parametrize("argv0", ["", " ", "\t"])
def test_the_prefilter_reads_a_blank_argv0_as_names_does(argv0):
    """`exec -a '' vllm serve ...`: the process is named by its comm (`vllm serve`), and so is the
    text the prefilter searches."""
    proc = {"argv": [argv0, "serve", "--model", "/m"], "comm": "vllm"}
    patterns = list(TARGETS)
    assert program.match(proc, patterns) == _slow_match(proc, patterns) == ("vllm serve", "runs 'vllm serve'")


@pytest.mark.parametrize("argv, comm, patterns", [
    (["/opt/bin/vllm", "serve", "--port", "1"], "vllm", ["(?x) torch run ", "vllm serve"]),  # verbose mode
    (["/opt/bin/\u210cost"], "x", [r"(?a)zz", r"\w+ost"]),  # ASCII-only \w
    (["yz"], "yz", [r"(s)glang", r"(y)?(?(1)z|w)"]),  # a conditional group's number
])
def test_one_patterns_flags_or_groups_change_no_other_pattern(argv, comm, patterns):
    """The prefilter joins the patterns into one regex: inline flags (which Python before 3.11
    applies to the whole regex) and conditional groups turn it off, so each pattern keeps its
    own meaning, on the agent's oldest Python as on this one."""
    proc = {"argv": argv, "comm": comm}
    assert program._matcher(tuple(patterns))[0] is None
    assert program.match(proc, patterns) == _slow_match(proc, patterns) is not None
