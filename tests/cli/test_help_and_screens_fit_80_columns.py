"""Help and screens an operator reads on an 80-column terminal: every task's help fits without
cutting a word, a teardown's help lists every exit code it can give (from the one table of
them, never a list written by hand), and `hosts` and `plan` wrap between words."""
from __future__ import annotations

import re

import pytest

from scripts.agent.wire import codes
from tests.conftest import invoke, sandbox_session
from tests.support.task_help import HELP_GROUP, columns, help_of, task_names


def too_wide(text: str, n: int = 80) -> list:
    """Lines wider than n, but for a path alone on its line (never cut: it is copied whole)."""
    return [line for line in text.splitlines() if len(line) > n and " " in line.strip()]


# -- teardown --help: every exit code, from codes.EXIT_CODES, within 80 columns -----------------

@HELP_GROUP
def test_teardown_help_lists_every_exit_code_it_can_give_in_80_columns():
    from scripts.cli.teardown_args import TEARDOWN_EXITS

    out = help_of("teardown")
    text = out.stdout.decode()
    assert out.returncode == 0 and not too_wide(text), too_wide(text)
    block = text.split("Exit codes:", 1)[1].split("Options:", 1)[0]
    entries = dict(re.findall(r"^    (\d+) +(.*(?:\n {9}.*)*)", block, re.M))
    listed = {int(code): " ".join(words.split()) for code, words in entries.items()}
    own = {c[0]: c[1] for c in TEARDOWN_EXITS if not isinstance(c, str)}  # what a code means for a teardown
    names = {c if isinstance(c, str) else c[0] for c in TEARDOWN_EXITS}
    meanings = {code: own.get(name, meaning) for code, name, meaning in codes.EXIT_CODES if name in names}
    assert listed == meanings  # the table's words (or the task's own), not a second copy of them
    assert {codes.EXIT_TIMED_OUT, codes.EXIT_DECLINED, codes.EXIT_OUTPUT} <= set(listed)
    assert codes.EXIT_GATE not in listed  # a pivot's, never a teardown's


def test_every_task_names_its_exit_codes_and_writes_none_by_hand():
    """Each task's --help lists its codes from the one table (program.exit_codes_help raises for a
    name not in it); a docstring that wrote its own list ("Exit 0 ...; 3 unreachable") would drift."""
    import tasks
    from scripts.cli.program import exit_codes_help

    for name, t in tasks.ns.tasks.items():
        assert {"ok", "usage", "output-failed", "interrupted"} <= set(t.exit_codes), name
        assert exit_codes_help(t.exit_codes, 78).startswith("Exit codes:")
        doc = re.sub(r"`[^`]*`", "", " ".join((t.__doc__ or "").split()))  # not what an example shows
        assert not re.search(r"\b[Ee]xits? \d|\b\d (unreachable|locked|timed out)", doc), (name, doc)


@HELP_GROUP
def test_every_tasks_help_fits_80_columns_without_cutting_a_word():
    names = task_names()
    assert "status" in names and "sandbox" in names
    for name in names:
        out = help_of(name)
        assert out.returncode == 0 and not too_wide(out.stdout.decode()), (name, too_wide(out.stdout.decode()))
    wide = invoke("status", "-h", env=columns(200)).stdout.decode()
    assert "(`HOST  GPUs free/total  holders  exit  verdict`" in " ".join(wide.split("\n"))  # spacing kept


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
