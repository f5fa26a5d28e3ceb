"""MIG: is a GPU split into instances, and what memory does each instance use.

Why: with MIG on, a GPU's memory belongs to its instances, processes reach them through
/dev/nvidia-caps/nvidia-capN (which devices.py counts as GPU devices, so their holders are
holders), and a GPU reset is refused by the driver while instances exist (reset.py checks
first). Read through NVML only; a GPU or driver without MIG says "not supported".
"""


def read(nv, handle):
    """{current, pending, instances: [{index, gpu_instance, compute_instance, uuid, used_mib, total_mib}]}
    with current/pending 'enabled'/'disabled', or {'current': 'not supported', ...}."""
    try:
        current, pending = nv.nvmlDeviceGetMigMode(handle)
    except Exception as exc:  # NVML_ERROR_NOT_SUPPORTED: no MIG on this GPU
        return {"current": "not supported", "pending": None, "instances": [], "note": str(exc) or type(exc).__name__}
    out = {"current": _mode(current), "pending": _mode(pending), "instances": []}
    if int(current) != 1:
        return out
    try:
        count = nv.nvmlDeviceGetMaxMigDeviceCount(handle)
    except Exception as exc:
        out["note"] = "instances not read: %s" % exc
        return out
    for i in range(count):
        try:
            mh = nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, i)
        except Exception:  # NVML_ERROR_NOT_FOUND: this slot holds no instance
            continue
        inst = {"index": i, "gpu_instance": _try(nv.nvmlDeviceGetGpuInstanceId, mh),
                "compute_instance": _try(nv.nvmlDeviceGetComputeInstanceId, mh),
                "uuid": _text(_try(nv.nvmlDeviceGetUUID, mh)), "used_mib": None, "total_mib": None}
        try:
            mem = nv.nvmlDeviceGetMemoryInfo(mh)
            inst["used_mib"], inst["total_mib"] = -(-int(mem.used) // 2 ** 20), int(mem.total) // 2 ** 20
        except Exception:
            pass
        out["instances"].append(inst)
    return out


def _mode(value):
    return "enabled" if int(value) == 1 else "disabled"


def _try(fn, *args):
    try:
        return fn(*args)
    except Exception:
        return None


def _text(value):
    return value.decode() if isinstance(value, bytes) else value


def read_all(source):
    """{gpu index: mig record} through an open NVML reader; {} for other sources."""
    if getattr(source, "name", None) != "nvml":
        return {}
    return {index: read(source.nvml, h) for index, h in enumerate(source.handles)}
