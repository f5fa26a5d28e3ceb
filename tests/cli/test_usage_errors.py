"""A command line Invoke's parser cannot read is bad input: exit 2 (usage) with one line naming
the word, the nearest task or flag for a typo, and nothing run; never 1, which means "done but
not free". Invoke's own --list, --help and --version still answer with 0."""
from __future__ import annotations

import pytest

from scripts.agent.wire import codes
from tests.conftest import invoke


@pytest.mark.parametrize("words,said", [
    (["teardwon", "--host", "sandbox"], "no task named 'teardwon' (did you mean teardown?)"),
    (["--help", "verfiy"], "no task named 'verfiy' (did you mean verify?)"),
    (["teardown", "--hots", "sandbox"], "`invoke teardown` has no flag '--hots' (did you mean --host?)"),
    (["teardown", "--host"], "--host needs a value"),
    (["status", "--host", "sandbox", "stray"], "`invoke status` takes no word 'stray'"),
    (["sandbox"], "'sandbox' did not receive required positional arguments: 'action'"),
])
def test_a_command_line_invoke_cannot_read_exits_2_with_one_line(words, said):
    out = invoke(*words)
    err = out.stderr.decode()
    assert out.returncode == codes.EXIT_USAGE, (words, out)
    assert out.stdout == b"" and err.count("\n") == 1, err
    assert err.startswith("gpu-pivot: ") and said in err and "nothing ran" in err, err


def test_a_word_near_no_task_gets_no_guess():
    err = invoke("xyzzy").stderr.decode()
    assert "no task named 'xyzzy'; nothing ran" in err and "did you mean" not in err


def test_a_core_flag_without_its_value_exits_2():
    """Read before tasks.py loads: the exit code comes from the output guard (.pth and tasks.py)."""
    out = invoke("--list-depth")
    assert out.returncode == codes.EXIT_USAGE and b"list-depth" in out.stderr, out


@pytest.mark.parametrize("words,shown", [
    (["--list"], "teardown"), (["--help"], "--list"), (["--version"], "Invoke"), (["teardown", "--help"], "--grace"),
])
def test_invokes_own_answers_still_exit_0(words, shown):
    out = invoke(*words)
    assert out.returncode == 0 and shown in out.stdout.decode(), out


@pytest.mark.parametrize("gpus,said", [("abc", "'abc' is not a GPU index"), ("-1", "'-1' is not a GPU index"),
                                       ("x,y", "'x' is not a GPU index"), ("0,,1", "'' is not a GPU index"),
                                       ("0,0", "names a GPU twice")])
def test_lint_launch_gpus_is_a_gpu_list_or_one_line_and_exit_2(gpus, said, hosts_env, tmp_path):
    """CUDA_VISIBLE_DEVICES as the launch will get it: `x,y` counted as two GPUs by the tensor-parallel
    check gives the server none; refused before the host is reached (its interpreter leaves a mark)."""
    mark, py = tmp_path / "ran", tmp_path / "python3"
    py.write_text(f"#!/bin/sh\n: > {mark}\nexec python3 \"$@\"\n")
    py.chmod(0o755)
    hosts_env(f"N01_PYTHON='{py}'\n")
    out = invoke("lint-launch", "--host", "n01", "--gpus", gpus, "--", "python3", "-m", "sglang.launch_server")
    err = out.stderr.decode()
    assert out.returncode == codes.EXIT_USAGE and err.count("\n") == 1 and said in err, err
    assert not mark.exists()
