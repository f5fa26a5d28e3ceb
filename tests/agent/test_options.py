"""The agent's options: one typed record made once from argparse's answer, and nothing parked on it.

Rules protected here:
- every flag of every subcommand is a field of record.Options (cli.parse makes one for each
  subcommand), a flag a subcommand lacks reads None (False for a switch), and nothing else can
  be set on it: no module keeps its own state on the options (a Namespace took anything);
- the settle window not given is the default one, marked as such (settle_auto);
- progress lines go out only when asked for, and stop, without failing, once stdout is gone;
- a pattern that is no regex, or matches every process, is one line and exit 2.
"""
from __future__ import annotations

import io

import pytest

from scripts.agent import cli
from scripts.agent.options import record
from scripts.agent.options.record import Options
from scripts.agent.wire import call, codes, defaults
from tests.support.subcommand_args import REQUIRED


@pytest.mark.parametrize("subcommand", list(call.SUBCOMMANDS))
def test_each_subcommand_parses_into_the_one_options_record(subcommand):
    opts = cli.parse([subcommand, *REQUIRED.get(subcommand, [])])
    assert type(opts) is Options and opts.command == subcommand
    assert opts.devices == defaults.DEVICE_GLOB and opts.fake_devices is False
    if subcommand in call.SELECTING:
        assert (opts.protect, opts.target, opts.match) == ([], [], [])
    else:  # no selection flags: absent, not an empty selection (no target marks are made)
        assert (opts.protect, opts.target, opts.match, opts.scope) == (None, None, None, None)
    with pytest.raises(AttributeError):
        opts.devset = object()  # type: ignore[attr-defined]  # nothing parks its own state on the options


def test_a_field_the_record_lacks_is_refused_and_an_absent_flag_reads_none_or_false():
    with pytest.raises(TypeError, match="no field dry_run"):
        Options(dry_run=True)
    opts = Options(devices="/tmp/x*")
    assert (opts.scope_uid, opts.yes, opts.only_matching, opts.max_used_mib) == (None, False, False,
                                                                               defaults.MAX_USED_MIB)


def test_the_settle_window_not_given_is_the_default_and_may_be_cut_short():
    auto = cli.parse(["teardown"])
    given = cli.parse(["teardown", "--settle", "0.5"])
    assert (auto.settle, auto.settle_auto) == (defaults.SETTLE_S, True)
    assert (given.settle, given.settle_auto) == (0.5, False)


class _GoneStdout(io.StringIO):
    def write(self, text):
        raise BrokenPipeError(32, "Broken pipe")


def test_progress_lines_only_when_asked_and_not_after_stdout_is_gone(monkeypatch):
    out = io.StringIO()
    monkeypatch.setattr("sys.stdout", out)
    Options().emit_progress(phase="grace")
    assert out.getvalue() == ""
    talking = Options(progress=True)
    talking.emit_progress(phase="grace", alive=[7])
    assert out.getvalue().startswith("gpu-pivot-progress ") and '"alive": [7]' in out.getvalue()
    monkeypatch.setattr("sys.stdout", _GoneStdout())
    talking.emit_progress(phase="sigkill")  # the connection dropped: no exception, and no more lines
    assert talking.progress is False


def test_check_patterns_names_the_bad_one_before_anything_runs():
    with pytest.raises(codes.UsageError, match="--match '.\\*': matches the empty string"):
        record.check_patterns(cli.parse(["scan", "--match", ".*"]))


@pytest.mark.parametrize("scope", ["", "   "])
def test_an_empty_scope_is_a_usage_error_not_the_whole_host(scope, capsys):
    """`--scope ''` narrows nothing: the agent refuses it (exit 2, one line) before any scan, as
    the local side refuses an empty ALIAS_SCOPE, since a scope variable that expanded to nothing
    must not become a teardown of every process."""
    code = cli.main(["plan", "--devices=/proc/gpu-pivot-none/x", "--fake-devices", "--scope=" + scope])
    out = capsys.readouterr().out
    assert code == 2 and "--scope" in out and "narrows nothing" in out


@pytest.mark.parametrize("argv,flag", [
    (["verify", "--wait", "nan"], "--wait"), (["verify", "--wait", "inf"], "--wait"),
    (["verify", "--wait", "-1"], "--wait"),
    (["verify", "--max-used-mib", "-5"], "--max-used-mib"), (["plan", "--scope-uid", "-1"], "--scope-uid"),
    (["scan", "--run-dir", "relative"], "--run-dir"), (["scan", "--devices", "relative*"], "--devices"),
    (["scan", "--devices", ""], "--devices"),
    (["drain", "--url", "http://127.0.0.1:9/metrics", "--timeout", "nan"], "--timeout"),  # a drain poll never ends
    (["teardown", "--grace", "nan"], "--grace"), (["teardown", "--settle", "-1"], "--settle"),
    (["teardown", "--wait-lock", "inf"], "--wait-lock"),
])
def test_the_agent_run_by_itself_refuses_values_no_subcommand_should_act_on(argv, flag, capsys):
    """Run by itself (an epilog, a pasted command) nothing checked the values first: a wait of nan
    would never end, a negative uid or threshold or a relative path means nothing it could act on.
    One line naming the flag, exit 2, before any scan."""
    code = cli.main(argv)
    out = capsys.readouterr().out
    assert code == 2 and flag in out, out
