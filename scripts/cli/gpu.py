"""Tasks about a host's GPUs: status, verify, plan, teardown."""
from __future__ import annotations

from scripts.config import defaults
from scripts.config.defaults import num

from . import teardown_args as td
from .common import (
    HOST_HELP,
    READ_FANOUT_HELP,
    codes,
    ctrl_c_continues,
    dumps,
    exit_worst,
    fanout_width,
    guarded,
    hosts_of,
    print_views,
)
from .flags import task

VERIFY_WAIT = num(defaults.VERIFY_WAIT_S)


FLEET_HELP = """Over several hosts (`--host gpu[1-8]`, `gpu1,gpu2`): a summary first, one line per
    host in the order given (`HOST  GPUs free/total  holders  exit  verdict`, a host that did not
    answer as UNREACHABLE or TIMED OUT), then each host's details; --brief prints the summary
    alone. The fleet's exit code is the highest of its hosts' codes (each in its summary
    line's exit column, 0 too): e.g. 7 (a host timed out) over 6 over 3 (one unreachable) over 1 (one not free);
    0 only when every host gives 0."""
BRIEF_HELP = "over several hosts (or one): print only the summary, a line per host"


def _show(outcomes, json: bool, brief: bool, summary: str, *views, host_views=None) -> None:
    """The fleet's summary (over several hosts, or --brief), then each answering host's views
    (or all documents as JSON), then exit with the highest host's code. `host_views(host)`: the
    views of one host, in place of `views`, where a view reads its hosts.env keys too."""
    from .jsonout import docs

    if json:
        print(dumps(docs(outcomes)))  # a failed host too: {alias: {"error", "exit_code"}}
    else:
        if brief or len(outcomes) > 1:
            print(summary, flush=True)
        for out in outcomes if not brief else ():
            if out.error is None:
                print_views(out.host, out.value.result, *(host_views(out.host) if host_views else views))
    exit_worst(codes(outcomes, agent_code=True))


def _fleet_doc(fn):
    """The fleet's rules (FLEET_HELP) in a task's -h, written once for status and verify."""
    fn.__doc__ = (fn.__doc__ or "").replace("{fleet}", FLEET_HELP)
    return fn


def _brief_or_json(brief: bool, json: bool) -> None:
    if brief and json:
        from scripts.config.errors import ConfigError

        raise ConfigError("--brief and --json: choose one (--json has every host's whole document)")


def _no_gpu_is_not_free(r):
    """A scan of a host that shows no GPU at all exits 1 (not free), as verify does there, and
    its --json document says the same code: "no process holds a GPU" and exit 0 read as
    free on a host whose device glob matched nothing."""
    import dataclasses

    from scripts.agent.wire import codes as wire_codes
    from scripts.views.status import no_gpu_visible

    if r.code != wire_codes.EXIT_OK or not no_gpu_visible(r.result):
        return r
    return dataclasses.replace(r, code=wire_codes.EXIT_NOT_FREE, doc=dict(r.doc, exit_code=wire_codes.EXIT_NOT_FREE))


@task(exit_codes=(("not-free", "no GPU visible (no device file matches the glob and no GPU memory source); GPUs "
                                "held still exit 0: status shows, verify judges"),
                   "unreachable", "uninspected", "timed-out"),
      help={"host": HOST_HELP, "json": "print the scan as JSON", "brief": BRIEF_HELP, "fanout": READ_FANOUT_HELP})
@guarded
@_fleet_doc
def status(c, host=defaults.HOST, json=False, brief=False, fanout=str(defaults.READ_FANOUT)):
    """Show who holds each GPU: per-GPU memory table and holder table (protected ones marked).

    Also each GPU's health verdict (ok / not ready / reset needed / reboot needed /
    drain / unknown, with its reasons), its NVLink fabric state where NVML has one,
    its MIG mode and instances, and any CUDA MPS server with the clients it serves.
    No GPU visible (no device file matches the host's glob and no GPU memory source)
    is not free, as verify says; a process whose open files this user cannot read may
    hold a GPU unseen (uninspected: run as root).

    {fleet}
    """
    from scripts.agent.wire.requests import Scan
    from scripts.ops import fleet, gpu_settings
    from scripts.reach.transport import call_agent
    from scripts.views import fleet as fleet_view, health as health_view, status as status_view

    _brief_or_json(brief, json)
    width = fanout_width(fanout)
    outcomes = fleet.each_host(hosts_of(host), lambda h: _no_gpu_is_not_free(call_agent(h, Scan())), width)
    summary = "" if json else fleet_view.summary(outcomes, fleet_view.status_verdict)
    _show(outcomes, json, brief, summary, host_views=lambda h: (
        status_view.visible, status_view.gpu_table, status_view.settings_of(h, gpu_settings.last_pivot_phase(h)),
        health_view.fabric, health_view.health, health_view.mig, status_view.holder_table, health_view.mps,
        status_view.last_teardown))


@task(exit_codes=(("ok", "every GPU free, verified"), "not-free", "unreachable", "uninspected", "timed-out",
                  "unhealthy"),
      help={"host": HOST_HELP, "wait": "wait up to this many seconds until free",
            "probe": "once free, prove each GPU usable: a CUDA context, a test buffer (the host's PROBE_MIB, "
                     "default 64 MiB) allocated, touched and freed; a failure is unhealthy",
            "max_used_mib": td.TEARDOWN_HELP["max_used_mib"],
            "json": "print the result as JSON", "brief": BRIEF_HELP, "fanout": READ_FANOUT_HELP})
@guarded
@_fleet_doc
def verify(c, host=defaults.HOST, wait=VERIFY_WAIT, max_used_mib=td.MAX_USED_MIB, json=False, brief=False,
           fanout=str(defaults.READ_FANOUT), probe=False):
    """Prove every GPU free (no compute process, 0 MiB used, no unprotected holder), or say what holds it.

    Not free too when no GPU is visible at all. Uninspected when the only obstacle is
    processes this user could not inspect (run as root: a holder among them would be unseen,
    so FREE is never said). Unhealthy when free but a GPU's health verdict is drain, reset
    needed or reboot needed ("unknown" never changes the code); every GPU's verdict is printed
    with its reasons (JSON: gpus[].health). With --probe, once free, each GPU
    also gets a CUDA context and a test buffer (found by UUID; timed); a failed,
    hung or fabric-blocked probe is unhealthy too (JSON: gpus[].probe).

    {fleet}
    """
    from scripts.agent.wire.requests import Verify
    from scripts.config import cliargs
    from scripts.ops import fleet
    from scripts.reach.transport import call_agent
    from scripts.views import fleet as fleet_view, health as health_view, status as status_view
    from scripts.views.render import Progress

    wait_s = cliargs.seconds("wait", wait)
    mib = cliargs.whole("max-used-mib", max_used_mib)
    _brief_or_json(brief, json)
    width = fanout_width(fanout)
    targets = hosts_of(host)
    shown = Progress(live=len(targets) == 1)

    def one(h):
        req = Verify(wait=wait_s, max_used_mib=mib, probe_mib=h.probe_mib if probe else None)
        quiet = json or brief or not wait_s  # --brief: the summary alone, no progress lines before it
        on_progress = None if quiet else lambda p: shown.update(status_view.verify_progress(h.alias, p))
        return call_agent(h, req, on_progress=on_progress)

    outcomes = fleet.each_host(targets, one, width)
    shown.done()
    summary = "" if json else fleet_view.summary(outcomes, fleet_view.verify_verdict, mib)
    _show(outcomes, json, brief, summary, status_view.gpu_table, status_view.verdict, health_view.fabric,
          health_view.probe, health_view.health, health_view.mps, status_view.still_holding)


@task(iterable=["match"], exit_codes=(("ok", "the plan was made; nothing was signalled"), "unreachable", "timed-out"),
      help=dict(td.SELECTION_HELP, host=HOST_HELP, json="print the result as JSON", fanout=READ_FANOUT_HELP))
@guarded
def plan(c, host=defaults.HOST, match=None, only_matching=False, disable=False, json=False, stop_starters=False,
         stop_supervisors=False, all_users=False, fanout=str(defaults.READ_FANOUT)):
    """Dry run: what a teardown would stop (targets, with why) and keep (protected), and the MiB it frees."""
    from scripts.ops import teardown as teardown_op
    from scripts.views import status as status_view, teardown as teardown_view

    req = td.selection(match, only_matching, disable, stop_starters or stop_supervisors, all_users)
    width = fanout_width(fanout)
    outcomes = teardown_op.plans(hosts_of(host), req, width)
    if json:
        from .jsonout import docs

        print(dumps(docs(outcomes)))
    else:
        for out in outcomes:
            if out.error is None:
                print_views(out.host, out.value.result, status_view.gpu_table, teardown_view.plan_tables)
    exit_worst(codes(outcomes))


@task(iterable=["match"], exit_codes=td.TEARDOWN_EXITS, help=dict(
    td.TEARDOWN_HELP, host=HOST_HELP, json="print the result as JSON",
    dry_run="show the plan and signal nothing",
    yes="do not ask before signalling (required when not on a terminal)",
    fanout=f"hosts torn down at once (default {defaults.FANOUT})",
    keep_shm=td.KEEP_SHM_HELP,
    mps="CUDA MPS: 'protect' (default) keeps the MPS control daemon and its server; 'quit' sends `quit` through"
        " its control pipe once the targets are gone and waits for the server to exit",
))
@guarded
def teardown(c, host=defaults.HOST, match=None, only_matching=False, disable=False, grace=td.GRACE,
             timeout=td.TIMEOUT, wait_lock=td.WAIT_LOCK, max_used_mib=td.MAX_USED_MIB, dry_run=False, yes=False,
             json=False, fanout=str(defaults.FANOUT), settle=td.SETTLE, mps="protect", stop_starters=False,
             stop_supervisors=False, all_users=False, keep_shm=False):
    """Free every GPU of the host(s) and prove it, harming nothing else.

    Order: lock the host; plan (targets + their trees and process groups, orphans
    holding a GPU; protected: PID 1, sshd, nvidia-persistenced, DCGM, exporters,
    monitors, this session); SIGTERM all targets at once; wake on each exit;
    SIGKILL what outlives --grace; verify the GPUs free (NVML v2, 0 MiB used;
    `free at` is printed then) and keep watching --settle seconds for a respawn
    (the exit code and the word FREED are that window's verdict). Targets are
    PROGRAMS named by a pattern (module, script, executable or process title),
    never a mere argument of another program. A GPU's health verdict of reset
    needed: `invoke reset`. Several hosts exit with the highest of their codes.
    """
    from scripts.ops import teardown as teardown_op
    from scripts.views import teardown as teardown_view

    hosts = hosts_of(host)
    req = td.request(match, only_matching, disable, grace, timeout, wait_lock, max_used_mib, settle,
                     stop_starters or stop_supervisors, mps, all_users, keep_shm)
    width = fanout_width(fanout)
    if dry_run:
        return plan(c, host=host, match=match, only_matching=only_matching, disable=disable, json=json,
                    stop_starters=stop_starters or stop_supervisors, all_users=all_users)
    approved = td.approve(hosts, req.plan(), yes, "the plan",
                          td.declined_doc(hosts) if json else None)
    fleet_mode = len(hosts) > 1
    quiet = json or fleet_mode
    done = (lambda out: print(teardown_view.host_line(out), flush=True)) if fleet_mode and not json else None
    with ctrl_c_continues(hosts, "the teardown continues"):
        outcomes = teardown_op.on_hosts(
            hosts, req, approved, width, on_done=done,
            progress_for=lambda h: None if quiet else teardown_view.TeardownProgress(h.alias, req.grace))
    results = codes(outcomes, agent_code=True)
    if json:
        from .jsonout import docs

        print(dumps(docs(outcomes)))
    elif fleet_mode:
        for out in outcomes:  # details only where something needs a person
            if out.error is None and out.value.code:
                print(teardown_view.report(out.host.alias, out.value, out.host.sandbox))
        print(teardown_view.summary(outcomes))
    elif outcomes[0].error is None:
        print(teardown_view.report(hosts[0].alias, outcomes[0].value, hosts[0].sandbox))
    exit_worst(results)
