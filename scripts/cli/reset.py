"""The reset task: reset one GPU once every precondition holds (a dry run unless --yes)."""
from __future__ import annotations

from scripts.config import defaults

from . import jsonout
from .common import HOST_HELP, dumps, exit_worst, guarded, one_host
from .flags import task


@task(exit_codes=(("not-free", "a precondition failed or a daemon runs outside systemd (nothing was run), the "
                               "reset failed, or with --quiesce a daemon or setting was not put back (named)"),
                  ("reboot-needed", "--quiesce: the reset failed with its blockers stopped; they were put back"),
                  "unreachable", "timed-out"),
      help={"host": HOST_HELP + "; exactly one host", "gpu": "index of the GPU to reset (as nvidia-smi numbers it)",
            "yes": "run the reset (default: check every precondition and show the command, run nothing)",
            "quiesce": "stop the daemons that block a reset (nvidia-persistenced, DCGM, dcgm-exporter, fabric "
                       "manager) through systemctl and turn persistence mode off first; both are put back after, "
                       "even when the reset fails. Never a default",
            "json": "print the result as JSON"})
@guarded
def reset(c, host=defaults.HOST, gpu="", yes=False, quiesce=False, json=False):
    """Reset one GPU (`nvidia-smi --gpu-reset -i N`) when a health verdict says "reset needed".

    Checks first, and shows each answer: no process holds the GPU (monitors included), no
    compute process on it, nvidia-persistenced handled, not a display GPU, no MIG instances,
    nothing running on its NVLink peers. A dry run unless --yes; a teardown never runs it.
    With --quiesce, in order: names and stops the blocking daemons through systemd (one no
    unit runs is named and the reset refused), turns persistence mode off, resets, starts
    every daemon again and puts persistence back (also when the reset failed), reads the
    GPU's health again. A reset that fails so ends in "reboot needed".
    """
    from scripts.agent.wire.requests import Reset
    from scripts.config import cliargs
    from scripts.config.errors import ConfigError
    from scripts.reach.transport import call_agent
    from scripts.views import reset as reset_view

    if gpu in ("", None):
        raise ConfigError("--gpu: required (the index of the GPU to reset, e.g. --gpu 0)")
    target = one_host(host)
    req = Reset(gpu=cliargs.whole("gpu", gpu), yes=bool(yes), quiesce=bool(quiesce))
    with jsonout.one_host(target.alias, json):
        result = call_agent(target, req)  # its deadline: the reset's and the units' waits
    if json:
        print(dumps({target.alias: result.doc}))
    else:
        print(reset_view.report(target.alias, result.result))
    exit_worst([result.code])
