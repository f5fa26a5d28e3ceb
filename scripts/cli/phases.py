"""Tasks about the work on a host: start, stop, logs, lint-launch, pivot."""
from __future__ import annotations

from invoke import Exit

from scripts.config import defaults

from . import jsonout, teardown_args as td
from .common import HOST_HELP, ctrl_c_continues, dumps, guarded, one_host, operator
from .flags import task

# Every code a pivot can give, by its name in codes.EXIT_CODES (`pivot --help` lists them)
PIVOT_EXITS = (("ok", "the next phase started and is ready"),
               ("starter-alive", "the teardown left a related starter alive: nothing started"),
               ("not-free", "not free after the teardown, or the phase did not start or get ready (rolled back "
                            "where a deploy says so)"),
               "unreachable", "locked", "gate-failed", "uninspected", "timed-out", "declined", "unhealthy",
               ("intruder", "a process outside the new phase opened a GPU between the teardown and ready (named)"))
JSON_HELP = "print the host's answer as JSON, {alias: document}, as status and teardown do"


def _print_log_line(text: str) -> None:
    """One line of a followed log, as it comes: the host's text, escaped (no escape sequence or
    bidi override reaches the terminal raw: render.safe), one line out per line in."""
    import sys

    from scripts.views.render import safe

    sys.stdout.write(safe(text) + "\n")
    sys.stdout.flush()


def _json(r) -> None:
    """The agent's document for this host, printed the way every --json task prints one host's."""
    print(dumps({r.host: r.doc}))


@task(exit_codes=(("not-free", "the phase did not start"), "unreachable", "timed-out"),
      help={"host": HOST_HELP, "phase": "phase name (see `invoke hosts --json` / hosts.env.example)",
            "json": JSON_HELP})
@guarded
def start(c, host=defaults.HOST, phase="", json=False):
    """Start a configured phase so it outlives the ssh session.

    Under systemd-run where systemd is PID 1, else setsid with a log file and a pid file.
    """
    from scripts.agent.wire import codes
    from scripts.ops import phase as phase_ops
    from scripts.views import phase as phase_view
    from scripts.views.render import fit

    h = one_host(host)
    ph = phase_ops.phase_of(h, phase)
    with jsonout.one_host(h.alias, json):
        r = phase_ops.start(h, ph)
    if json:
        _json(r)
    if r.code:
        raise Exit(f"gpu-pivot: {h.alias}: phase {ph.name}: {phase_view.start_line(r)}", code=codes.EXIT_NOT_FREE)
    if not json:
        print(fit(f"{h.alias}: phase {ph.name} {phase_view.start_line(r)}"))


@task(exit_codes=(("not-free", "the phase could not be stopped (it still runs)"), "unreachable", "timed-out"),
      help={"host": HOST_HELP, "phase": "phase name",
                                                                   "json": JSON_HELP})
@guarded
def stop(c, host=defaults.HOST, phase="", json=False):
    """Stop a phase started by gpu-pivot: systemctl stop, or SIGTERM its session and SIGKILL after its stop timeout."""
    from scripts.agent.wire import codes
    from scripts.ops import audit_log, phase as phase_ops
    from scripts.views import phase as phase_view
    from scripts.views.render import fit

    h = one_host(host)
    ph = phase_ops.phase_of(h, phase)
    with jsonout.one_host(h.alias, json):
        r = phase_ops.stop(h, ph, operator())
    if r.result.actions:
        audit_log.append(h.alias, r.result.actions)
    if json:
        _json(r)
    else:
        print(fit(f"{h.alias}: phase {ph.name}: {phase_view.stop_line(r)}"))
    if r.code:
        raise Exit(code=codes.EXIT_NOT_FREE)


@task(exit_codes=(("not-free", "the phase's log could not be read"), "unreachable", "timed-out"),
      help={"host": HOST_HELP, "phase": "phase name", "lines": f"how many lines (default {defaults.LOG_LINES})",
            "follow": "keep printing new lines until Ctrl-C", "json": JSON_HELP + " (not with --follow)"})
@guarded
def logs(c, host=defaults.HOST, phase="", lines=str(defaults.LOG_LINES), follow=False, json=False):
    """Show a phase's log (its log file, or journald for a systemd-run unit)."""
    from scripts.agent.wire import codes
    from scripts.config import cliargs
    from scripts.config.errors import ConfigError
    from scripts.ops import phase as phase_ops

    h = one_host(host)
    ph = phase_ops.phase_of(h, phase)
    n = cliargs.whole("lines", lines)
    if follow:
        if json:
            raise ConfigError("--json and --follow: pick one (--follow prints lines as they come)")
        code, doc = phase_ops.follow_logs(h, ph, n, _print_log_line)
        if doc is not None and doc.get("error"):  # e.g. the phase was never started there
            raise Exit(f"gpu-pivot: {h.alias}: {doc['error']}", code=codes.EXIT_NOT_FREE)
        raise Exit(code=code)
    with jsonout.one_host(h.alias, json):
        r = phase_ops.logs(h, ph, n)
    if json:
        _json(r)
    if r.code:
        raise Exit(f"gpu-pivot: {h.alias}: {r.result.error}", code=codes.EXIT_NOT_FREE)
    if not json:
        from scripts.views.render import safe

        print("\n".join(safe(line) for line in r.result.lines))  # the host's log lines, each escaped


@task(remainder=True, exit_codes=("unreachable", "gate-failed", "timed-out"),
      help={"host": HOST_HELP, "gpus": "CUDA_VISIBLE_DEVICES the server will get (e.g. 0,1)", "json": JSON_HELP})
@guarded
def lint_launch(c, host=defaults.HOST, gpus="", json=False):
    """Check a server launch command (after `--`) on the host for known mistakes.

    EAGLE vs EAGLE3 draft, TP > GPUs, port taken, model/draft path missing, GPUs not free.
    A finding exits as a gate that blocks a pivot's start.
    """
    from scripts.config import cliargs
    from scripts.config.errors import ConfigError
    from scripts.ops import phase as phase_ops
    from scripts.views import phase as phase_view
    from scripts.views.render import fit

    argv = cliargs.remainder()
    if not argv:
        raise ConfigError("lint-launch needs the launch command after `--`")
    gpus = cliargs.gpu_list("gpus", gpus) if gpus else ""
    h = one_host(host)
    with jsonout.one_host(h.alias, json):
        r = phase_ops.lint(h, argv, gpus or None)
    if json:
        _json(r)
    for line in [] if json else phase_view.lint_lines(r) or [phase_view.lint_ok(r)]:
        print(fit(f"{h.alias}: {line}"))
    if r.code:
        raise Exit(code=r.code)


@task(iterable=["match"], exit_codes=PIVOT_EXITS, help=dict(
    {k: "teardown: " + v for k, v in td.TEARDOWN_HELP.items()}, host=HOST_HELP, to="the phase to move to",
    dry_run="print every step and run none", yes="do not ask before the teardown",
    force="start even if the launch lint finds problems", drain="the running server's /metrics URL to drain first",
    no_drain="skip the drain: requests in flight are cut off (without it, a /metrics that cannot be read stops "
             "the pivot before its teardown)",
    json="print the steps (step, result, exit, seconds) and the verdict as JSON",
    ready_timeout="override the phase's readiness timeout (seconds)"))
@guarded
def pivot(c, host=defaults.HOST, to="", match=None, only_matching=False, disable=False, dry_run=False, yes=False,
          force=False, drain="", grace=td.GRACE, timeout=td.TIMEOUT, wait_lock=td.WAIT_LOCK,
          max_used_mib=td.MAX_USED_MIB, settle=td.SETTLE, ready_timeout="", no_drain=False, json=False,
          stop_starters=False, stop_supervisors=False, all_users=False):
    """Move a host to the next phase: drain, teardown, gates, launch lint, start, wait ready, audit.

    The teardown step takes the same flags as `invoke teardown` and asks the same way. A drain
    whose /metrics is unreadable or still busy (see --no-drain) blocks the start as a gate does.
    """
    import re

    from scripts.agent.wire import codes
    from scripts.cli.pivot_words import WORDS
    from scripts.config import cliargs
    from scripts.config.errors import ConfigError, show
    from scripts.ops import phase as phase_ops, teardown as teardown_op
    from scripts.ops.pivot import Pivot, PivotOptions
    from scripts.views.render import fit

    h = one_host(host)
    with cliargs.named("--phase", "--to"):  # the pivot's flag for a phase
        ph = phase_ops.phase_of(h, to)
    if drain and not re.match(r"^https?://\S+$", drain):
        raise ConfigError(f"--drain {show(drain)}: must be an http(s) URL")
    if drain and no_drain:
        raise ConfigError(f"--drain {show(drain)} and --no-drain: pick one (drain first, or skip the drain)")
    td_req = td.request(match, only_matching, disable, grace, timeout, wait_lock, max_used_mib, settle,
                        stop_starters or stop_supervisors, all_users=all_users)
    selection = td_req.plan()
    rt = cliargs.seconds("ready-timeout", ready_timeout) if ready_timeout else None
    if not dry_run:
        declined = {"event": "pivot", "host": h.alias, "to": ph.name, "steps": [], "verdict": td.DECLINED,
                    "exit_code": codes.EXIT_DECLINED} if json else None
        approved = td.approve([h], selection, yes, "the steps", declined)
        td_req = teardown_op.for_host(td_req, approved, h.alias)
    elif not json:  # what the teardown step would stop and keep, as `teardown --dry-run` shows it
        td.show_plans([h], selection)
    opts = PivotOptions(teardown=td_req, drain_url=drain or None, no_drain=no_drain, dry_run=dry_run,
                        force=force, operator=operator(), ready_timeout=rt)
    with ctrl_c_continues([h], "the pivot stops here; a teardown already under way continues"):
        # each line fitted to the screen here: the pivot (scripts/ops) says what, the view how wide
        def say(line: str) -> None:
            print(fit(line), flush=True)

        run = Pivot(h, ph, opts, WORDS, out=(lambda line: None) if json else say)
        code = run.run()
    if json:
        from .common import dumps

        print(dumps(run.record if not dry_run else {"dry_run": True, "steps": [
            {"step": name, "plan": what} for name, _, what in run.steps]}))
    if code:
        raise Exit(code=code)
