"""Where the agent keeps state on the host: the last teardown's result, its audit log, the lock.

Why on the host: a teardown must finish and be knowable even when the operator's ssh
connection drops mid-way; `invoke status` then shows what happened. /run/gpu-pivot when
root (tmpfs: cleared at reboot, like the GPUs' state), else a per-user temp dir.
"""
import json
import os
import tempfile

RUN_DIR_ENV = "GPU_PIVOT_RUN_DIR"


def run_dir():
    path = os.environ.get(RUN_DIR_ENV)
    if not path:
        path = "/run/gpu-pivot" if os.geteuid() == 0 else os.path.join(tempfile.gettempdir(), "gpu-pivot-%d" % os.getuid())
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path


def last_path():
    return os.path.join(run_dir(), "last.json")


def save(doc):
    """Write atomically: a reader never sees half a file, even if we are killed mid-write."""
    path = last_path()
    tmp = path + ".tmp.%d" % os.getpid()
    with open(tmp, "w") as f:
        json.dump(doc, f, sort_keys=True, default=str)
    os.replace(tmp, path)


def load():
    try:
        with open(last_path()) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def load_summary():
    doc = load()
    if not doc:
        return None
    keys = ("started", "finished", "operator", "exit_code", "verdict", "signalled", "stuck", "freed_mib", "wall_s", "state")
    return {k: doc.get(k) for k in keys}
