"""What the host keeps of a started phase (phase-NAME.json in the run dir) and its processes.

Why here, below the subcommands: a phase's start writes it (phases/run.py), and its stop and
a teardown's checkpoint stop (teardown/checkpoint.py) both read it to find the phase's own
processes: those in its unit's cgroup (systemd-run), or in the session its leader made
(setsid), each as pid + start time so a reused pid is never taken for one of them.
"""
import os

from ..procs import cgroup, procfs, procscan
from . import lastrun, statedir


def state_path(name):
    """phase-NAME.json in the checked run dir (a name with a path separator is refused)."""
    if not name or "/" in name or "\0" in name or name in (".", ".."):
        raise ValueError("phase name %r: not a plain name" % name)
    return os.path.join(lastrun.run_dir(), "phase-%s.json" % name)


def load_state(name):
    try:
        return statedir.read_json(state_path(name))
    except (OSError, ValueError):
        return None


def save_state(state):
    """Atomic, O_EXCL temp file, never through a link (statedir.write_json_atomic)."""
    statedir.write_json_atomic(state_path(state["name"]), state)


def session_pids(state):
    """The processes of a phase: those in its unit's cgroup (systemd-run), or in the session
    its leader made (setsid). Returns (pids, {pid: basic info})."""
    procs = {pid: info for pid, info in ((p, procscan.basic(p)) for p in procscan.all_pids()) if info}
    if state.get("unit"):
        unit = state["unit"] + ".service"
        return [p for p in procs if cgroup.read(p)["unit"] == unit], procs
    return [p for p, info in procs.items() if info["sid"] == state["pid"]], procs


def members(state):
    """The phase's (or a prep job's) live processes as signal targets (pid + start time)."""
    pids, procs = session_pids(state)
    return [{"pid": p, "start_time": procs[p]["start_time"], "cmdline": procs[p]["cmdline"]} for p in pids]


def own_processes(state):
    """The phase's processes while its recorded leader (setsid) is still the same process,
    else []: a session id outlives its leader, and a new process may take its pid. The
    setsid leader is gpu-pivot's own `sh` wrapper (it records the exit code): left out, as
    the signal a job catches would end it. A systemd-run unit's are its cgroup's."""
    if state.get("unit"):
        return members(state)
    if not procfs.same_process(state["pid"], state["start_time"]):
        return []
    return [m for m in members(state) if m["pid"] != state["pid"]]
