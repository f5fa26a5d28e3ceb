"""What `teardown` and `pivot` share: their teardown flags, the agent argv built from them,
and the confirmation step.

Why one place: pivot had its own copy of the teardown argv and silently dropped
--wait-lock, --max-used-mib and --settle; a pivot's teardown step must be the same
teardown, asked about the same way, as `invoke teardown`.
"""
from __future__ import annotations

import sys

from scripts import defaults
from scripts.defaults import num

from .common import operator, print_views

SELECTION_HELP = {
    "match": "extra target pattern, repeatable: a regex naming PROGRAMS (the executable, the module or script"
             " an interpreter runs, or a process title like sglang::scheduler_TP0), never an argument of"
             " another program; one matching the empty string ('', '.*') is refused",
    "only_matching": "stop only pattern matches and their trees; leave other GPU holders and report them",
    "disable": "also `systemctl disable` a unit that is stopped (e.g. an auto-started vLLM service)",
}

TEARDOWN_HELP = dict(
    SELECTION_HELP,
    grace=f"seconds between SIGTERM and SIGKILL (default {num(defaults.GRACE_S)})",
    timeout=f"seconds to wait for the GPUs to be free after that (default {num(defaults.TIMEOUT_S)})",
    wait_lock="wait this many seconds if another teardown holds the host's lock (default: fail at once, exit 4)",
    max_used_mib=f"count a GPU as free at or under this many MiB used (default {defaults.MAX_USED_MIB})",
    settle="seconds the GPUs must stay free after the targets are gone, to catch a respawn"
           f" (default {num(defaults.SETTLE_S)})",
)

# The flag defaults, as strings: cliargs checks them (a typo is one line and exit 2, not a traceback).
GRACE, TIMEOUT, SETTLE = num(defaults.GRACE_S), num(defaults.TIMEOUT_S), num(defaults.SETTLE_S)
WAIT_LOCK, MAX_USED_MIB = num(defaults.WAIT_LOCK_S), str(defaults.MAX_USED_MIB)


def selection_args(match, only_matching: bool, disable: bool) -> list:
    """The agent flags that choose targets (plan and teardown take the same)."""
    from scripts import cliargs

    args = []
    for pattern in match or []:
        args.append("--match=" + cliargs.pattern("match", pattern))  # =: a pattern may start with "-"
    if only_matching:
        args.append("--only-matching")
    if disable:
        args.append("--disable")
    return args


def teardown_argv(match=None, only_matching=False, disable=False, grace=GRACE, timeout=TIMEOUT,
                  wait_lock=WAIT_LOCK, max_used_mib=MAX_USED_MIB, settle=SETTLE) -> list:
    """The agent's `teardown` arguments from the task flags, each checked (ConfigError names
    the flag). Used by `invoke teardown` and by the teardown step of `invoke pivot`."""
    from scripts import cliargs

    return selection_args(match, only_matching, disable) + [
        "--grace", cliargs.seconds("grace", grace), "--timeout", cliargs.seconds("timeout", timeout),
        "--wait-lock", cliargs.seconds("wait-lock", wait_lock),
        "--max-used-mib", cliargs.whole("max-used-mib", max_used_mib),
        "--settle", cliargs.seconds("settle", settle),
        "--operator", operator()]


def approve(hosts: list, selection: list, yes: bool, see: str) -> dict:
    """{alias: 'pid:start,...'} the person approved; {} with --yes (the agent then takes its
    own plan). Off a terminal without --yes nothing is signalled: `see` names what
    --dry-run shows instead ('the plan', 'the steps')."""
    if yes:
        return {}
    if not sys.stdin.isatty():
        from scripts.config_error import ConfigError

        raise ConfigError(f"not on a terminal and no --yes: refusing to signal anything (see {see} with --dry-run)")
    return confirm(hosts, selection)


def show_plans(hosts: list, selection: list) -> dict:
    """Print each host's teardown plan (what it would stop and keep, and why); returns
    {alias: 'pid:start,...'} of the targets shown. Used before the confirmation prompt and by
    `pivot --dry-run`, so what a person reads is what the teardown step would do."""
    from scripts import fleet, teardown_view
    from scripts.transport import call_agent

    outcomes = fleet.each_host(hosts, lambda h: call_agent(h, "plan", selection))
    shown = {}
    for out in outcomes:
        if out.error is not None:
            raise out.error
        print_views(out.host, out.value.result, teardown_view.plan_tables)
        shown[out.host.alias] = out.value.result.plan.approved()
    return shown


def confirm(hosts: list, selection: list) -> dict:
    """Show each host's plan and ask once; returns {alias: 'pid:start,...'} that was approved,
    so the agent signals only those (a process that appeared since is reported, not hit)."""
    from invoke import Exit

    from scripts.agent import contract

    approved = show_plans(hosts, selection)
    try:
        answer = input("Signal the targets above? Only they will be signalled. [y/N] ").strip().lower()
    except EOFError:  # Ctrl-D at the prompt: no answer is no
        answer = ""
    if answer not in ("y", "yes"):
        raise Exit("declined: nothing was signalled", code=contract.EXIT_DECLINED)
    return approved


def approved_args(approved: dict, alias: str) -> list:
    return ["--approved", approved[alias]] if alias in approved else []
