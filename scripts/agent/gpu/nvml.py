"""The agent's one door to NVML: every pynvml call the agent makes is made here.

Why one module: "this GPU or driver has no such thing" (NVML says not supported or not
found, or this binding or driver lacks the function) has one answer for every field, NA
(falsy, never 0), and every other NVML failure one type, NvmlError (the call, NVML's code
and words), which callers name as unread: an unread value is never "free". Opening is lazy
and shared: the first open imports pynvml and runs nvmlInit, the last close nvmlShutdown,
so no NVML handle of the agent's own is open while nvidia-smi resets a GPU (reset.py).
The style of nvitop's libnvml; the tests' stand-in (tests/support/standin/nvml) is a pynvml.
"""
import os
import sys
import threading

NOT_SUPPORTED, NOT_FOUND, TIMEOUT, FUNCTION_NOT_FOUND, VERSION_MISMATCH = 3, 6, 10, 13, 25
ABSENT = (NOT_SUPPORTED, NOT_FOUND, FUNCTION_NOT_FOUND)  # the GPU or driver has no such thing: NA
VALUE_NOT_AVAILABLE = 2 ** 64 - 1  # NVML's "no figure" in a process's used memory
FIELD_RECOVERY_ACTION = 230  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
CLOCKS = {"graphics": 0, "memory": 2}  # NVML_CLOCK_GRAPHICS, NVML_CLOCK_MEM
SETTERS = ("nvmlDeviceSetPersistenceMode", "nvmlDeviceSetComputeMode", "nvmlDeviceSetApplicationsClocks",
           "nvmlDeviceSetPowerManagementLimit")


class _NotAvailable:
    """NA: the field does not exist on this GPU or driver (not an error, not a value)."""

    def __bool__(self):
        return False

    def __repr__(self):
        return "NA"

    __str__ = __repr__


NA = _NotAvailable()


class NvmlError(Exception):
    """An NVML call failed for another reason than NA's: str() is NVML's own words."""

    def __init__(self, call, code, words):
        super().__init__(words)
        self.call, self.code = call, code

    @property
    def value(self):  # pynvml's name for the code
        return self.code


def import_pynvml():
    """pynvml, also when the agent runs with -S (the transport's form, call.BOOT). Then
    the site-packages directories are put on sys.path first, without running their .pth
    files (on a torch host those cost 50-85 ms, and this runs while a teardown waits for the
    driver); only if pynvml still cannot be found is site run in full, as a plain start would."""
    try:
        import pynvml
    except ImportError:
        if not sys.flags.no_site:
            raise
        import site

        dirs = site.getsitepackages() + ([site.getusersitepackages()] if site.check_enableusersite() else [])
        sys.path.extend(d for d in dirs if os.path.isdir(d) and d not in sys.path)
        try:
            import pynvml
        except ImportError:
            site.main()
            import pynvml
    return pynvml


def available():
    """(importable, why-not). Import only: no nvmlInit."""
    try:
        import_pynvml()
    except Exception as exc:  # ImportError, or a broken install
        return False, "%s: %s" % (type(exc).__name__, exc)
    return True, None


_LOCK = threading.Lock()
_users = [0]  # open Nvml objects: nvmlInit at the first, nvmlShutdown after the last


def open_nvml():
    """An Nvml on the real pynvml, initialised; raises ImportError or NvmlError (no driver)."""
    lib = import_pynvml()
    with _LOCK:
        if _users[0] == 0:
            Nvml(lib).strict("nvmlInit")
        _users[0] += 1
    return Nvml(lib, opened=True)


class Nvml:
    """NVML's queries, one method per field the agent reads, each documented with its NA."""

    def __init__(self, lib, opened=False):
        self.lib = lib
        error = getattr(lib, "NVMLError", None)
        self._error = error if isinstance(error, type) and issubclass(error, Exception) else ()
        self._opened = opened
        self._v2 = True  # False once the driver refused the v2 memory call

    def close(self, hung=False):
        """Give this open back; the last one shuts NVML down, unless a call hung (it would wait)."""
        if not self._opened:
            return
        self._opened = False
        with _LOCK:
            _users[0] -= 1
            last = _users[0] == 0
        if last and not hung:
            try:
                self.strict("nvmlShutdown")
            except Exception:
                pass

    def strict(self, call, *args, **kwargs):
        """call(*args); any failure raises NvmlError (a missing function as FUNCTION_NOT_FOUND)."""
        fn = getattr(self.lib, call, None)
        if fn is None:
            raise NvmlError(call, FUNCTION_NOT_FOUND, "%s: not in this NVML binding" % call)
        try:
            return fn(*args, **kwargs)
        except self._error as exc:  # pynvml's own: NVML said no
            raise NvmlError(call, getattr(exc, "value", None), str(exc) or type(exc).__name__) from exc

    def query(self, call, *args):
        """call(*args), or NA where the GPU or driver has no such thing; raises NvmlError else."""
        try:
            return self.strict(call, *args)
        except NvmlError as exc:
            if exc.code in ABSENT:
                return NA
            raise

    # -- the GPUs
    def handles(self):
        """Every GPU's handle, in NVML's order; raises NvmlError."""
        return [self.strict("nvmlDeviceGetHandleByIndex", i) for i in range(self.strict("nvmlDeviceGetCount"))]

    def uuid(self, h):
        """'GPU-...' (or a MIG device's 'MIG-...'); NA."""
        return _text(self.query("nvmlDeviceGetUUID", h))

    def name(self, h):
        """'NVIDIA H200'; NA."""
        return _text(self.query("nvmlDeviceGetName", h))

    def bus_id(self, h):
        """The PCI bus id as NVML writes it ('00000000:19:00.0'); NA."""
        info = self.query("nvmlDeviceGetPciInfo", h)
        return info if info is NA else _text(info.busId)

    def memory(self, h):
        """(used, reserved, total, call) in bytes: v2 where the driver has it (used without the
        driver's reserved memory, call "v2"), else v1 (reserved None, call "v1"); NA."""
        if self._v2:
            try:
                mem = self.strict("nvmlDeviceGetMemoryInfo", h, version=self.lib.nvmlMemory_v2)
                return mem.used, mem.reserved, mem.total, "v2"
            except (AttributeError, TypeError):  # a binding without the v2 form
                self._v2 = False
            except NvmlError as exc:
                if exc.code not in (NOT_SUPPORTED, FUNCTION_NOT_FOUND, VERSION_MISMATCH):
                    raise  # this GPU's failure: it says nothing about the others
                self._v2 = False
        mem = self.query("nvmlDeviceGetMemoryInfo", h)
        return mem if mem is NA else (mem.used, None, mem.total, "v1")

    def compute_processes(self, h):
        """[(pid, used bytes or None)] of the GPU's compute processes; NA."""
        return self._processes("nvmlDeviceGetComputeRunningProcesses", h)

    def mps_processes(self, h):
        """[(pid, used bytes or None)] of NVML's MPS process list; NA (also an old binding)."""
        return self._processes("nvmlDeviceGetMPSComputeRunningProcesses", h)

    def _processes(self, call, h):
        procs = self.query(call, h)
        if procs is NA:
            return NA
        return [(int(p.pid), None if p.usedGpuMemory is None or p.usedGpuMemory >= VALUE_NOT_AVAILABLE
                 else int(p.usedGpuMemory)) for p in procs]

    # -- health
    def recovery_action(self, h):
        """NVML's recovery action (nvmlDeviceGpuRecoveryAction_t, 0 none); NA."""
        fv = self.strict("nvmlDeviceGetFieldValues", h, [FIELD_RECOVERY_ACTION])[0]
        code = int(fv.nvmlReturn)
        if code in ABSENT:
            return NA
        if code:
            raise NvmlError("nvmlDeviceGetFieldValues", code, self.error_string(code) or "NVML error %d" % code)
        kinds = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal"}  # by valueType
        return int(getattr(fv.value, kinds.get(int(fv.valueType), "uiVal")))

    def remapped_rows(self, h):
        """(correctable, uncorrectable, pending, failure); NA (GPUs before Ampere)."""
        return self.query("nvmlDeviceGetRemappedRows", h)

    def retired_pages_pending(self, h):
        """True/False: retired pages wait for a reset; NA (GPUs with row remapping)."""
        pending = self.query("nvmlDeviceGetRetiredPagesPendingStatus", h)
        return pending if pending is NA else bool(int(pending))

    def fabric(self, h):
        """(call, state, status) of the NVLink fabric registration; NA (no fabric)."""
        from ctypes import byref  # the binding hands the argument to NVML as is: a pointer, never the struct

        for call, struct in (("nvmlDeviceGetGpuFabricInfoV", "c_nvmlGpuFabricInfoV_t"),
                             ("nvmlDeviceGetGpuFabricInfo", "c_nvmlGpuFabricInfo_t")):  # an older binding
            if hasattr(self.lib, call) and hasattr(self.lib, struct):
                info = getattr(self.lib, struct)()
                if self.query(call, h, byref(info)) is NA:
                    return NA
                return call, int(info.state), int(info.status)
        return NA

    def error_string(self, code):
        """NVML's words for a return code; None where it has none."""
        try:
            return _text(self.strict("nvmlErrorString", code)) or None
        except Exception:
            return None

    # -- MIG
    def mig_mode(self, h):
        """(current, pending), 1 enabled; NA (no MIG on this GPU)."""
        mode = self.query("nvmlDeviceGetMigMode", h)
        return mode if mode is NA else (int(mode[0]), int(mode[1]))

    def mig_devices(self, h):
        """[(slot, MIG device handle, or the NvmlError that slot gave)] of the instances that exist:
        one slot NVML refuses does not hide the others. Raises NvmlError for the slot count."""
        out: list = []
        for i in range(int(self.strict("nvmlDeviceGetMaxMigDeviceCount", h))):
            try:
                mh = self.query("nvmlDeviceGetMigDeviceHandleByIndex", h, i)
            except NvmlError as exc:
                out.append((i, exc))
                continue
            if mh is not NA:  # NA: this slot holds no instance
                out.append((i, mh))
        return out

    def mig_memory(self, mh):
        """(used, total) bytes of a MIG device (v1: its memory has no reserved part); NA."""
        mem = self.query("nvmlDeviceGetMemoryInfo", mh)
        return mem if mem is NA else (mem.used, mem.total)

    def gpu_instance_id(self, mh):
        """The MIG device's GPU instance id; NA."""
        return self.query("nvmlDeviceGetGpuInstanceId", mh)

    def compute_instance_id(self, mh):
        """The MIG device's compute instance id; NA."""
        return self.query("nvmlDeviceGetComputeInstanceId", mh)

    # -- what a reset checks
    def display_active(self, h):
        """True where a display is active on the GPU; NA."""
        value = self.query("nvmlDeviceGetDisplayActive", h)
        return value if value is NA else bool(int(value))

    def display_mode(self, h):
        """True where a display could be attached; NA."""
        value = self.query("nvmlDeviceGetDisplayMode", h)
        return value if value is NA else bool(int(value))

    def nvlink_active(self, h, link):
        """True where NVLink `link` is up; NA where the GPU has no such link."""
        state = self.query("nvmlDeviceGetNvLinkState", h, link)
        return state if state is NA else int(state) == 1

    def nvlink_remote_bus(self, h, link):
        """The PCI bus id at the other end of NVLink `link`; NA."""
        call = "nvmlDeviceGetNvLinkRemotePciInfo_v2" if hasattr(self.lib, "nvmlDeviceGetNvLinkRemotePciInfo_v2") \
            else "nvmlDeviceGetNvLinkRemotePciInfo"
        info = self.query(call, h, link)
        return info if info is NA else _text(info.busId)

    # -- settings (sandbox_settings.SandboxSettings answers the same methods)
    def persistence(self, h):
        """1 on, 0 off; NA."""
        return self.query("nvmlDeviceGetPersistenceMode", h)

    def compute_mode(self, h):
        """NVML's compute mode number (0 default, 3 exclusive process); NA."""
        return self.query("nvmlDeviceGetComputeMode", h)

    def app_clock(self, h, kind):
        """The application clock in MHz of `kind` ("graphics" or "memory"); NA."""
        return self.query("nvmlDeviceGetApplicationsClock", h, CLOCKS[kind])

    def power_limit_mw(self, h):
        """The power limit in milliwatts; NA."""
        return self.query("nvmlDeviceGetPowerManagementLimit", h)

    def power_default_mw(self, h):
        """The default power limit in milliwatts; NA."""
        return self.query("nvmlDeviceGetPowerManagementDefaultLimit", h)

    def write(self, h, call, values):
        """One of SETTERS on the GPU with `values`; raises NvmlError for any failure, NA's too."""
        if call not in SETTERS:
            raise ValueError("not a setting NVML writes here: %s" % call)
        self.strict(call, h, *values)

    # -- Xid events
    def xid_events(self, handles):
        """An event set registered for every GPU's Xid critical errors; raises NvmlError."""
        evset = self.strict("nvmlEventSetCreate")
        try:
            for h in handles:
                self.strict("nvmlDeviceRegisterEvents", h, self.lib.nvmlEventTypeXidCriticalError, evset)
        except Exception:
            self.free_events(evset)
            raise
        return evset

    def next_event(self, evset):
        """(device handle, xid) waiting now, never blocking; NA where none waits."""
        call = "nvmlEventSetWait_v2" if hasattr(self.lib, "nvmlEventSetWait_v2") else "nvmlEventSetWait"
        try:
            data = self.strict(call, evset, 0)
        except NvmlError as exc:
            if exc.code == TIMEOUT:
                return NA
            raise
        return data.device, int(data.eventData)

    def free_events(self, evset):
        """Free an event set; failures are dropped (nothing to do about them)."""
        try:
            self.strict("nvmlEventSetFree", evset)
        except Exception:
            pass


def _text(value):
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value
