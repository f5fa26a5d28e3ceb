"""The GPU's NVLink fabric state, where NVML reports one (NVSwitch systems), and what it means.

Why: on an NVSwitch system a GPU registers with the fabric manager after boot or reset;
until the state reads "completed" (with a success status) CUDA fails to start there
(CUDA_ERROR_SYSTEM_NOT_READY, 802) though NVML reads the GPU empty. A state other than
completed is a health finding ("not ready", health.py); "not supported" (no fabric: PCIe
GPUs, or NVML says so) is shown and blocks nothing. Read with nvmlDeviceGetGpuFabricInfoV
(falling back to the older nvmlDeviceGetGpuFabricInfo).
"""
STATES = {0: "not supported", 1: "not started", 2: "in progress", 3: "completed"}
COMPLETED, NOT_SUPPORTED = "completed", "not supported"


def read(nv, handle):
    """{state, status, call} of one GPU (status: None, or NVML's words for a registration that
    did not succeed) through an nvml.Nvml; raises what it raises, "not supported" is a state."""
    fab = nv.fabric(handle)
    if not fab:  # nvml.NA: no fabric on this GPU, or no such call in this driver
        return {"state": NOT_SUPPORTED, "status": None, "call": "nvmlDeviceGetGpuFabricInfoV"}
    call, state, status = fab
    return {"state": STATES.get(state, "state %d" % state), "call": call,
            "status": None if status == 0 else _status_words(nv, status)}


def _status_words(nv, status):
    words = nv.error_string(status)
    return "NVML %d%s" % (status, ": %s" % words if words else "")


def finding(fab):
    """None, or the reason a fabric state makes the GPU not ready."""
    if not fab or fab["state"] == NOT_SUPPORTED:
        return None
    if fab["state"] != COMPLETED:
        return ("NVLink fabric %s (not completed): CUDA cannot start on this GPU (error 802) until the fabric "
                "manager finishes; check nvidia-fabricmanager" % fab["state"])
    if fab["status"]:
        return "NVLink fabric registration failed (%s): check nvidia-fabricmanager's log" % fab["status"]
    return None


def words(fab):
    """One short line for status and health: 'completed', 'not supported', 'in progress'."""
    if not fab:
        return "not read"
    return fab["state"] + (" (%s)" % fab["status"] if fab.get("status") else "")
