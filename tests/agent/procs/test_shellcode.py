"""What a shell's code would start again (scripts/agent/procs/shellcode.py), read from its text.

The rule: a loop (its `do ... done`) that runs a target program, through launchers and nested
`sh -c`, restarts it; so does code nobody can know (eval, source, a function, $0, a command
from a variable); a loop keyword in a string or a comment, or a loop that runs no target, does
not. Scripts are read as regular files only: a FIFO is never opened for reading its data.
"""
from __future__ import annotations

import os

import pytest

from scripts.agent.procs import shellcode

NAMES = shellcode.Names([r"xsrv\.launch_server", r"vllm serve"])
SERVER = "python3 -m xsrv.launch_server --port 1"


@pytest.mark.parametrize("code", [
    f"while true; do {SERVER}; sleep 3; done",
    f"until false; do sudo -n env X=1 {SERVER}; done",
    f"for ((;;)); do {SERVER}; sleep 30; done",
    "while :; do\n  setsid -f vllm serve /m\n  sleep 5\ndone",
    f"while sleep 4; do kill -0 $(cat p) || sh -c '{SERVER}'; done",
    'eval "$LOOP"',
    f"f() {{ {SERVER}; f; }}; f",
    "exec bash $0",
    "while true; do $CMD; done",
    ". ./start-loop.sh",
])
def test_code_that_restarts_a_target(code):
    assert shellcode.shell_restarts(code, NAMES), code


@pytest.mark.parametrize("code", [
    f"{SERVER}; sleep 20",
    f"for f in a b; do echo $f; done; {SERVER}",
    f"{SERVER}; echo 'server exited, waiting for logs'; sleep 6",
    f"# start the server for the demo\n{SERVER}\nsleep 6",
    f"{SERVER}; while true; do sleep 1000; done",
    "while true; do python3 -m xsrv.bench_serving; sleep 1; done",
])
def test_code_that_does_not(code):
    assert not shellcode.shell_restarts(code, NAMES), code


def test_scripts_are_read_as_regular_files_only(tmp_path):
    script, fifo = tmp_path / "loop.sh", tmp_path / "loop.fifo"
    script.write_text(f"while true; do {SERVER}; done\n")
    os.mkfifo(fifo)
    me = os.getpid()
    shells = [{"pid": me, "argv": ["bash", str(script)]}, {"pid": me + 1, "argv": ["bash", str(fifo)]},
              {"pid": me + 2, "argv": ["bash", "-c", SERVER]}, {"pid": 7, "argv": ["bash", "-i"]}]
    got = shellcode.read_scripts(shells)
    assert got[os.getpid()] == (script.read_text(), True)
    assert got[os.getpid() + 1] == (None, False)  # opened without blocking, never read: a pipe's data is not ours
    assert got[os.getpid() + 2] == (SERVER, True) and 7 not in got


def test_a_script_over_the_limit_is_cut_and_counts_as_unknown(tmp_path, monkeypatch):
    monkeypatch.setattr(shellcode, "SCRIPT_READ_MAX", 64)
    script = tmp_path / "big.sh"
    script.write_text("#" * 100 + f"\nwhile true; do {SERVER}; done\n")
    text, complete = shellcode.read_scripts([{"pid": 1, "argv": ["bash", str(script)]}])[1]
    assert not complete and len(text) == 64
    info = {"pid": os.getpid(), "argv": ["bash", str(script)], "comm": "bash"}
    assert shellcode.restarts(info, NAMES)  # cut code is unknown code
