"""Tasks about a host's GPUs: status, verify, plan, teardown."""
from __future__ import annotations

from scripts.config import defaults
from scripts.config.defaults import num

from . import teardown_args as td
from .common import HOST_HELP, codes, ctrl_c_continues, dumps, exit_worst, guarded, hosts_of, print_views
from .flags import task

VERIFY_WAIT = num(defaults.VERIFY_WAIT_S)


def _show(outcomes, json: bool, *views) -> None:
    """Each answering host's views (or all documents as JSON), then exit with the worst code."""
    from .jsonout import docs

    if json:
        print(dumps(docs(outcomes)))  # a failed host too: {alias: {"error", "exit_code"}}
    else:
        for out in outcomes:
            if out.error is None:
                print_views(out.host, out.value.result, *views)
    exit_worst(codes(outcomes, agent_code=True))


@task(help={"host": HOST_HELP, "json": "print the scan as JSON"})
@guarded
def status(c, host=defaults.HOST, json=False):
    """Show who holds each GPU: per-GPU memory table and holder table (protected ones marked).

    Also each GPU's health verdict (ok / reset needed / reboot needed / drain / unknown, with
    its reasons), its MIG mode and instances, and any CUDA MPS server with the clients it
    serves. Exit 0; 6 when some process could not be inspected (its open files are not
    readable by this user, so it may hold a GPU unseen: run as root); 3 unreachable.
    """
    from scripts.ops import fleet
    from scripts.reach.transport import call_agent
    from scripts.views import health as health_view, status as status_view

    outcomes = fleet.each_host(hosts_of(host), lambda h: call_agent(h, "scan"))
    _show(outcomes, json, status_view.gpu_table, health_view.health, health_view.mig, status_view.holder_table,
          health_view.mps, status_view.last_teardown)


@task(help={"host": HOST_HELP, "wait": "wait up to this many seconds until free",
            "max_used_mib": td.TEARDOWN_HELP["max_used_mib"],
            "json": "print the result as JSON"})
@guarded
def verify(c, host=defaults.HOST, wait=VERIFY_WAIT, max_used_mib=td.MAX_USED_MIB, json=False):
    """Exit 0 when every GPU is free (no compute process, 0 MiB used, no unprotected holder), else 1.

    Exit 6 when the only obstacle is processes this user could not inspect (run as root:
    a holder among them would be unseen, so FREE is never said). Exit 9 when free but a
    GPU's health verdict is drain, reset needed or reboot needed ("unknown" never changes
    the code); every GPU's verdict is printed with its reasons (JSON: gpus[].health).
    """
    from scripts.config import cliargs
    from scripts.ops import fleet
    from scripts.reach.transport import VerifyRequest, call_agent
    from scripts.views import health as health_view, status as status_view
    from scripts.views.render import Progress

    wait_s = cliargs.seconds("wait", wait)
    req = VerifyRequest(wait=wait_s, max_used_mib=cliargs.whole("max-used-mib", max_used_mib))
    targets = hosts_of(host)
    shown = Progress(live=len(targets) == 1)

    def one(h):
        on_progress = None if json or not wait_s else lambda p: shown.update(status_view.verify_progress(h.alias, p))
        return call_agent(h, "verify", req.argv(), on_progress=on_progress, deadline_s=req.deadline_s())

    outcomes = fleet.each_host(targets, one)
    shown.done()
    _show(outcomes, json, status_view.gpu_table, status_view.verdict, health_view.health, health_view.mps,
          status_view.still_holding)


@task(iterable=["match"], help=dict(td.SELECTION_HELP, host=HOST_HELP, json="print the result as JSON"))
@guarded
def plan(c, host=defaults.HOST, match=None, only_matching=False, disable=False, json=False, stop_supervisors=False):
    """Dry run: what a teardown would stop (targets, with why) and keep (protected), and the MiB it frees."""
    from scripts.ops import fleet
    from scripts.reach.transport import call_agent
    from scripts.views import status as status_view, teardown as teardown_view

    args = td.selection(match, only_matching, disable, stop_supervisors)
    outcomes = fleet.each_host(hosts_of(host), lambda h: call_agent(h, "plan", args))
    if json:
        from .jsonout import docs

        print(dumps(docs(outcomes)))
    else:
        for out in outcomes:
            if out.error is None:
                print_views(out.host, out.value.result, status_view.gpu_table, teardown_view.plan_tables)
    exit_worst(codes(outcomes))


@task(iterable=["match"], help=dict(
    td.TEARDOWN_HELP, host=HOST_HELP, json="print the result as JSON",
    dry_run="show the plan and signal nothing",
    yes="do not ask before signalling (required when not on a terminal)",
    fanout=f"hosts torn down at once (default {defaults.FANOUT})",
    mps="CUDA MPS: 'protect' (default) keeps the MPS control daemon and its server; 'quit' sends `quit` through"
        " its control pipe once the targets are gone and waits for the server to exit",
))
@guarded
def teardown(c, host=defaults.HOST, match=None, only_matching=False, disable=False, grace=td.GRACE,
             timeout=td.TIMEOUT, wait_lock=td.WAIT_LOCK, max_used_mib=td.MAX_USED_MIB, dry_run=False, yes=False,
             json=False, fanout=str(defaults.FANOUT), settle=td.SETTLE, mps="protect", stop_supervisors=False):
    """Free every GPU of the host(s) and prove it, harming nothing else.

    Order: lock the host; plan (targets + their trees and process groups, orphans holding a
    GPU; protected: PID 1, sshd, nvidia-persistenced, DCGM, exporters, monitors, this
    session); SIGTERM all targets at once; wake on each exit; SIGKILL what outlives --grace;
    verify the GPUs free (NVML v2, 0 MiB used; `free at` is printed then) and keep watching
    --settle seconds for a respawn (the exit code and the word FREED are that window's verdict). Targets are
    PROGRAMS named by a pattern (module, script, executable or process title), never a mere
    argument of another program. Exit 0 freed and verified, 1 done but
    not free, 2 bad input, 3 host unreachable or its state dir unusable (nothing signalled),
    4 locked by another teardown, 6 not every process could be inspected (run as root),
    9 freed but a GPU's health verdict is drain / reset needed / reboot needed (each GPU's
    verdict and its reasons are printed; `invoke reset` when it says reset), 130 Ctrl-C
    (the host side goes on).
    """
    from scripts.config import cliargs
    from scripts.ops import audit_log, fleet
    from scripts.reach.transport import call_teardown
    from scripts.views import teardown as teardown_view

    hosts = hosts_of(host)
    req = td.request(match, only_matching, disable, grace, timeout, wait_lock, max_used_mib, settle,
                     stop_supervisors, mps)
    width = cliargs.whole("fanout", fanout, minimum=1)
    if dry_run:
        return plan(c, host=host, match=match, only_matching=only_matching, disable=disable, json=json,
                    stop_supervisors=stop_supervisors)
    approved = td.approve(hosts, req.selection(), yes, "the plan",
                          td.declined_doc(hosts) if json else None)
    fleet_mode = len(hosts) > 1

    def one(h):
        shown = None if json or fleet_mode else teardown_view.TeardownProgress(h.alias, req.grace)
        try:
            result = call_teardown(h, td.approved_for(req, approved, h.alias),
                                   on_progress=None if shown is None else shown.update)
        finally:
            if shown is not None:
                shown.done()
        record = result.result  # a contract.TeardownResult: call_teardown's type says so
        if record.actions:
            audit_log.append(h.alias, record.actions)
        return result

    done = (lambda out: print(teardown_view.host_line(out), flush=True)) if fleet_mode and not json else None
    with ctrl_c_continues(hosts, "the teardown continues"):
        outcomes = fleet.each_host(hosts, one, width, on_done=done)
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
