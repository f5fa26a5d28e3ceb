"""Runbooks name only real tasks, flags and make targets; the emergency one-liners are the
generated ones (test_emergency_page.py runs them through a real sshd and the pct stand-in)."""
import re
import shlex
import subprocess
from functools import cache
from pathlib import Path

import pytest

from scripts.emergency import runbook as emergency_doc
from tests.conftest import REPO, invoke
from tests.support.task_help import HELP_GROUP, help_of, task_names

RUNBOOKS = sorted((REPO / "runbooks").glob("*.md"))
FENCE = re.compile(r"```(?:sh|bash)?\n(.*?)```", re.S)


def commands(path: Path):
    for block in FENCE.findall(path.read_text()):
        for line in block.splitlines():
            line = line.split(" #", 1)[0].strip()
            if line.startswith(("invoke ", "make ")):
                yield line


def task_flags(task):
    return set(re.findall(r"--([a-z][a-z0-9-]*)", help_of(task).stdout.decode()))


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


@HELP_GROUP
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


@HELP_GROUP
def test_checker_catches_a_bad_flag():
    with pytest.raises(AssertionError, match="has no flag --no-such-flag"):
        test_runbook_command_exists("x.md", "invoke teardown --host gpu1 --no-such-flag")
    with pytest.raises(AssertionError, match="task 'nuke' does not exist"):
        test_runbook_command_exists("x.md", "invoke nuke --host gpu1")


def test_emergency_file_is_the_generated_one():
    assert (REPO / "runbooks" / "emergency-one-liners.md").read_text() == emergency_doc.render(), \
        "run `make runbooks` and commit the result"


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


# -- every command block of every runbook runs as printed against the SANDBOX -----------
# Runbooks are for people under pressure: a command that fails as printed, once the host name is
# changed, costs minutes at 3 a.m. Each runbook's blocks run in order, from runbooks/ (make from
# the checkout), against a fresh sandbox; each command must exit as the runbook says: a `# exit N`
# comment on its line, else 0. Where the sandbox differs from a GPU host, SANDBOX_EXITS says how.

EXECUTED = [p for p in RUNBOOKS if p.name not in ("README.md", "emergency-one-liners.md")]  # the one-liners
# reach documented addresses; they are run through the loopback sshd above instead
HOST_WORDS = re.compile(r"(--host |-H |HOST=)(gpu1pct|gpu1|node3|node\[1-8\])(?=\s|$)")
EXIT_NOTE = re.compile(r"#.*?\bexit (\d+)")
# a runbook's starting point on the sandbox: its server tree holding the GPUs, or already torn down
FREED_FIRST = {"gpu-unusable-after-teardown.md"}
# (runbook, command as printed) -> (exit codes on the sandbox, why the sandbox differs from a GPU host);
# None: not run, with why
SANDBOX_EXITS = {
    ("gpu-unusable-after-teardown.md", "invoke run --host gpu1 -- nvidia-smi -q -d ROW_REMAPPER,ECC"):
        ({127}, "no nvidia-smi on a machine without an NVIDIA driver: `run` exits 127 as a shell would"),
    ("gpu-unusable-after-teardown.md", "invoke run --host gpu1 -- dmesg --level=err,warn"):
        ({0, 1}, "a container may not be allowed to read the kernel log"),
    ("gpu-unusable-after-teardown.md", "invoke run --host gpu1 -- nvidia-smi -q -d FABRIC"):
        ({127}, "no nvidia-smi on a machine without an NVIDIA driver: `run` exits 127 as a shell would"),
    ("gpu-unusable-after-teardown.md", "invoke run --host gpu1 -- systemctl status nvidia-fabricmanager"):
        ({1, 3, 4, 127}, "no fabric manager unit here (systemctl: no such unit, or no systemd)"),
    ("gpu-unusable-after-teardown.md", "invoke run --host gpu1 -- systemctl start nvidia-fabricmanager"):
        ({1, 5, 127}, "no fabric manager unit here (systemctl: no such unit, or no systemd)"),
    ("gpu-unusable-after-teardown.md", "invoke reset --host gpu1 --gpu 0"):
        ({1}, "fake GPUs: no NVML, so the MIG precondition cannot be read and the reset is refused"),
    ("gpu-unusable-after-teardown.md", "invoke reset --host gpu1 --gpu 0 --yes"):
        ({1}, "the same refusal: nothing is reset"),
    ("gpu-unusable-after-teardown.md", "invoke reset --host gpu1 --gpu 0 --quiesce"):
        ({1}, "the same refusal: no daemon is stopped"),
    ("gpu-unusable-after-teardown.md", "invoke reset --host gpu1 --gpu 0 --quiesce --yes"):
        ({1}, "the same refusal, before any daemon is stopped: nothing is reset"),
    ("host-crash-recovery.md", "invoke run --host gpu1 -- systemctl is-enabled vllm.service"):
        ({1, 4, 127}, "the sandbox has no vllm.service (systemctl: no such unit, or no systemd)"),
    ("slurm-node-drained.md", "invoke undrain --host node[1-8]"):
        (None, "Slurm only: sinfo here would look for a slurmctld over DNS; tests/engines/test_slurm.py runs undrain "
               "against a real one"),
    ("starter-alive-after-teardown.md",
     "test \"$(sed 's/.*) //' /proc/812/stat | cut -d' ' -f20)\" = 98765 && kill 812"):
        (None, "a hint's pinned kill of the pid it names: tests/agent/teardown/test_verdict_truth.py runs each such "
               "hint literally against the starter it names"),
    ("slurm-node-drained.md", "sinfo -R"): (None, "Slurm's own command (tests/engines/test_slurm.py)"),
    ("slurm-node-drained.md", "scontrol release JOBID"): (None, "Slurm's own command (tests/engines/test_slurm.py)"),
}


def sandbox_paths(base: str) -> list:
    """The runbooks' host paths, as the sandbox has them (longest first)."""
    return [("/opt/patches/dynamic_spec_v1.patch", f"{base}/patches/dynamic-spec.patch"),
            ("/opt/sglang", f"{base}/server-code"), ("/data/hidden_states", f"{base}/hidden_states"),
            ("/data", base), ("/models/kimi-k2.5", f"{base}/fake-model"),
            ("/models/eagle3-draft", f"{base}/fake-eagle3-draft")]


def on_sandbox(line: str, base: str) -> str:
    """A runbook command pointed at the sandbox: its host name and its host paths replaced."""
    out = HOST_WORDS.sub(r"\1sandbox", line)
    for path, there in sandbox_paths(base):
        out = re.sub(r"(?<![\w/.-])" + re.escape(path) + r"(?=[/\s'\"]|$)", there, out)
    return out


def steps(path: Path) -> list:
    """[(command, expected exit or None, why, alternative)] of a runbook's code blocks, in order.
    `alternative`: the block's paragraph starts with "or" (another way to do the block before
    it), so it runs from the state that block started from."""
    text, out, end = path.read_text(), [], 0
    for m in re.finditer(r"```(?:sh|bash)?\n(.*?)```", text, re.S):
        alternative = text[end:m.start()].strip().lower().startswith("or")
        end = m.end()
        for raw in m.group(1).splitlines():
            line = raw.split(" #", 1)[0].strip()
            if not line:
                continue
            note = EXIT_NOTE.search(raw)
            codes, why = SANDBOX_EXITS.get((path.name, line), ({int(note.group(1))} if note else {0}, ""))
            out.append((line, codes, why, alternative))
            alternative = False
    return out


def test_every_runbook_command_has_an_expectation():
    """A command that is neither invoke nor make must be listed, with why it is not run here."""
    for path in EXECUTED:
        for line, codes, why, _alt in steps(path):
            if not line.startswith(("invoke ", "make ")):
                assert codes is None and why, f"{path.name}: `{line}` is not run here and says nothing about why"
    assert on_sandbox("make pivot-train HOST=gpu1pct", "/s") == "make pivot-train HOST=sandbox"
    assert on_sandbox("invoke run --host gpu1 -- df -h /data", "/s") == "invoke run --host sandbox -- df -h /s"
    assert on_sandbox("invoke undrain --host node[1-8]", "/s") == "invoke undrain --host sandbox"


def _start(freed: bool) -> None:
    invoke("sandbox", "down")
    assert invoke("sandbox", "up").returncode == 0
    if freed:
        res = invoke("teardown", "--host", "sandbox", "--yes")
        assert res.returncode == 0, res.stdout.decode() + res.stderr.decode()


def _run(line: str) -> tuple:
    """(exit code, output tail) of one command as a person runs it: invoke from runbooks/, make
    from the checkout; a --follow runs until Ctrl-C (SIGINT once it printed something)."""
    import os
    import signal
    import time

    cwd = REPO if line.startswith("make ") else REPO / "runbooks"
    if "--follow" in line.split():
        import select

        proc = subprocess.Popen(["bash", "-c", f"exec {line}"], cwd=cwd, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True)
        assert proc.stdout is not None
        try:
            # it follows: its first output (a log may have none yet: then 5 s), then Ctrl-C
            first = os.read(proc.stdout.fileno(), 65536) if select.select([proc.stdout], [], [], 5)[0] else b""
            time.sleep(0.3)  # past Invoke's own first ~0.1 s, where a Ctrl-C is Invoke's exit 1
            os.killpg(proc.pid, signal.SIGINT)
            rest, _ = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        return proc.returncode, (first + rest).decode(errors="replace")[-1500:]
    res = subprocess.run(["bash", "-c", line], cwd=cwd, capture_output=True, timeout=300)
    return res.returncode, (res.stdout + res.stderr).decode(errors="replace")[-1500:]


@pytest.mark.parametrize("path", EXECUTED, ids=lambda p: p.name)
def test_runbook_runs_as_printed_on_the_sandbox(path):
    import os

    if any(line.startswith("make ") for line, *_ in steps(path)):
        stale = subprocess.run(["make", "-q", ".venv/.installed"], cwd=REPO, capture_output=True).returncode
        if stale:
            pytest.skip("the venv is older than the requirements: `make` would run pip (run `make setup` first)")
    base = os.environ["GPU_PIVOT_SANDBOX_DIR"]
    freed = path.name in FREED_FIRST
    failures, ran = [], 0
    try:
        _start(freed)
        for line, codes, why, alternative in steps(path):
            if codes is None:
                continue  # not runnable here: SANDBOX_EXITS says why
            if alternative:
                _start(freed)  # the same starting point as the block it replaces
            command = on_sandbox(line, base)
            code, tail = _run(command)
            ran += 1
            if code not in codes:
                failures.append(f"`{line}` (run as `{command}`) exited {code}, the runbook says {sorted(codes)}"
                                f"{' (' + why + ')' if why else ''}:\n{tail}")
    finally:
        invoke("sandbox", "down")
    assert ran >= 3
    assert not failures, f"{path.name}:\n" + "\n\n".join(failures)


# -- runbooks: the escalation is `invoke reset` -----------------------------------------------------

def test_runbooks_escalate_through_invoke_reset_never_a_raw_gpu_reset():
    raw = [(p.name, n) for p in sorted((REPO / "runbooks").glob("*.md"))
           for n, line in enumerate(p.read_text().splitlines(), 1) if "--gpu-reset" in line]
    assert not raw, raw
    for name in ("gpu-memory-not-freed.md", "slurm-node-drained.md"):
        escalation = (REPO / "runbooks" / name).read_text().split("## Escalation", 1)[1]
        assert re.search(r"`invoke reset --host \S+ --gpu N`", escalation), name
