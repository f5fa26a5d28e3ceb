"""Where the agent keeps state on the host: the last teardown's result (last.json).

Why on the host: a teardown must finish and be knowable even when the operator's ssh
connection drops mid-way; `invoke status` then shows what happened. The directory is
statedir.run_dir() (/run/gpu-pivot as root), created 0700 and checked before use.

Why the agent's identity in every record: a record that says "running" while its agent
is gone (killed, disk full, host rebooted) would say so forever; with pid + start time
(+ boot id) a reader tells a live teardown from an interrupted one.
"""
import os

from ..procs import procfs
from . import statedir
from .statedir import RUN_DIR_ENV, StateDirError  # noqa: F401  (re-exported for callers)

SUMMARY_KEYS = ("started", "finished", "operator", "exit_code", "verdict", "signalled", "stuck", "freed_mib", "wall_s",
                "state")


def run_dir():
    return statedir.run_dir()


def last_path():
    return os.path.join(run_dir(), "last.json")


def preflight():
    """Check, before anything is signalled, that state can be written; return the directory.

    Raises StateDirError whose text is one line naming the directory and the problem
    (squatted, loose, read-only, full): the caller exits 3 with nothing signalled.
    """
    return statedir.probe_writable(run_dir())


def _boot_id():
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return None


def agent_identity():
    """This agent process as (pid, start time, boot id): enough to tell later if it still runs."""
    pid = os.getpid()
    return {"pid": pid, "start_time": procfs.start_time(pid), "boot_id": _boot_id()}


def agent_alive(agent):
    if not isinstance(agent, dict) or agent.get("pid") is None or agent.get("start_time") is None:
        return False
    if agent.get("boot_id") and agent["boot_id"] != _boot_id():
        return False
    try:
        return procfs.same_process(int(agent["pid"]), int(agent["start_time"]))
    except (TypeError, ValueError):
        return False


def save(doc):
    """Write atomically (a reader never sees half a file); the record names this agent.

    Raises StateDirError or OSError (disk full, read-only): the caller decides whether
    that stops it (before a teardown) or is reported (during one).
    """
    out = dict(doc)
    out.setdefault("agent", agent_identity())
    statedir.write_json_atomic(last_path(), out)


def load():
    """The last record, None when there is none, or {"state": "unreadable", ...} when the
    directory or file is refused. A "running" record whose agent is gone reads "interrupted"."""
    try:
        doc = statedir.read_json(last_path())
    except FileNotFoundError:
        return None
    except StateDirError as exc:
        return {"state": "unreadable", "verdict": str(exc)}
    except (OSError, ValueError) as exc:
        return {"state": "unreadable", "verdict": "last.json: %s" % exc}
    if not isinstance(doc, dict):
        return {"state": "unreadable", "verdict": "last.json is not a JSON object"}
    if doc.get("state") == "running" and not agent_alive(doc.get("agent")):
        doc["state"] = "interrupted"
        if not doc.get("verdict"):
            doc["verdict"] = "the agent stopped before finishing (killed, host rebooted, or state not writable)"
    return doc


def load_summary():
    doc = load()
    if not doc:
        return None
    return {k: doc.get(k) for k in SUMMARY_KEYS}
