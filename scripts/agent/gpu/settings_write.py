"""Set GPU settings through NVML: every GPU at once (a thread per GPU), each field only where
it differs from what the GPU reads, and each change read back.

Why a thread per GPU: a power limit takes about a second per GPU (DeepOps measured it with
`nvidia-smi -pl`), so eight GPUs one at a time cost eight seconds of every pivot. Why read
back: a write NVML accepted is not yet a setting the GPU runs with; "after" is what the GPU
reads once written. MIG mode is compared, never set: switching it needs a GPU reset.
"""
import threading

from . import settings

FEATURE = {"on": 1, "off": 0}
MODE_OF = {name: number for number, name in settings.COMPUTE_MODES.items()}
CLOCKS = ("graphics_clock_mhz", "memory_clock_mhz")


def _calls(nv, handle, want, now):
    """[(fields, NVML call name, args)] for what `want` asks that `now` does not read."""
    out: list = []
    if "persistence" in want and want["persistence"] != now.get("persistence"):
        out.append((("persistence",), "nvmlDeviceSetPersistenceMode", (FEATURE[want["persistence"]],)))
    if "compute_mode" in want and want["compute_mode"] != now.get("compute_mode"):
        out.append((("compute_mode",), "nvmlDeviceSetComputeMode", (MODE_OF[want["compute_mode"]],)))
    clocks = [f for f in CLOCKS if f in want and want[f] != now.get(f)]
    if clocks:  # one call sets both: (memory MHz, graphics MHz); the field not asked keeps its value
        pair = [int(want.get(f, now.get(f) or 0)) for f in ("memory_clock_mhz", "graphics_clock_mhz")]
        out.append((tuple(clocks), "nvmlDeviceSetApplicationsClocks", tuple(pair)))
    if "power_limit_w" in want and want["power_limit_w"] != now.get("power_limit_w"):
        out.append((("power_limit_w",), "nvmlDeviceSetPowerManagementLimit",
                    (int(round(float(want["power_limit_w"]) * 1000)),)))
    return out


def _one_gpu(nv, index, handle, want, out):
    """Write what differs on one GPU; append its rows to out[index]."""
    now = settings.read(nv, handle)
    rows = []
    if "mig" in want and want["mig"] != now.get("mig"):
        rows.append({"gpu": index, "field": "mig", "before": now.get("mig"), "want": want["mig"],
                     "after": now.get("mig"), "result": "FAILED",
                     "error": "MIG mode is not set by gpu-pivot (a change needs a GPU reset: nvidia-smi -mig)"})
    for fields, call, args in _calls(nv, handle, want, now):
        error = None
        try:
            nv.write(handle, call, args)
        except Exception as exc:
            error = "%s: %s" % (call, str(exc) or type(exc).__name__)
        after = settings.read(nv, handle)
        for f in fields:
            ok = error is None and after.get(f) == want[f]
            rows.append({"gpu": index, "field": f, "before": now.get(f), "want": want[f], "after": after.get(f),
                         "call": "%s(%s)" % (call, ", ".join(map(str, args))), "result": "set" if ok else "FAILED",
                         "error": error or (None if ok else "reads %s after the write" % after.get(f))})
    rows += [{"gpu": index, "field": f, "before": now.get(f), "want": v, "after": now.get(f), "result": "already"}
             for f, v in want.items() if now.get(f) == v]
    out[index] = rows


def apply(source, want, gpus=None):
    """[row] for every GPU (or those in `gpus`) of an open NVML source, set to `want` ({field:
    value}, hostconfig's checked shape): {gpu, field, before, want, after, result: "set",
    "already" or "FAILED", call, error}. The GPUs are written at the same time."""
    nv, handles = source.settings_nv, source.settings_handles
    indices = [i for i in range(len(handles)) if gpus is None or i in gpus]
    out: dict = {}
    threads = [threading.Thread(target=_guarded, args=(nv, i, handles[i], want, out), daemon=True)
               for i in indices]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [row for i in indices for row in out[i]]


def _guarded(nv, index, handle, want, out):
    try:
        _one_gpu(nv, index, handle, want, out)
    except Exception as exc:  # a read that failed: one FAILED row, never a dead thread's silence
        out[index] = [{"gpu": index, "field": "*", "before": None, "want": None, "after": None, "result": "FAILED",
                       "error": "%s: %s" % (type(exc).__name__, exc)}]
