"""`reset --quiesce`: stop the daemons that block a GPU reset through their manager, turn
persistence mode off, reset, then put every daemon and setting back, even when the reset fails.

Why through systemd only: these daemons serve other people on a shared host (DCGM's metrics,
the fabric of every NVSwitch GPU); a unit is started again as it was, a process signalled by
pid is not. A daemon no unit runs is named and the reset refused. Why persistence by hand:
`nvidia-smi --gpu-reset` turns persistence off and on again itself only through
nvidia-persistenced's socket (NVSentinel #1243), and the daemon is stopped here; persistence
left on is "In use by another client" (NVSentinel #1690). Order as NVSentinel #1692 and #1240.
"""
import subprocess

from ..gpu import gpuinfo, settings, settings_write
from ..policy import rules
from ..procs import cgroup
from . import plan

# (what it is, the names its process goes by, the units that run it where none is seen running)
DAEMONS = (
    ("nvidia-persistenced", ("nvidia-persistenced", "nvidia-persiste"), ("nvidia-persistenced.service",)),
    ("nv-hostengine (DCGM)", ("nv-hostengine",), ("nvidia-dcgm.service", "dcgm.service")),
    ("dcgm-exporter", ("dcgm-exporter",), ("dcgm-exporter.service",)),
    ("nvidia-fabricmanager", ("nv-fabricmanager", "nv-fabricmanage"), ("nvidia-fabricmanager.service",)),
)
SYSTEMCTL_TIMEOUT_S = 60


def _active(unit):
    try:
        return subprocess.run(["systemctl", "is-active", "--quiet", unit], timeout=SYSTEMCTL_TIMEOUT_S).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def find(procs):
    """([daemon: {name, unit, pids}], [refusal line]) of the daemons that block a reset: their
    running processes, by name, with the unit that runs each; a unit of DAEMONS active with
    no process seen. A daemon process outside a system service (a user's manager's unit is
    not one: its name may be any system unit's) is a refusal, never stopped; a process whose
    name a user could have given it (rules.trusted_names) is no daemon."""
    found, refused = [], []
    for what, names, units in DAEMONS:
        pids = sorted(p for p, rec in procs.items() if rules.names_of(rec) & set(names) and rec.get("state") != "Z"
                      and rules.trusted_names(rec))
        by_unit: dict = {}
        for pid in pids:
            cg = cgroup.read(pid)
            unit = plan.stoppable_unit(cg["unit"]) if not cg["container"] and "/user@" not in (cg["path"] or "") \
                else None
            if unit is None:
                where = (" in %s container %s" % (cg["container"]["kind"], cg["container"].get("id", "?"))
                         if cg["container"] else "")
                refused.append("%s (pid %d)%s is not run by a systemd service: gpu-pivot stops it only through "
                               "its manager, never by pid; stop it the way it was started, then run again"
                               % (what, pid, where))
            else:
                by_unit.setdefault(unit, []).append(pid)
        for unit in units:
            if unit not in by_unit and _active(unit):
                by_unit[unit] = []
        found += [{"name": what, "unit": unit, "pids": p, "stopped": False, "restored": None, "error": None}
                  for unit, p in sorted(by_unit.items())]
    return found, refused


def _systemctl(verb, unit):
    """None, or the error of `systemctl VERB UNIT`."""
    try:
        done = subprocess.run(["systemctl", verb, unit], capture_output=True, text=True, timeout=SYSTEMCTL_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return "systemctl %s %s: %s" % (verb, unit, exc)
    return None if done.returncode == 0 else "systemctl %s %s exited %d: %s" % (
        verb, unit, done.returncode, " ".join((done.stderr + done.stdout).split())[-300:])


def _persistence(index, mode):
    """Setting rows of setting persistence `mode` on GPU `index` (written only where it differs)."""
    source, tried = gpuinfo.open_source()
    try:
        if getattr(source, "name", None) != "nvml":
            return [{"gpu": index, "field": "persistence", "result": "FAILED",
                     "error": "not read: no NVML (%s)" % "; ".join(tried)}]
        return settings_write.apply(source, {"persistence": mode}, gpus={index})
    finally:
        source.close()


def _persistence_now(index):
    source, _ = gpuinfo.open_source()
    try:
        return settings.read(source.nvml, source.handles[index]).get("persistence") \
            if getattr(source, "name", None) == "nvml" else None
    finally:
        source.close()


def around(index, daemons, reset):
    """Stop `daemons`, turn persistence off on GPU `index`, run reset() (-> (ran, ok)), and put
    back both in a finally. Returns {daemons, persistence, steps, ran, ok, restore_failed}."""
    out = {"daemons": daemons, "persistence": [], "steps": [], "ran": False, "ok": False, "restore_failed": []}
    steps = out["steps"]
    before = None
    try:
        for d in daemons:
            d["error"] = _systemctl("stop", d["unit"])
            d["stopped"] = d["error"] is None
            steps.append("stop %s (%s): %s" % (d["unit"], d["name"], d["error"] or "stopped"))
            if d["error"]:
                return out
        before = _persistence_now(index)
        steps.append("persistence mode on GPU %d: %s" % (index, before or "not read"))
        if before == "on":
            rows = _persistence(index, "off")
            out["persistence"] += rows
            failed = [r for r in rows if r["result"] == "FAILED"]
            steps.append("persistence off: %s" % (failed[0].get("error") if failed else "done"))
            if failed:
                return out
        out["ran"], out["ok"] = reset()
        steps.append("reset: %s" % ("done" if out["ok"] else "FAILED" if out["ran"] else "not run"))
    finally:
        for d in reversed([d for d in daemons if d["stopped"]]):
            d["error"] = _systemctl("start", d["unit"])
            d["restored"] = d["error"] is None
            steps.append("start %s: %s" % (d["unit"], d["error"] or "started"))
            if d["error"]:
                out["restore_failed"].append(d["error"])
        if before == "on":  # after the daemons: nvidia-persistenced may already have put it back
            rows = _persistence(index, "on")
            out["persistence"] += rows
            failed = [r.get("error") for r in rows if r["result"] == "FAILED"]
            steps.append("persistence back on: %s" % (failed[0] if failed else
                                                      "already on" if rows and rows[0]["result"] == "already"
                                                      else "done"))
            out["restore_failed"] += ["persistence mode on GPU %d: %s" % (index, f) for f in failed]
    return out
