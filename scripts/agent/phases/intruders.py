"""Who took a GPU between a pivot's teardown and its next phase's ready: intruders.

Why: a process outside the new phase that opens a GPU meanwhile is otherwise first seen as
the phase's out-of-memory error. Outside the phase means: not in the phase's process tree
(the pid its start recorded, that pid's session and descendants, its unit's members, and the
same for its prep jobs), not protected as the teardown's plan protects holders (monitors,
persistenced, the agent: scan.collect's `protected`, which also sets aside a device handle
with no CUDA context), and not a gpu-pivot agent or its child (another call's probe). Nothing
is signalled: the pivot names them (exit 13).
"""
from ..holders import scan
from ..policy import rules
from ..procs import cgroup, procscan
from ..wire import call


def _tree(pid, procs, kids):
    """`pid`, its descendants, and its session's members (a leader that setsid-ed)."""
    return {pid} | procscan.descendants(pid, kids) | {p for p, info in procs.items() if info.get("sid") == pid}


def phase_pids(state, procs):
    """Every pid of the started phase (state: phases/run.py's phase-NAME.json) in `procs`."""
    kids = procscan.children_map(procs)
    out: set = set()
    for leader in [state] + list(state.get("prep") or []):
        pid = leader.get("pid")
        if pid in procs and procs[pid].get("start_time") == leader.get("start_time"):
            out |= _tree(pid, procs, kids)
    if state.get("unit"):
        unit = state["unit"] + ".service"
        for pid in [p for p in procs if cgroup.read(p)["unit"] == unit]:
            out |= {pid} | procscan.descendants(pid, kids)
    return out


def _agents(procs):
    """gpu-pivot agents (argv shaped as one, and trusted: rules.trusted_names) and their children."""
    kids = procscan.children_map(procs)
    out: set = set()
    for pid, info in procs.items():
        if call.agent_call(info.get("argv") or []) and rules.trusted_names(info):
            out |= {pid} | procscan.descendants(pid, kids)
    return out


def find(sel, state):
    """The GPU holders now that are none of the phase's, protected, or an agent's: rows."""
    found = scan.collect(sel)
    procs = found.procs
    ours = phase_pids(state, procs) | _agents(procs)
    return [{"pid": h["pid"], "start_time": h["start_time"], "user": h.get("user"), "cmdline": h["cmdline"],
             "devices": h.get("devices") or [], "gpu_mib": h.get("gpu_mib") or {}}
            for h in found["holders"] if h["pid"] not in ours and not h.get("protected") and not h.get("gone")]
