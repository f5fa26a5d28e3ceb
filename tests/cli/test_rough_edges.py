"""The first week's rough edges: screens that fit 80 columns without cutting a word, a
teardown's help that lists every exit code it can give (from the one table of them), runbooks
that escalate through `invoke reset`, and a `make demo` that installs only what runs."""
from __future__ import annotations

import os
import re
import subprocess

import pytest

from scripts.agent.wire import codes
from tests.conftest import REPO, invoke, sandbox_session


def columns(n: int) -> dict:
    return dict({k: v for k, v in os.environ.items() if k != "NO_COLOR"}, COLUMNS=str(n))


def too_wide(text: str, n: int = 80) -> list:
    """Lines wider than n, but for a path alone on its line (never cut: it is copied whole)."""
    return [line for line in text.splitlines() if len(line) > n and " " in line.strip()]


# -- teardown --help: every exit code, from codes.EXIT_CODES, within 80 columns -----------------

def test_teardown_help_lists_every_exit_code_it_can_give_in_80_columns():
    from scripts.cli.teardown_args import TEARDOWN_EXITS

    out = invoke("teardown", "-h", env=columns(80))
    text = out.stdout.decode()
    assert out.returncode == 0 and not too_wide(text), too_wide(text)
    block = text.split("Exit codes:", 1)[1].split("Options:", 1)[0]
    entries = dict(re.findall(r"^    (\d+) +(.*(?:\n {9}.*)*)", block, re.M))
    listed = {int(code): " ".join(words.split()) for code, words in entries.items()}
    meanings = {code: meaning for code, name, meaning in codes.EXIT_CODES if name in TEARDOWN_EXITS}
    assert listed == meanings  # the table's words, not a second copy of them
    assert {codes.EXIT_TIMED_OUT, codes.EXIT_DECLINED, codes.EXIT_OUTPUT} <= set(listed)
    assert codes.EXIT_GATE not in listed  # a pivot's, never a teardown's


def test_every_tasks_help_fits_80_columns_without_cutting_a_word():
    listed = invoke("--list").stdout.decode().splitlines()[2:]
    names = [line.split()[0] for line in listed if line.startswith("  ") and not line.startswith("    ")]
    assert "status" in names and "sandbox" in names
    for name in names:
        out = invoke(name, "-h", env=columns(80))
        assert out.returncode == 0 and not too_wide(out.stdout.decode()), (name, too_wide(out.stdout.decode()))
    wide = invoke("status", "-h", env=columns(200)).stdout.decode()
    assert "(`HOST  GPUs free/total  holders  verdict`" in " ".join(wide.split("\n"))  # spacing kept


def test_a_paragraph_that_fits_keeps_its_lines():
    from scripts.cli.program import fit_paragraphs

    text = "Title line.\n\nshort\nlines kept\n\n" + "word " * 30
    fitted = fit_paragraphs(text, 40)
    assert fitted.startswith("Title line.\n\nshort\nlines kept\n\nword word")
    assert all(len(line) <= 40 for line in fitted.splitlines())


def test_an_exit_code_name_not_in_the_table_is_refused():
    from scripts.cli.program import exit_codes_help

    with pytest.raises(ValueError, match="no exit code named freed"):
        exit_codes_help(("ok", "freed"), 78)


# -- hosts and plan at 80 columns: nothing cut inside a word -----------------------------------------

def test_hosts_at_80_columns_wraps_device_globs_and_addresses_between_words(hosts_env):
    hosts_env("GPU1_SSH=root@192.0.2.10\nGPU1_DEVICES=/dev/nvidia[0-3]\n"
              "GPU2_SSH=ana@gpu2.example\nGPU2_BECOME=sudo\nGPU2_CTID=129\nGPU2_PHASE_TRAIN_CMD=true\n")
    out = invoke("hosts", env=columns(80))
    text = out.stdout.decode()
    assert out.returncode == 0 and not too_wide(text), too_wide(text)
    lines = text.splitlines()
    words = ["nvidia[0-3]", "root@192.0.2.10", "ana@gpu2.example", "/dev/nvidia*"]
    from scripts.config.sandbox import sandbox_host  # its glob is a long path: each part of it stays whole

    words += [part for part in re.findall(r"[^/]+/?", sandbox_host().devices)]
    cut = [w for w in words if not any(w in line for line in lines)]
    assert not cut, text


@pytest.fixture(scope="module")
def sandbox():
    yield from sandbox_session()


@pytest.mark.parametrize("args", [["plan"], ["teardown", "--dry-run"]], ids=" ".join)
def test_plan_fits_80_columns(sandbox, args):
    out = invoke(*args, "--host", "sandbox", env=columns(80))
    text = out.stdout.decode()
    assert out.returncode == 0 and "sglang.launch_server" in text, out
    assert not too_wide(text), too_wide(text)


# -- runbooks: the escalation is `invoke reset` -----------------------------------------------------

def test_runbooks_escalate_through_invoke_reset_never_a_raw_gpu_reset():
    raw = [(p.name, n) for p in sorted((REPO / "runbooks").glob("*.md"))
           for n, line in enumerate(p.read_text().splitlines(), 1) if "--gpu-reset" in line]
    assert not raw, raw
    for name in ("gpu-memory-not-freed.md", "slurm-node-drained.md"):
        escalation = (REPO / "runbooks" / name).read_text().split("## Escalation", 1)[1]
        assert re.search(r"`invoke reset --host \S+ --gpu N`", escalation), name


# -- make demo: the runtime requirements only ------------------------------------------------------

def make_plan(target: str, tmp_path) -> str:
    """What `make TARGET` would run in a fresh checkout's venv (make -n: nothing runs)."""
    out = subprocess.run(["make", "-n", target, f"VENV={tmp_path / 'venv'}"], cwd=REPO, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_make_demo_installs_the_runtime_requirements_only(tmp_path):
    demo = make_plan("demo", tmp_path)
    assert "-r requirements.txt" in demo and "requirements-dev.txt" not in demo, demo
    for target in ("setup", "test"):  # the tests still get the development requirements
        assert "-r requirements-dev.txt" in make_plan(target, tmp_path), target
