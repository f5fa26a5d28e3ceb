"""The ledger of processes a teardown froze (SIGSTOP), so a freeze is never left behind.

Why: a teardown freezes the starters related to its targets while it stops them
(teardown/freeze.py), and thaws or ends them after. An agent that dies in between (SIGKILL,
an OOM, a reboot of nothing but the agent) would leave someone's launcher or notebook kernel
stopped for ever. So the ledger (run_dir()/frozen.json: the agent and every (pid, start
time) it froze) is written before the first SIGSTOP, and every agent call, whatever its
subcommand, first looks for a ledger whose agent is gone: each process of it that is still
the same process and still stopped gets SIGCONT, written to the audit log. A ledger whose
agent still runs is that teardown's own, and left alone.
"""
import os

from ..procs import procfs
from . import lastrun, statedir

NAME = "frozen.json"


def path():
    return os.path.join(statedir.run_dir(), NAME)


def write(frozen):
    """Write the ledger of `frozen` [{pid, start_time, cmdline}] for this agent (before the
    SIGSTOPs it lists); remove it when the list is empty."""
    if not frozen:
        clear()
        return
    statedir.write_json_atomic(path(), {"agent": lastrun.agent_identity(), "frozen": [
        {"pid": f["pid"], "start_time": f["start_time"], "cmdline": (f.get("cmdline") or "")[:200]} for f in frozen]})


def clear():
    try:
        os.unlink(path())
    except FileNotFoundError:
        pass


def recover(operator="gpu-pivot"):
    """SIGCONT what a dead teardown left frozen (module docstring); returns the audit records
    ([] when there was nothing to do). Never raises: the call it precedes matters more."""
    try:
        if not os.path.exists(os.path.join(statedir.run_dir(), NAME)):
            return []
        doc = statedir.read_json(path())
    except (OSError, ValueError):
        return []
    if not isinstance(doc, dict) or lastrun.agent_alive(doc.get("agent")):
        return []
    import signal

    from .auditlog import Audit

    audit = Audit(operator)
    for item in doc.get("frozen") or []:
        try:
            pid, start = int(item["pid"]), int(item["start_time"])
        except (KeyError, TypeError, ValueError):
            continue
        stat = procfs.read_stat(pid)
        if stat is None or stat["start_time"] != start or stat["state"] not in ("T", "t"):
            continue
        result = procfs.signal_if_same(pid, start, signal.SIGCONT)
        audit.log(dict(item, pid=pid, start_time=start), "SIGCONT (left frozen by a teardown that died)", result)
    clear()
    return audit.records
