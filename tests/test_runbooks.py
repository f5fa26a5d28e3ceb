"""Runbooks name only real tasks, flags and make targets; the emergency one-liners are the
generated ones and do what they claim through a real sshd and the pct stand-in."""
import re
import shlex
import subprocess
from functools import cache
from pathlib import Path

import pytest

from scripts import emergency_doc, shell_teardown
from tests.conftest import REPO, invoke

RUNBOOKS = sorted((REPO / "runbooks").glob("*.md"))
FENCE = re.compile(r"```(?:sh|bash)?\n(.*?)```", re.S)


def commands(path: Path):
    for block in FENCE.findall(path.read_text()):
        for line in block.splitlines():
            line = line.split(" #", 1)[0].strip()
            if line.startswith(("invoke ", "make ")):
                yield line


@cache
def task_names():
    out = invoke("--list").stdout.decode()
    return {line.split()[0] for line in out.splitlines()[2:] if line.startswith("  ") and line.split()
            and not line.startswith("    ")}


@cache
def task_flags(task):
    out = invoke(task, "--help").stdout.decode()
    return set(re.findall(r"--([a-z][a-z0-9-]*)", out))


@cache
def make_targets():
    return set(re.findall(r"^([a-zA-Z][a-zA-Z0-9_-]*):", (REPO / "Makefile").read_text(), re.M))


ALL = [(p.name, c) for p in RUNBOOKS for c in commands(p)]


def test_runbooks_have_commands_and_sections():
    assert len(ALL) > 20
    for path in RUNBOOKS:
        if path.name in ("README.md", "emergency-one-liners.md"):
            continue
        text = path.read_text()
        for section in ("## Symptoms", "## Pre-checks", "## Resolution", "## Post-checks", "## Rollback",
                        "## Escalation"):
            assert section in text, f"{path.name} lacks {section}"


@pytest.mark.parametrize("name,command", ALL)
def test_runbook_command_exists(name, command):
    words = shlex.split(command)
    if words[0] == "make":
        for target in [w for w in words[1:] if "=" not in w and not w.startswith("-")]:
            assert target in make_targets(), f"{name}: make target {target!r} does not exist"
        return
    task = words[1]
    assert task in task_names(), f"{name}: invoke task {task!r} does not exist"
    args = words[2:words.index("--")] if "--" in words else words[2:]
    for arg in args:
        if arg.startswith("--"):
            flag = arg[2:].split("=", 1)[0]
            assert flag in task_flags(task), f"{name}: `invoke {task}` has no flag --{flag}"


def test_checker_catches_a_bad_flag():
    with pytest.raises(AssertionError, match="has no flag --no-such-flag"):
        test_runbook_command_exists("x.md", "invoke teardown --host gpu1 --no-such-flag")
    with pytest.raises(AssertionError, match="task 'nuke' does not exist"):
        test_runbook_command_exists("x.md", "invoke nuke --host gpu1")


def test_emergency_file_is_the_generated_one():
    assert (REPO / "runbooks" / "emergency-one-liners.md").read_text() == emergency_doc.render(), \
        "run `make runbooks` and commit the result"


def blocks():
    return FENCE.findall((REPO / "runbooks" / "emergency-one-liners.md").read_text())


@pytest.fixture
def sandbox():
    assert invoke("sandbox", "up").returncode == 0
    import json
    yield json.loads(invoke("sandbox", "status", "--json").stdout)
    invoke("sandbox", "down")


def to_loopback(line, sshd, glob, real):
    """Point a documented one-liner at the loopback sshd; refuse to run one still naming the documented host."""
    assert f"ssh {real}" in line, (real, line)
    looped = line.replace(f"ssh {real}", f"ssh {sshd.ssh_opts} {sshd.dest()}", 1).replace("/dev/nvidia*", glob)
    assert real not in looped, looped
    return looped


def test_emergency_holders_and_teardown_through_ssh_and_pct(sandbox, sshd):
    glob = sandbox["devices"]
    procs = {r: p["pid"] for r, p in sandbox["processes"].items()}
    holders_line, _memory, direct_td, proxmox_td, _last = [b.strip() for b in blocks()]
    out = subprocess.run(["bash", "-c", to_loopback(holders_line, sshd, glob, "root@192.0.2.174")],
                         capture_output=True, text=True, timeout=60)
    for role in ("server", "worker0", "worker1", "persistenced", "monitor"):
        assert str(procs[role]) in out.stdout
    before = sshd.pct_log.read_text() if sshd.pct_log.exists() else ""
    out = subprocess.run(["bash", "-c", to_loopback(proxmox_td, sshd, glob, "root@192.0.2.6")],
                         capture_output=True, text=True, timeout=120)
    assert sshd.pct_log.read_text()[len(before):] == "129\n"
    report = shell_teardown.parse_report(out.stdout)
    assert out.returncode == 0, out.stdout + out.stderr
    assert report["verdict"] == "free" and report["remaining"] == []
    assert set(report["sigTERM"]) == {procs["server"], procs["worker0"], procs["worker1"]}
    assert set(report["protected"]) == {procs["persistenced"], procs["monitor"]}
    from tests.procs import alive
    assert alive(procs["persistenced"]) and alive(procs["monitor"]) and alive(procs["bystander"])
    assert not alive(procs["server"]) and not alive(procs["worker0"])


# -- hosts and phases the runbooks name exist in hosts.env.example --------------------------------
INLINE = re.compile(r"`(invoke [^`]+)`")


def every_invoke(path: Path) -> list:
    """Each `invoke ...` of a runbook: in its code blocks and in its inline code spans."""
    return list(commands(path)) + INLINE.findall(path.read_text())


@cache
def example_hosts() -> dict:
    """{alias: [phases]} of hosts.env.example, as `invoke hosts --json` reads it."""
    import json
    import os

    env = dict(os.environ, GPU_PIVOT_HOSTS_FILE=str(REPO / "hosts.env.example"))
    out = invoke("hosts", "--json", env=env)
    assert out.returncode == 0, out.stderr
    return {h["alias"]: h["phases"] for h in json.loads(out.stdout)}


def host_and_phase(command: str):
    """(host, phase) an invoke command names with --host/-H and --to/--phase/-p (None if absent)."""
    words = shlex.split(command)
    words = words[:words.index("--")] if "--" in words else words
    found = {}
    for i, w in enumerate(words):
        for flag, key in (("--host", "host"), ("-H", "host"), ("--to", "phase"), ("--phase", "phase"),
                          ("-p", "phase")):
            if w == flag and i + 1 < len(words):
                found[key] = words[i + 1]
            elif w.startswith(flag + "=") and flag.startswith("--"):
                found[key] = w.split("=", 1)[1]
    return found.get("host"), found.get("phase")


def check_names(name: str, command: str) -> None:
    """A command naming a phase names a host of hosts.env.example that has it. (Commands
    without a phase may name other hosts: the Slurm runbook's aliases are node names.)"""
    host, phase = host_and_phase(command)
    if phase is None:
        return
    hosts = example_hosts()
    assert host is not None, f"{name}: `{command}` names a phase but no host"
    assert host in hosts, f"{name}: `{command}` names host {host!r}, not in hosts.env.example"
    assert phase in hosts[host], f"{name}: `{command}`: hosts.env.example gives {host} no phase {phase!r}"


@pytest.mark.parametrize("path", [p for p in RUNBOOKS if p.name != "emergency-one-liners.md"], ids=lambda p: p.name)
def test_runbook_hosts_and_phases_are_the_examples(path):
    for command in every_invoke(path):
        check_names(path.name, command)


def test_name_checker_catches_an_unknown_phase_and_host():
    with pytest.raises(AssertionError, match="no phase 'extract'"):
        check_names("x.md", "invoke pivot --host gpu1 --to extract")
    with pytest.raises(AssertionError, match="host 'gpu7'"):
        check_names("x.md", "invoke logs --host gpu7 --phase datagen")
    with pytest.raises(AssertionError, match="no phase 'eagle3'"):
        check_names("x.md", "invoke pivot --host gpu1 --to eagle3")
    check_names("x.md", "invoke logs -H gpu1pct -p train --follow")


def test_runbook_patch_paths_are_the_examples():
    """A patch file a runbook applies by hand is the one the example's deploy phase names."""
    example = (REPO / "hosts.env.example").read_text()
    for path in RUNBOOKS:
        for patch in re.findall(r"/opt/patches/\S+\.patch", path.read_text()):
            assert patch in example, f"{path.name}: {patch} is not the patch of hosts.env.example"
