"""The emergency page works at 3 a.m.: every action's line is on its first screen, the host is
typed once (H, and P for a Proxmox hop), and each line, pasted as printed, does what the page
says through a real sshd and the `pct` stand-in against the sandbox's real processes.

Why run the lines themselves: the page is what a person pastes; a line that reads right and
fails as printed costs minutes when nobody can debug quoting. Each line runs as the page prints
it after a settings line of our own (H=the loopback sshd): an `ssh` first on PATH adds only the
loopback server's port and key. The teardown's device glob and scope are the only words changed
(the sandbox's device files; a scope only the sandbox's processes have), so it signals nothing
this test did not start."""
import os
import re
import shlex
import shutil
import stat
import subprocess
import uuid
from pathlib import Path

import pytest

from scripts.emergency import runbook, shell_teardown
from scripts.reach.route import wrap
from tests.conftest import REPO, invoke
from tests.support.parsers import oneliner_report
from tests.support.procs import alive

PAGE = REPO / "runbooks" / "emergency-one-liners.md"
SCREEN = 40  # lines: a laptop terminal, or a phone's ssh client turned sideways
DOC_GLOB = "/dev/nvidia*"
Q = "'\"'\"'"  # a single quote inside the line's single-quoted remote command


def page_actions() -> list:
    """The page's action blocks as printed (after its two settings blocks), in order: holders,
    memory, last teardown, teardown."""
    blocks = [b.rstrip("\n") for b in re.findall(r"```sh\n(.*?)```", PAGE.read_text(), re.S)]
    assert blocks[:2] == [runbook.SET_DIRECT, runbook.SET_PROXMOX], blocks[:2]
    assert len(blocks) == 6, len(blocks)
    return blocks[2:]


def action_lines() -> dict:
    """{label: the line an operator pastes for it} (the teardown's: its first line)."""
    return {label: text.splitlines()[0] for label, text in runbook.actions()}


def test_the_first_screen_holds_every_action_line_and_the_host_once():
    lines = PAGE.read_text().splitlines()
    screen = lines[:SCREEN]
    assert len(action_lines()) == 4
    for label, line in action_lines().items():
        assert line in screen, f"{label!r}: its line is not on the first {SCREEN} lines"
        assert line.startswith('ssh "$H" "$P" '), line  # the host comes from the settings line
    assert runbook.SET_DIRECT in screen and runbook.SET_PROXMOX in screen
    # no other line to paste anywhere else; the host's address only on the settings lines
    pasted = [n for n, line in enumerate(lines) if line.startswith("ssh ")]
    assert max(pasted) < SCREEN, pasted
    for address in ("192.0.2.174", "192.0.2.6"):
        assert [line for line in screen if address in line and "ssh" in line] == [], address
    # the explanations come after the lines
    explained = lines.index("## What the lines do")
    assert explained > max(pasted) and "pkill" not in "\n".join(lines[:explained])


def _ssh_on_path(bin_dir: Path, script: str) -> dict:
    """The environment with `script` as the `ssh` found first on PATH (in `bin_dir`)."""
    bin_dir.mkdir()
    shim = bin_dir / "ssh"
    shim.write_text(script)
    shim.chmod(shim.stat().st_mode | stat.S_IXUSR)
    return dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}")


def _stub_ssh(tmp_path: Path) -> dict:
    """An `ssh` that records its arguments and its stdin, and exits 0: what a line hands ssh."""
    return _ssh_on_path(tmp_path / "stub", f'#!/bin/sh\nprintf "%s\\0" "$@" >{tmp_path}/argv\ncat >{tmp_path}/stdin\n')


@pytest.mark.parametrize("settings,host", [(runbook.SET_DIRECT, runbook.DIRECT),
                                           (runbook.SET_PROXMOX, runbook.PROXMOX)], ids=["direct", "proxmox"])
def test_each_line_hands_ssh_what_the_route_sends(tmp_path, settings, host):
    """ssh joins its command words with a space: `$P` and the command reach the host's shell as
    the Route's one string (pct exec before it on a Proxmox hop), and the teardown's script
    arrives whole on stdin."""
    env = _stub_ssh(tmp_path)
    argvs = [runbook.HOLDERS, runbook.MEMORY, runbook.LAST, shell_teardown.stdin_argv(runbook.DIRECT)]
    for (label, text), argv in zip(runbook.actions(), argvs, strict=True):
        ran = subprocess.run(["bash", "-c", f"{settings}\n{text}"], env=env, capture_output=True, timeout=30)
        assert ran.returncode == 0, ran.stderr
        words = (tmp_path / "argv").read_bytes().decode().split("\0")[:-1]
        expected = wrap(host.route, argv, for_paste=True)
        assert words[0] == expected[1] and " ".join(words[1:]).strip() == expected[-1], (label, words)
        sent = (tmp_path / "stdin").read_text()
        assert sent == (shell_teardown.script_text() if argv[2] == shell_teardown.FROM_STDIN else ""), label


# -- on the sandbox, through the loopback sshd and the pct stand-in -------------------------------

@pytest.fixture
def sandbox():
    assert invoke("sandbox", "up").returncode == 0
    import json
    yield json.loads(invoke("sandbox", "status", "--json").stdout)
    invoke("sandbox", "down")


@pytest.fixture
def loopback_ssh(tmp_path, sshd):
    """The environment the lines run in: `ssh` adds only the loopback server's options."""
    return _ssh_on_path(tmp_path / "bin",
                        f'#!/bin/sh\nexec {shlex.quote(shutil.which("ssh") or "ssh")} {sshd.ssh_opts} "$@"\n')


def paste(env: dict, dest: str, prefix: str, block: str, timeout: int = 120) -> subprocess.CompletedProcess:
    """A person's shell: the settings line, then the block as the page prints it."""
    return subprocess.run(["bash", "-c", f"H={shlex.quote(dest)} P={shlex.quote(prefix)}\n{block}"], env=env,
                          capture_output=True, text=True, timeout=timeout)


def on_devices(block: str, glob: str, scope: str) -> str:
    """The block with the sandbox's device glob (and the teardown's empty SCOPE set to `scope`)."""
    assert DOC_GLOB in block
    out = block.replace(DOC_GLOB, glob)
    if "eval" in block.splitlines()[0]:
        empty_scope = f"{glob}{Q} {Q}{Q}"
        assert empty_scope in out, out.splitlines()[0]
        out = out.replace(empty_scope, f"{glob}{Q} {Q}{scope}{Q}", 1)
    return out


def pct_log(sshd) -> str:
    """The container ids the pct stand-in was asked for so far (none: no file yet)."""
    return sshd.pct_log.read_text() if sshd.pct_log.exists() else ""


def test_every_line_as_printed_on_the_sandbox_through_ssh_and_pct(sandbox, sshd, loopback_ssh):
    glob = sandbox["devices"]
    base = str(Path(glob).parent.parent)
    procs = {r: p["pid"] for r, p in sandbox["processes"].items()}
    holders, memory, last, teardown = page_actions()
    pct = "pct exec 129 --"
    run_dir = Path(sshd.env["GPU_PIVOT_RUN_DIR"])
    made = not (run_dir / "last.json").exists()
    if made:  # where the far side's agent keeps it (no teardown there yet in this session)
        run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        (run_dir / "last.json").write_text('{"test": "%s"}\n' % uuid.uuid4().hex)
    try:
        for prefix in ("", pct):
            before = pct_log(sshd)
            out = paste(loopback_ssh, sshd.dest(), prefix, on_devices(holders, glob, base))
            for role in ("server", "worker0", "worker1", "persistenced", "monitor"):
                assert str(procs[role]) in out.stdout, (prefix, out.stdout, out.stderr)
            out = paste(loopback_ssh, sshd.dest(), prefix, memory)
            # the far side ran nvidia-smi: its answer, or its shell's "not found" where the sandbox has none
            assert out.returncode == (0 if shutil.which("nvidia-smi") else 127), (prefix, out.stderr)
            assert out.returncode == 0 or "nvidia-smi" in out.stderr
            out = paste(loopback_ssh, sshd.dest(), prefix, last)
            assert out.returncode == 0 and out.stdout == (run_dir / "last.json").read_text(), (prefix, out)
            assert pct_log(sshd)[len(before):] == ("129\n" * 3 if prefix else ""), prefix
    finally:
        if made:
            (run_dir / "last.json").unlink()
    before = pct_log(sshd)
    out = paste(loopback_ssh, sshd.dest(), pct, on_devices(teardown, glob, base))
    assert pct_log(sshd)[len(before):] == "129\n"
    report = oneliner_report.parse_report(out.stdout)
    assert out.returncode == 0, out.stdout + out.stderr
    assert report["verdict"] == "free" and report["remaining"] == []
    assert set(report["sigTERM"]) == {procs["server"], procs["worker0"], procs["worker1"]}
    assert set(report["protected"]) == {procs["persistenced"], procs["monitor"]}
    assert alive(procs["persistenced"]) and alive(procs["monitor"]) and alive(procs["bystander"])
    assert not alive(procs["server"]) and not alive(procs["worker0"])


@pytest.mark.parametrize("gpu_source", ["lists no GPU", "not found"])
def test_no_device_file_says_no_gpu_visible_and_exits_1(tmp_path, sshd, loopback_ssh, gpu_source):
    """A glob that matches nothing (a wrong glob, a driver not loaded) is not "free": the line
    says what the agent says, NO GPU VISIBLE, and exits 1, as `invoke verify` does."""
    glob = f"{tmp_path}/nowhere/nvidia*"
    prefix = ""
    if gpu_source == "lists no GPU":  # nvidia-smi as it answers on a host whose driver sees no GPU
        fake = tmp_path / "fake-bin"
        fake.mkdir()
        (fake / "nvidia-smi").write_text("#!/bin/sh\necho 'No devices were found'\nexit 6\n")
        (fake / "nvidia-smi").chmod(0o755)
        prefix = f"env PATH={fake}:$PATH"  # P: a prefix of the remote command, expanded there
    elif shutil.which("nvidia-smi"):
        pytest.skip("this machine has nvidia-smi: the case of a host without one needs a machine without it")
    scope = f"gp-no-gpu-{uuid.uuid4().hex}"  # in no process's command line: nothing is signalled
    teardown = page_actions()[-1]
    out = paste(loopback_ssh, sshd.dest(), prefix, on_devices(teardown, glob, scope))
    report = oneliner_report.parse_report(out.stdout)
    assert out.returncode == 1, out.stdout + out.stderr
    assert (f"NO GPU VISIBLE: no device file matches {glob} and no GPU memory source (nvidia-smi: {gpu_source})"
            in out.stdout.splitlines()), out.stdout
    assert report["verdict"] == "NO GPU VISIBLE" and report["sigTERM"] == [] and report["holders"] == []
