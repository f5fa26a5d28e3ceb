"""MIG: is a GPU split into instances, and what memory does each instance use.

Why: with MIG on, a GPU's memory belongs to its instances, processes reach them through
/dev/nvidia-caps/nvidia-capN (which devices.py counts as GPU devices, so their holders are
holders), and a GPU reset is refused by the driver while instances exist (reset.py checks
first). Read through NVML only; a GPU or driver without MIG says "not supported".
"""
from . import nvml


def read(nv, handle):
    """{current, pending, instances: [{index, gpu_instance, compute_instance, uuid, used_mib, total_mib}]}
    with current/pending 'enabled'/'disabled', or {'current': 'not supported', ...} (nv: an nvml.Nvml)."""
    try:
        mode = nv.mig_mode(handle)
    except Exception as exc:
        mode, why = None, str(exc) or type(exc).__name__
    if not mode:  # nvml.NA: no MIG on this GPU; None: the call failed
        return {"current": "not supported", "pending": None, "instances": [],
                "note": why if mode is None else "Not Supported"}
    current, pending = mode
    out = {"current": _mode(current), "pending": _mode(pending), "instances": []}
    if current != 1:
        return out
    try:
        devices = nv.mig_devices(handle)
    except Exception as exc:
        out["note"] = "instances not read: %s" % exc
        return out
    unread = []
    for i, mh in devices:
        if isinstance(mh, Exception):  # this slot alone unread: the others are still listed
            unread.append("slot %d: %s" % (i, mh))
            continue
        inst = {"index": i, "gpu_instance": _try(nv.gpu_instance_id, mh),
                "compute_instance": _try(nv.compute_instance_id, mh),
                "uuid": _try(nv.uuid, mh), "used_mib": None, "total_mib": None}
        mem = _try(nv.mig_memory, mh)
        if mem is not None:
            inst["used_mib"], inst["total_mib"] = -(-int(mem[0]) // 2 ** 20), int(mem[1]) // 2 ** 20
        out["instances"].append(inst)
    if unread:
        out["note"] = "instances not read: %s" % "; ".join(unread)
    return out


def _mode(value):
    return "enabled" if int(value) == 1 else "disabled"


def _try(fn, *args):
    """fn(*args), None where it fails or gives nvml.NA."""
    try:
        value = fn(*args)
    except Exception:
        return None
    return None if value is nvml.NA else value


def read_all(source):
    """{gpu index: mig record} through an open NVML reader; {} for other sources."""
    if getattr(source, "name", None) != "nvml":
        return {}
    return {index: read(source.nvml, h) for index, h in enumerate(source.handles)}
