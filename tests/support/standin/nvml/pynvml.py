"""STAND-IN NVML for tests on machines without an NVIDIA GPU: replays recorded answers.

Why: MIG cannot be switched on on the GPU machine, and a GPU asking for a reset, rows
pending remapping or an Xid cannot be produced on demand; this machine has no GPU at all.
The agent's health, MIG and reset code is exercised against answers in the shape NVML
(nvidia-ml-py 13.615.71, driver 580.159.04, H200) gives them: the recording's healthy H200
values are the ones measured on the GPU machine (recovery action 0, remapped rows
(0, 0, 0, 0), retired pages Not Supported, MIG mode (0, 0)); the MIG, fault and NVLink
values are chosen by each test and say so. Put this directory first on PYTHONPATH and name
the recording (JSON) in GPU_PIVOT_NVML_RECORDING; or call load(dict) in-process.

Recording: {"gpus": [{"uuid", "name", "bus", "used", "reserved", "total", "processes": [[pid, bytes]],
"mps_processes": [pid], "recovery_action": 0, "remapped_rows": [corr, unc, pending, failure],
"retired_pending": "not supported" | 0 | 1, "mig_mode": [current, pending], "mig_devices":
[{"gi", "ci", "uuid", "used", "total"}], "display_active": 0, "display_mode": 0, "nvlink": [peer bus, ...],
"xid_events": [xid, ...], "persistence": 1, "compute_mode": 0, "app_clocks": [graphics, memory],
"power_limit_mw": 700000, "power_default_mw": 700000, "fabric": [state, status],
"fail": ["nvmlDeviceGetMemoryInfo", ...]}],
"hang": "nvmlDeviceGetRemappedRows" (that call never returns)}. A setting given as "not supported"
(or left out) raises NVMLError_NotSupported, as a GPU without that feature does. A GPU's
"fail" names calls that raise NVMLError (999, Unknown Error)
for that GPU only: one bad field of one GPU.
"""
import ctypes
import json
import os
import threading
from types import SimpleNamespace

NVML_SUCCESS = 0
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_TIMEOUT = 10
nvmlMemory_v2 = 0x02000028
nvmlEventTypeXidCriticalError = 0x0000000000000008

STANDIN = True
_rec: dict = {"gpus": []}
RELEASE = threading.Event()  # set() lets a hung call return (tests end their threads)


class NVMLError(Exception):
    def __new__(cls, value):  # as pynvml: NVMLError(3) is an NVMLError_NotSupported
        sub = _SUBCLASSES.get(value, cls) if cls is NVMLError else cls
        return Exception.__new__(sub)

    def __init__(self, value):
        self.value = value
        super().__init__({3: "Not Supported", 6: "Not Found", 10: "Timeout", 999: "Unknown Error"}.get(
            value, "NVML error %d" % value))


class NVMLError_NotSupported(NVMLError):  # noqa: N801 (pynvml's name)
    pass


_SUBCLASSES = {NVML_ERROR_NOT_SUPPORTED: NVMLError_NotSupported}
NVML_CLOCK_GRAPHICS = 0
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2


def load(recording):
    _rec.clear()
    _rec.update(recording)


if os.environ.get("GPU_PIVOT_NVML_RECORDING"):
    with open(os.environ["GPU_PIVOT_NVML_RECORDING"]) as f:
        load(json.load(f))


class _Handle:
    def __init__(self, index, mig=None):
        self.index, self.mig = index, mig


def _gpu(h):
    return _rec["gpus"][h.index]


NVML_ERROR_UNKNOWN = 999


def _maybe_fail(h, name):
    if name in _gpu(h).get("fail", ()):
        raise NVMLError(NVML_ERROR_UNKNOWN)


def _maybe_hang(name):
    if _rec.get("hang") == name:
        RELEASE.wait(3600)


def nvmlInit():
    pass


def nvmlShutdown():
    pass


def nvmlDeviceGetCount():
    return len(_rec["gpus"])


def nvmlDeviceGetHandleByIndex(i):
    if i >= len(_rec["gpus"]):
        raise NVMLError(2)
    return _Handle(i)


def nvmlDeviceGetName(h):
    _maybe_fail(h, "nvmlDeviceGetName")
    return _gpu(h).get("name", "NVIDIA H200")


def nvmlDeviceGetUUID(h):
    _maybe_fail(h, "nvmlDeviceGetUUID")
    if h.mig is not None:
        return _gpu(h)["mig_devices"][h.mig]["uuid"]
    return _gpu(h)["uuid"]


def nvmlDeviceGetMemoryInfo(h, version=None):
    _maybe_fail(h, "nvmlDeviceGetMemoryInfo")
    if h.mig is not None:
        d = _gpu(h)["mig_devices"][h.mig]
        return SimpleNamespace(used=d["used"], total=d["total"], free=d["total"] - d["used"])
    g = _gpu(h)
    return SimpleNamespace(used=g["used"], reserved=g.get("reserved", 0), total=g["total"],
                           free=g["total"] - g["used"])


def nvmlDeviceGetComputeRunningProcesses(h):
    _maybe_fail(h, "nvmlDeviceGetComputeRunningProcesses")
    return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in _gpu(h).get("processes", [])]


def nvmlDeviceGetMPSComputeRunningProcesses(h):
    return [SimpleNamespace(pid=pid, usedGpuMemory=None) for pid in _gpu(h).get("mps_processes", [])]


def nvmlDeviceGetPciInfo(h):
    return SimpleNamespace(busId=_gpu(h)["bus"])


def nvmlDeviceGetFieldValues(h, ids):
    _maybe_hang("nvmlDeviceGetFieldValues")
    out = []
    for fid in ids:
        action = _gpu(h).get("recovery_action", "not supported")
        ret = NVML_ERROR_NOT_SUPPORTED if action == "not supported" else NVML_SUCCESS
        out.append(SimpleNamespace(fieldId=fid, nvmlReturn=ret, valueType=1,
                                   value=SimpleNamespace(uiVal=0 if ret else action)))
    return out


def nvmlDeviceGetRemappedRows(h):
    _maybe_hang("nvmlDeviceGetRemappedRows")
    rows = _gpu(h).get("remapped_rows", "not supported")
    if rows == "not supported":
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return tuple(rows)


def nvmlDeviceGetRetiredPagesPendingStatus(h):
    value = _gpu(h).get("retired_pending", "not supported")
    if value == "not supported":
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return value


def nvmlDeviceGetMigMode(h):
    mode = _gpu(h).get("mig_mode", "not supported")
    if mode == "not supported":
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return tuple(mode)


def nvmlDeviceGetMaxMigDeviceCount(h):
    return 7


def nvmlDeviceGetMigDeviceHandleByIndex(h, i):
    if i >= len(_gpu(h).get("mig_devices", [])):
        raise NVMLError(NVML_ERROR_NOT_FOUND)
    return _Handle(h.index, i)


def nvmlDeviceGetGpuInstanceId(mh):
    return _gpu(mh)["mig_devices"][mh.mig]["gi"]


def nvmlDeviceGetComputeInstanceId(mh):
    return _gpu(mh)["mig_devices"][mh.mig]["ci"]


def nvmlDeviceGetDisplayActive(h):
    return _gpu(h).get("display_active", 0)


def nvmlDeviceGetDisplayMode(h):
    return _gpu(h).get("display_mode", 0)


def nvmlDeviceGetNvLinkState(h, link):
    peers = _gpu(h).get("nvlink", [])
    if link >= len(peers):
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return 1


def nvmlDeviceGetNvLinkRemotePciInfo_v2(h, link):
    return SimpleNamespace(busId=_gpu(h)["nvlink"][link])


class _EventSet:
    def __init__(self):
        self.pending = []


def nvmlEventSetCreate():
    return _EventSet()


def nvmlDeviceRegisterEvents(h, types, evset):
    evset.pending += [SimpleNamespace(device=h, eventData=x, eventType=types) for x in _gpu(h).get("xid_events", [])]


def nvmlEventSetWait_v2(evset, timeout_ms):
    if not evset.pending:
        raise NVMLError(NVML_ERROR_TIMEOUT)
    return evset.pending.pop(0)


def nvmlEventSetFree(evset):
    pass


def _setting(h, key, call):
    _maybe_fail(h, call)
    value = _gpu(h).get(key, "not supported")
    if value == "not supported":
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return value


def nvmlDeviceGetPersistenceMode(h):
    return _setting(h, "persistence", "nvmlDeviceGetPersistenceMode")


def nvmlDeviceGetComputeMode(h):
    return _setting(h, "compute_mode", "nvmlDeviceGetComputeMode")


def nvmlDeviceGetApplicationsClock(h, clock_type):
    clocks = _setting(h, "app_clocks", "nvmlDeviceGetApplicationsClock")
    return clocks[{NVML_CLOCK_GRAPHICS: 0, NVML_CLOCK_MEM: 1}[clock_type]]


def nvmlDeviceGetPowerManagementLimit(h):
    return _setting(h, "power_limit_mw", "nvmlDeviceGetPowerManagementLimit")


def nvmlDeviceGetPowerManagementDefaultLimit(h):
    return _setting(h, "power_default_mw", "nvmlDeviceGetPowerManagementDefaultLimit")


# -- set calls: each one logged (a JSON line per call, with its thread and its start and end on
# the monotonic clock) to the recording's "calls_log", after sleeping "set_delay_s": a test
# asserts the exact calls and values, and that calls on different GPUs overlapped in time.
# With "write_back": true the recording file is rewritten, so the next agent reads the new value.
_LOG_LOCK = threading.Lock()


def _set(h, call, args, key, value):
    import time

    started = time.monotonic()
    time.sleep(float(_rec.get("set_delay_s", 0)))
    failed = call in _gpu(h).get("fail", ())
    if not failed and _gpu(h).get(key, "not supported") == "not supported":  # no such feature
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    if not failed:
        _gpu(h)[key] = value
    if _rec.get("calls_log"):
        line = json.dumps({"call": call, "gpu": h.index, "args": list(args), "start": started,
                           "end": time.monotonic(), "thread": threading.get_ident()})
        with _LOG_LOCK, open(_rec["calls_log"], "a") as f:
            f.write(line + "\n")
    if not failed and _rec.get("write_back") and os.environ.get("GPU_PIVOT_NVML_RECORDING"):
        with _LOG_LOCK, open(os.environ["GPU_PIVOT_NVML_RECORDING"], "w") as f:  # the next process reads it
            json.dump(_rec, f)
    if failed:
        raise NVMLError(NVML_ERROR_UNKNOWN)


def nvmlDeviceSetPersistenceMode(h, mode):
    _set(h, "nvmlDeviceSetPersistenceMode", [mode], "persistence", mode)


def nvmlDeviceSetComputeMode(h, mode):
    _set(h, "nvmlDeviceSetComputeMode", [mode], "compute_mode", mode)


def nvmlDeviceSetApplicationsClocks(h, mem_mhz, graphics_mhz):
    _set(h, "nvmlDeviceSetApplicationsClocks", [mem_mhz, graphics_mhz], "app_clocks", [graphics_mhz, mem_mhz])


def nvmlDeviceSetPowerManagementLimit(h, limit_mw):
    _set(h, "nvmlDeviceSetPowerManagementLimit", [limit_mw], "power_limit_mw", limit_mw)


class c_nvmlGpuFabricInfo_t(ctypes.Structure):  # noqa: N801 (pynvml's name and layout, v2)
    _fields_ = [("version", ctypes.c_uint), ("clusterUuid", ctypes.c_uint8 * 16), ("status", ctypes.c_uint),
                ("cliqueId", ctypes.c_uint32), ("state", ctypes.c_uint8), ("healthMask", ctypes.c_uint32)]


c_nvmlGpuFabricInfoV_t = c_nvmlGpuFabricInfo_t


def nvmlDeviceGetGpuFabricInfoV(h, pointer):
    """A recording's "fabric": [state, status] (NVML_GPU_FABRIC_STATE_*: 0 not supported, 1 not
    started, 2 in progress, 3 completed); left out: NVML_ERROR_NOT_SUPPORTED, as pre-Hopper GPUs.
    As the real binding, it hands its argument to NVML as a pointer: the struct itself (not
    byref) made the real agent die of SIGSEGV on an H100, so here it is refused."""
    if type(pointer).__name__ != "CArgObject" or not isinstance(pointer._obj, c_nvmlGpuFabricInfo_t):
        raise TypeError("nvmlDeviceGetGpuFabricInfoV needs byref(c_nvmlGpuFabricInfoV_t()): NVML writes through it")
    info = pointer._obj
    _maybe_fail(h, "nvmlDeviceGetGpuFabricInfoV")
    fab = _gpu(h).get("fabric", "not supported")
    if fab == "not supported":
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    info.state, info.status = fab
    return NVML_SUCCESS


def nvmlErrorString(code):
    return {0: "Success", 3: "Not Supported", 999: "Unknown Error"}.get(code, "NVML error %d" % code)
