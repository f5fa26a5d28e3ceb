"""The `undrain` task: resume drained Slurm nodes once their GPUs verify free."""
from __future__ import annotations

from invoke import Exit

from .common import HOST_HELP, exit_worst, guarded, hosts_of, one_line as escaped
from .flags import task


@task(exit_codes=(("not-free", "a node was not clean or could not be resumed: it stays drained"), "unreachable"),
      help={
    "host": HOST_HELP + "; each alias is the node's Slurm name",
    "force": "also resume nodes drained for a reason that is not about GPU leftovers (after a clean verify)"})
@guarded
def undrain(c, host="", force=False):
    """Verify each drained node's GPUs over ssh and resume (scontrol) only the clean ones; one line per node.

    Only nodes drained by gpu-pivot's epilog or prolog, or by Slurm's own "Epilog error",
    "Prolog error" or "Kill task failed", are resumed unless --force. A node that stays drained
    is not free (what holds its GPUs is printed); one that could not be verified, unreachable.
    """
    from scripts.agent.wire.requests import Verify
    from scripts.engines import undrain as logic
    from scripts.ops import fleet
    from scripts.reach.transport import call_agent

    if not host:
        raise Exit("gpu-pivot: --host is required: the Slurm nodes to undrain, e.g. --host 'node[1-8]'", code=2)
    hosts = hosts_of(host)
    try:
        results = logic.undrain(hosts, force, lambda h: call_agent(h, Verify()), fleet.each_host)
    except logic.SlurmError as exc:
        from scripts.agent.wire import codes

        # one line: sinfo's stderr may have several (e.g. it cannot reach slurmctld)
        one_line = " | ".join(line.strip() for line in str(exc).splitlines() if line.strip())
        raise Exit(f"gpu-pivot: {one_line}", code=codes.EXIT_UNREACHABLE) from None
    for r in results:
        print(escaped(r.line()))  # a node's answer holds host text (a holder's name): escaped
    exit_worst([r.code for r in results])
