"""The settings a GPU runs with, as NVML reads them: persistence mode, compute mode, application
clocks, power limit (current and default) and MIG mode. Read only: nothing here sets one.

Why: a GPU left in exclusive-process compute mode, with a lowered power limit or pinned
application clocks by the last job starts the next one wrong, silently; `status` shows each
GPU's settings and marks where they differ from the host's baseline (hosts.env
ALIAS_GPU_BASELINE, compared on the local side: views/status.py).

Each field is asked on its own: one the GPU or driver does not have (nvml.NA)
is None and named in `not_supported`; one whose call fails otherwise is None and named, with
the error, in `unread`. None is never a value: it reads "n/a" or "?", never 0.
"""

from . import nvml

COMPUTE_MODES = {0: "default", 1: "exclusive_thread", 2: "prohibited", 3: "exclusive_process"}
FIELDS = ("persistence", "compute_mode", "graphics_clock_mhz", "memory_clock_mhz", "power_limit_w",
          "power_default_w", "mig")


def _on_off(value):
    return "on" if int(value) == 1 else "off"


def _watts(milliwatts):
    mw = int(milliwatts)
    return mw // 1000 if mw % 1000 == 0 else round(mw / 1000.0, 1)


def read(nv, handle):
    """{field: value or None, not_supported: [field], unread: {field: error}} of one GPU
    (nv: an nvml.Nvml, or the sandbox's SandboxSettings: the same methods)."""
    calls = (
        ("persistence", nv.persistence, _on_off),
        ("compute_mode", nv.compute_mode, _compute_mode),
        ("graphics_clock_mhz", lambda h: nv.app_clock(h, "graphics"), int),
        ("memory_clock_mhz", lambda h: nv.app_clock(h, "memory"), int),
        ("power_limit_w", nv.power_limit_mw, _watts),
        ("power_default_w", nv.power_default_mw, _watts),
        ("mig", nv.mig_mode, lambda mode: _on_off(mode[0])),
    )
    out: dict = {}
    not_supported: list = []
    unread: dict = {}
    for field, call, shape in calls:
        out[field] = None
        try:
            value = call(handle)
        except Exception as exc:
            unread[field] = str(exc) or type(exc).__name__
            continue
        if value is nvml.NA:
            not_supported.append(field)
        else:
            out[field] = shape(value)
    out["not_supported"] = not_supported
    out["unread"] = unread
    return out


def _compute_mode(value):
    return COMPUTE_MODES.get(int(value), "mode %d" % int(value))


def read_all(source):
    """{gpu index: settings} through the source's settings reader; {} for sources without one."""
    nv = getattr(source, "settings_nv", None)  # NVML, or the sandbox's file; none for nvidia-smi
    if nv is None:
        return {}
    return {index: read(nv, h) for index, h in enumerate(source.settings_handles)}
