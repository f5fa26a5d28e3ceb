"""What `teardown` and `pivot` share: their teardown flags, the request built from them,
and the confirmation step (the plans and approvals themselves: scripts/ops/teardown.py).

Why one place: a pivot's teardown step must be the same teardown, asked about the same
way, as `invoke teardown`; a second copy of the argv drops flags (--wait-lock,
--max-used-mib, --settle) without a sign.
"""
from __future__ import annotations

import sys

from scripts.config import defaults
from scripts.config.defaults import num

from .common import dumps, operator, print_views

SELECTION_HELP = {
    "match": "extra target pattern, repeatable: a regex naming PROGRAMS (the executable, the module or script"
             " an interpreter runs, or a process title like sglang::scheduler_TP0), never an argument of"
             " another program; one matching the empty string ('', '.*') is refused",
    "only_matching": "stop only pattern matches and their trees; leave other GPU holders and report them",
    "disable": "also `systemctl disable` a unit that is stopped (e.g. an auto-started vLLM service)",
    "stop_starters": "also stop the targets' other related starters: a Python or node launcher, a watchdog"
                     " or a notebook kernel above a target, or beside it in its process group (by default the"
                     " job's own launchers and shell loops are stopped, these are frozen during the stop, thawed,"
                     " and named with exit 11)",
    "stop_supervisors": "the old name of --stop-starters, with its meaning",
    "all_users": "also stop another person's copy of a target program that holds no GPU here (by default a"
                 " target of a uid >= UID_MIN other than yours that holds no GPU is left and named)",
}

TEARDOWN_HELP = dict(
    SELECTION_HELP,
    grace=f"seconds between SIGTERM and SIGKILL (default {num(defaults.GRACE_S)})",
    timeout=f"seconds to wait for the GPUs to be free after that (default {num(defaults.TIMEOUT_S)})",
    wait_lock="wait this many seconds if another teardown holds the host's lock (default: fail at once, exit 4)",
    max_used_mib=f"count a GPU as free at or under this many MiB used (default {defaults.MAX_USED_MIB})",
    settle="seconds the GPUs must stay free after the targets are gone, to catch a respawn (default"
           f" {num(defaults.SETTLE_S)}, and none when nothing that could restart a target survives; given, the"
           " whole window is always watched)",
)

KEEP_SHM_HELP = ("keep what the stopped targets left in /dev/shm and System V shared memory (by default, once"
                 " FREED, what no live process holds, of the target's uid, made after it started, is removed)")

# Every exit code a teardown can give, by its name in codes.EXIT_CODES (`teardown --help` lists
# them with the table's meanings): not 5, a pivot's gate, and not 141, Invoke's own output's.
TEARDOWN_EXITS = (("ok", "every GPU free, verified, and nothing related that could start a target lives"),
                  "starter-alive", "not-free", "usage", "unreachable", "locked", "uninspected", "timed-out",
                  "declined", "unhealthy", "output-failed", "interrupted")

# The flag defaults, as strings: cliargs checks them (a typo is one line and exit 2, not a traceback).
GRACE, TIMEOUT = num(defaults.GRACE_S), num(defaults.TIMEOUT_S)
SETTLE = ""  # not given: the agent's own rule (defaults.SETTLE_S, or none when nothing can respawn)
WAIT_LOCK, MAX_USED_MIB = num(defaults.WAIT_LOCK_S), str(defaults.MAX_USED_MIB)


def request(match=None, only_matching=False, disable=False, grace=GRACE, timeout=TIMEOUT, wait_lock=WAIT_LOCK,
            max_used_mib=MAX_USED_MIB, settle=SETTLE, stop_starters=False, mps="protect", all_users=False,
            keep_shm=False):
    """The teardown the task flags ask for (requests.Teardown), each flag checked
    (ConfigError names it). Used by `invoke teardown`, `invoke plan` (its selection) and the
    teardown step of `invoke pivot`."""
    from scripts.agent.wire.requests import Teardown
    from scripts.config import cliargs
    from scripts.config.errors import ConfigError, show

    req = Teardown(
        match=tuple(cliargs.pattern("match", p) for p in match or []), only_matching=bool(only_matching),
        disable=bool(disable), stop_starters=bool(stop_starters), all_users=bool(all_users),
        grace=cliargs.seconds("grace", grace), timeout=cliargs.seconds("timeout", timeout),
        wait_lock=cliargs.seconds("wait-lock", wait_lock), max_used_mib=cliargs.whole("max-used-mib", max_used_mib),
        operator=operator(), settle=cliargs.seconds("settle", settle) if settle != SETTLE else None,
        mps_quit=mps == "quit", keep_shm=bool(keep_shm))
    if mps not in ("protect", "quit"):  # 'protect' is the agent's default
        raise ConfigError(f"--mps {show(mps)}: expected 'protect' or 'quit'")
    return req


def selection(match, only_matching: bool, disable: bool, stop_starters: bool = False, all_users: bool = False):
    """The plan (requests.Plan) of the targets the flags choose (a teardown takes the same), checked."""
    return request(match, only_matching, disable, stop_starters=stop_starters, all_users=all_users).plan()


def approve(hosts: list, selection, yes: bool, see: str, declined: dict | None = None) -> dict:
    """{alias: 'pid:start,...'} the person approved; {} with --yes (the agent then takes its
    own plan). Off a terminal without --yes nothing is signalled: `see` names what
    --dry-run shows instead ('the plan', 'the steps').

    `declined` (given with --json) is the document printed when the answer is no: stdout
    then holds one JSON document whatever the answer, because the plans and the prompt go
    to stderr (`invoke teardown -j > out.json` on a terminal)."""
    if yes:
        return {}
    if not sys.stdin.isatty():
        from scripts.config.errors import ConfigError

        raise ConfigError(f"not on a terminal and no --yes: refusing to signal anything (see {see} with --dry-run)")
    return confirm(hosts, selection, declined)


def show_plans(hosts: list, selection, out=None, json: bool = False) -> dict:
    """Print each host's teardown plan (what it would stop and keep, and why) to `out`
    (default stdout); returns {alias: 'pid:start,...'} of the targets shown. Used before the
    confirmation prompt and by `pivot --dry-run`, so what a person reads is what the teardown
    step would do. A host that cannot be planned stops it (with --json its failure is
    printed as the --json document first)."""
    from scripts.ops import teardown as teardown_op
    from scripts.views import teardown as teardown_view

    from .jsonout import failed

    outcomes = teardown_op.plans(hosts, selection)
    errors = {o.host.alias: o.error for o in outcomes if o.error is not None}
    if errors and json:
        print(dumps({alias: failed(e) for alias, e in errors.items()}), flush=True)
    shown = teardown_op.approvals(outcomes)  # raises the first host's error
    for o in outcomes:
        print_views(o.host, o.value.result, teardown_view.plan_tables, file=out)
    return shown


def confirm(hosts: list, selection, declined: dict | None = None) -> dict:
    """Show each host's plan and ask once; returns {alias: 'pid:start,...'} that was approved,
    so the agent signals only those (a process that appeared since is reported, not hit).
    With `declined` (--json) the plans and the prompt go to stderr and a "no" prints it."""
    from invoke import Exit

    from scripts.agent.wire import codes

    to = sys.stderr if declined is not None else sys.stdout
    approved = show_plans(hosts, selection, out=to, json=declined is not None)
    to.write("Signal the targets above? Only they will be signalled. [y/N] ")
    to.flush()
    answer = sys.stdin.readline().strip().lower()  # "" at Ctrl-D: no answer is no
    if answer not in ("y", "yes"):
        if declined is not None:
            print(dumps(declined), flush=True)
        raise Exit(DECLINED, code=codes.EXIT_DECLINED)
    return approved


DECLINED = "declined: nothing was signalled"


def declined_doc(hosts: list) -> dict:
    """teardown --json's document when the answer is no: every host, with its error and exit 8."""
    from scripts.agent.wire import codes

    return {h.alias: {"error": DECLINED, "exit_code": codes.EXIT_DECLINED} for h in hosts}
