"""Reset one GPU (`nvidia-smi --gpu-reset -i N`), only when every precondition holds.

Why checks first: nvidia-smi(1) (`-r, --gpu-reset`) says a reset needs root, no
application using the device (CUDA programs, an X server, monitors such as another
nvidia-smi), and no compute application on the other GPUs where an individual reset is not
possible (GPUs joined by NVLink, before Ampere); MIG instances must be gone. A reset run
blind fails halfway or, worse, takes a display or a peer's job with it. So every check is
listed with its answer, a dry run is the default (`--yes` runs it), and the command is
shown either way. A teardown never resets a GPU on its own: its health verdict says when
one is needed, and a person runs this.

The whole account: docs/design-notes.md (scripts/agent/teardown/reset.py)."""
import os
import shutil
import subprocess

from ..gpu import checkup, gpuinfo, health, mig, xid
from ..holders import scan
from ..options.record import Options
from ..policy import rules
from ..wire import codes, defaults, records
from . import quiesce

RESET_TIMEOUT_S = defaults.RESET_TIMEOUT_S
NVLINK_MAX_LINKS = 18
X_SERVERS = ("Xorg", "Xwayland", "X")


def add_arguments(parser):
    parser.add_argument("--gpu", default=None, help="the GPU index to reset (as nvidia-smi and NVML number it)")
    parser.add_argument("--yes", action="store_true", help="run the reset (default: only check and show it)")
    parser.add_argument("--quiesce", action="store_true",
                        help="stop the daemons that block a reset through systemd and turn persistence off first; "
                             "put both back after, even when the reset fails (quiesce.py)")


def command(index):
    return ["nvidia-smi", "--gpu-reset", "-i", str(index)]


def _check(name, ok, detail):
    return {"check": name, "ok": bool(ok), "detail": detail}


def _gpu_index(text, count):
    if text is None or not str(text).isdigit():
        raise codes.UsageError("--gpu %r: expected a GPU index (0, 1, ...)" % (text,))
    index = int(text)
    if index >= count:
        raise codes.UsageError("--gpu %d: this host has %d GPU(s) (indices 0-%d)" % (index, count, count - 1)
                                 if count else "--gpu %d: no GPU is visible on this host" % index)
    return index


def holders_on(doc, index):
    """Holders of this GPU: GPU memory on it, or its device file, or the driver's shared nodes
    (nvidiactl, nvidia-uvm) with no per-GPU file (they could be using any GPU)."""
    out = []
    indices = [g["index"] for g in doc["gpus"]]
    for h in doc["holders"]:
        if index in health.gpus_of(h, indices) and h["pid"] != os.getpid():
            out.append(h)
    return out


def checks(doc, source, index, stopping=()):
    """The precondition checks, in order: [{check, ok, detail}]. `stopping`: the pids of the
    daemons --quiesce stops first (they hold the GPU now, not at the reset)."""
    out = []
    denied, hidden = doc.get("denied") or [], doc.get("proc_hidden")
    out.append(_check("every process inspected", not denied and not hidden, "; ".join(
        ["%d process(es) could not be inspected (pids %s%s): one may hold the GPU unseen; run as root"
         % (len(denied), ", ".join(map(str, denied[:8])), ", ..." if len(denied) > 8 else "")] * bool(denied)
        + ([str(hidden)] if hidden else [])) or "every process's open files were read"))
    holders = [h for h in holders_on(doc, index) if h["pid"] not in stopping]
    blocking = [h for h in holders if not _is_persistenced(h)]
    out.append(_check("no process holds the GPU", not blocking, "; ".join(
        "pid %s (%s)%s" % (h["pid"], h["cmdline"][:60], " [%s]" % h["protected"] if h["protected"] else "")
        for h in blocking) or "none"))
    gpu = next(g for g in doc["gpus"] if g["index"] == index)
    out.append(_check("no compute process on the GPU", not gpu["processes"],
                      ", ".join("pid %s (%s MiB)" % (p["pid"], p["used_mib"]) for p in gpu["processes"]) or "none"))
    persist = [h for h in holders if _is_persistenced(h)]
    out.append(_check("persistence daemon handled", True,
                      ("nvidia-persistenced (pid %s) keeps the device open; the driver releases it for the reset. "
                       "If the reset says the GPU is in use, stop it around the reset: systemctl stop "
                       "nvidia-persistenced; reset; systemctl start nvidia-persistenced" % persist[0]["pid"])
                      if persist else "nvidia-persistenced does not hold this GPU"))
    x = [h for h in holders if rules.names_of(h) & set(X_SERVERS)]
    nv = source.nvml if getattr(source, "name", None) == "nvml" else None
    handle = source.handles[index] if nv else None
    display = mode = None
    if nv:  # display mode says a display COULD be attached (Enabled on an H200); display active, that one is
        display = _nvml_bool(nv.display_active, handle)
        mode = _nvml_bool(nv.display_mode, handle)
    out.append(_check("not a display GPU", not x and not display,
                      "an X server holds it: %s" % ", ".join(str(h["pid"]) for h in x) if x else
                      "NVML: a display is active on it" if display else
                      "no active display (NVML; display mode %s)" % ("enabled" if mode else "disabled") if nv else
                      "no X server holds it (display not read: no NVML)"))
    if nv:
        m = mig.read(nv, handle)
        inst = m["instances"]
        out.append(_check("no MIG instances", not inst,
                          "%d MIG instance(s) exist: destroy them first (nvidia-smi mig -dci -i %d; nvidia-smi mig "
                          "-dgi -i %d)" % (len(inst), index, index) if inst else "MIG %s" % m["current"]))
        out.append(_nvlink_check(nv, source.handles, index, doc))
    else:
        out.append(_check("no MIG instances", False, "not read: no NVML on this host (GPU source %s)"
                          % getattr(source, "name", "none")))
    return out


def _is_persistenced(h):
    """The persistence daemon by name, where its name can be trusted (rules.trusted_names)."""
    return bool(rules.names_of(h) & {"nvidia-persistenced", "nvidia-persiste"}) and rules.trusted_names(h)


def _nvml_bool(query, handle):
    """query(handle) as True/False: False where it is not read (nvml.NA, an error)."""
    try:
        return bool(query(handle))
    except Exception:
        return False


def _nvlink_check(nv, handles, index, doc):
    """Compute processes on GPUs this one reaches over NVLink block its reset."""
    bus = {}
    for i, h in enumerate(handles):
        try:
            bus[xid._bus_id(nv, h)] = i
        except Exception:
            pass
    peers, links = set(), 0
    for link in range(NVLINK_MAX_LINKS):
        try:
            if not nv.nvlink_active(handles[index], link):  # nvml.NA: no such link
                continue
            links += 1
            remote = nv.nvlink_remote_bus(handles[index], link)
            peer = bus.get(xid.normalize_bus(remote)) if remote else None
            if peer is not None and peer != index:
                peers.add(peer)
        except Exception:  # nvml.NvmlError (INVALID_ARGUMENT: past its links), or no bus id
            continue
    busy = [g for g in doc["gpus"] if g["index"] in peers and g["processes"]]
    if not links:
        return _check("nothing on NVLink peers", True, "no active NVLink on this GPU")
    detail = ("NVLink peer GPU(s) %s run compute processes: %s" % (
        ", ".join(str(g["index"]) for g in busy),
        "; ".join("GPU %s pids %s" % (g["index"], [p["pid"] for p in g["processes"]]) for g in busy))
        if busy else "%d active link(s); peers %s idle%s" % (
            links, sorted(peers) or "none listed", "" if peers else " (links go to NVSwitches)"))
    return _check("nothing on NVLink peers", not busy, detail)


def run(opts: Options):
    code, out = _reset(opts.selection, opts.gpu, opts.quiesce, opts.yes)
    return code, records.written(records.ResetResult, out, code=code)


def _reset(sel, gpu, stop_daemons, yes):
    sel.gpus.device_set()
    source, tried = gpuinfo.open_source(sel.gpus.fake_gpus, sel.gpus.devices)
    daemons, refused = [], []
    try:
        doc = scan.collect(sel, source)
        index = _gpu_index(gpu, len(doc["gpus"]))
        if stop_daemons:
            daemons, refused = quiesce.find(doc.procs)
        results = checks(doc, source, index, {p for d in daemons for p in d["pids"]})
    finally:
        source.close()
    argv = command(index)
    ready = all(c["ok"] for c in results) and not refused
    out = {"hostname": doc["hostname"], "gpu": index, "checks": results, "command": argv, "ready": ready,
           "ran": False, "gpu_source": doc["gpu_source"], "gpu_source_tried": tried, "output": None,
           "note": "dry run: nothing was reset (run with --yes)" if not yes else None,
           "quiesce": {"daemons": daemons, "refused": refused, "steps": [], "persistence": []}
           if stop_daemons else None}
    if not ready:
        out["note"] = "refused: %s; nothing was stopped or reset" % (
            "; ".join(refused) if refused else "a precondition is not met")
        return codes.EXIT_FAILED, out
    if not yes:
        return codes.EXIT_OK, out
    if os.geteuid() != 0:
        out["note"] = "refused: a GPU reset needs root"
        return codes.EXIT_FAILED, out
    if not shutil.which(argv[0]):
        out["note"] = "refused: nvidia-smi is not on PATH"
        return codes.EXIT_FAILED, out
    if stop_daemons:
        return _quiesced(sel, index, daemons, out)
    code = _run_reset(argv, out)
    out["note"] = "reset %s" % ("done" if code == codes.EXIT_OK else
                                "FAILED (invoke reset --quiesce stops the daemons that may block it)")
    return code, out


def _run_reset(argv, out):
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=RESET_TIMEOUT_S)
        out.update(ran=True, output=(done.stdout + done.stderr).strip()[-2000:], reset_exit=done.returncode)
        return codes.EXIT_OK if done.returncode == 0 else codes.EXIT_FAILED
    except subprocess.TimeoutExpired:
        out.update(ran=True, output="nvidia-smi --gpu-reset did not return within %g s" % RESET_TIMEOUT_S)
        return codes.EXIT_FAILED


def _quiesced(sel, index, daemons, out):
    """The reset inside quiesce.around, then the GPU's health read again. A reset that ran and
    failed with nothing blocking it is "reboot needed" (12); a daemon or setting not put back
    is named and exits 1 (unless the reboot says more)."""
    def reset():
        code = _run_reset(out["command"], out)
        return out["ran"], code == codes.EXIT_OK

    done = quiesce.around(index, daemons, reset)
    q = out["quiesce"]
    q.update(steps=done["steps"], persistence=done["persistence"], daemons=done["daemons"])
    q["health"] = _health_after(sel, index)
    failed = done["restore_failed"]
    if done["ran"] and not done["ok"]:
        code, note = codes.EXIT_REBOOT_NEEDED, "reset FAILED with its blockers stopped: reboot needed"
    elif not done["ran"]:
        code, note = codes.EXIT_FAILED, "not reset: a step before it failed (see the steps)"
    else:
        code, note = codes.EXIT_OK, "reset done"
    if failed:
        code = code if code == codes.EXIT_REBOOT_NEEDED else codes.EXIT_FAILED
        note += "; NOT put back: " + "; ".join(failed)
    else:
        note += "; every daemon and setting put back"
    out["note"] = note
    return code, out


def _health_after(sel, index):
    """The GPU's health verdict, read again after the reset (a fresh scan and NVML handles)."""
    source, _ = gpuinfo.open_source(sel.gpus.fake_gpus, sel.gpus.devices)
    try:
        doc = checkup.annotate(scan.collect(sel, source), source)
        gpu = next((g for g in doc["gpus"] if g["index"] == index), None)
        return gpu.get("health") if gpu else {"verdict": "unknown", "reasons": ["GPU %d is not seen" % index]}
    except Exception as exc:  # a GPU that fell off the bus: the verdict says so, the restore stands
        return {"verdict": "unknown", "reasons": ["not read: %s: %s" % (type(exc).__name__, exc)]}
    finally:
        source.close()
