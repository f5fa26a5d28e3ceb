"""The agent's NVML wrapper (scripts/agent/gpu/nvml.py), over the STAND-IN NVML (tests/support/standin/nvml):
each field is NA where the GPU or driver has no such thing (never an exception, never 0), every
other failure is one NvmlError naming the call, and NVML is initialised once and shut down after
the last user, never after a call that hung.

The stand-in answers as nvidia-ml-py does (NVMLError(3) is "Not Supported"); a binding without a
call is the stand-in with that function taken away, as an older nvidia-ml-py lacks it.
"""
from __future__ import annotations

import pytest

from scripts.agent.gpu import nvml
from tests.agent.gpu.test_health import H200, gpu, nvml as standin

BARE = gpu(recovery_action="not supported", remapped_rows="not supported", mig_mode="not supported")


def test_each_field_a_gpu_does_not_have_is_na_never_an_error_or_zero():
    _, source = standin({"gpus": [BARE]})
    nv, h = source.nvml, source.handles[0]
    answers = {"recovery action": nv.recovery_action(h), "remapped rows": nv.remapped_rows(h),
               "retired pages": nv.retired_pages_pending(h), "fabric": nv.fabric(h), "MIG": nv.mig_mode(h),
               "persistence": nv.persistence(h), "compute mode": nv.compute_mode(h),
               "graphics clock": nv.app_clock(h, "graphics"), "power limit": nv.power_limit_mw(h)}
    assert {k: v for k, v in answers.items() if v is not nvml.NA} == {}
    assert not nvml.NA and str(nvml.NA) == "NA"  # falsy, and never reads as a number


def test_a_call_this_binding_lacks_is_na():
    mod, source = standin({"gpus": [dict(H200, mps_processes=[41])]})
    assert source.nvml.mps_processes(source.handles[0]) == [(41, None)]
    del mod.nvmlDeviceGetMPSComputeRunningProcesses  # an nvidia-ml-py from before MPS process lists
    del mod.nvmlDeviceGetGpuFabricInfoV
    assert source.nvml.mps_processes(source.handles[0]) is nvml.NA
    assert source.nvml.fabric(source.handles[0]) is nvml.NA


def test_any_other_failure_is_one_typed_error_naming_the_call_in_nvmls_words():
    _, source = standin({"gpus": [dict(H200, power_limit_mw=700000, fail=["nvmlDeviceGetPowerManagementLimit",
                                                                          "nvmlDeviceGetComputeRunningProcesses"])]})
    nv, h = source.nvml, source.handles[0]
    for query in (nv.power_limit_mw, nv.compute_processes):
        with pytest.raises(nvml.NvmlError) as err:
            query(h)
        assert (err.value.code, str(err.value)) == (999, "Unknown Error")
    assert err.value.call == "nvmlDeviceGetComputeRunningProcesses"


def test_a_write_is_never_na_it_is_done_or_raised():
    _, source = standin({"gpus": [dict(H200, persistence=1)]})  # no power limit on this GPU
    nv, h = source.nvml, source.handles[0]
    with pytest.raises(nvml.NvmlError) as err:
        nv.write(h, "nvmlDeviceSetPowerManagementLimit", (500000,))
    assert err.value.code == nvml.NOT_SUPPORTED
    with pytest.raises(ValueError):
        nv.write(h, "nvmlDeviceResetGpuLockedClocks", ())  # only the settings the agent sets
    nv.write(h, "nvmlDeviceSetPersistenceMode", (0,))
    assert nv.persistence(h) == 0


def test_a_process_without_a_memory_figure_is_none_not_a_huge_number():
    _, source = standin({"gpus": [dict(H200, processes=[[7, nvml.VALUE_NOT_AVAILABLE], [8, 3 * 2 ** 20]])]})
    assert source.nvml.compute_processes(source.handles[0]) == [(7, None), (8, 3 * 2 ** 20)]


def test_memory_falls_back_to_v1_only_where_the_driver_lacks_v2():
    mod, source = standin({"gpus": [dict(H200, used=5 * 2 ** 20), dict(H200, fail=["nvmlDeviceGetMemoryInfo"])]})
    nv = source.nvml
    assert nv.memory(source.handles[0]) == (5 * 2 ** 20, H200["reserved"], H200["total"], "v2")
    with pytest.raises(nvml.NvmlError):
        nv.memory(source.handles[1])  # one GPU's failure: v2 stays on for the others
    assert nv.memory(source.handles[0])[3] == "v2"
    v1 = mod.nvmlDeviceGetMemoryInfo

    def old_driver(h, version=None):
        if version is not None:
            raise mod.NVMLError(nvml.VERSION_MISMATCH)
        return v1(h)

    mod.nvmlDeviceGetMemoryInfo = old_driver
    assert nv.memory(source.handles[0]) == (5 * 2 ** 20, None, H200["total"], "v1")


def test_nvml_is_initialised_once_and_shut_down_after_its_last_user(monkeypatch):
    mod, _ = standin({"gpus": [H200]})
    calls = []
    monkeypatch.setattr(mod, "nvmlInit", lambda: calls.append("init"))
    monkeypatch.setattr(mod, "nvmlShutdown", lambda: calls.append("shutdown"))
    monkeypatch.setattr(nvml, "import_pynvml", lambda: mod)
    monkeypatch.setattr(nvml, "_users", [0])
    a, b = nvml.open_nvml(), nvml.open_nvml()
    a.close()
    a.close()  # a second close of one user gives nothing back twice
    assert calls == ["init"]
    b.close()
    assert calls == ["init", "shutdown"]  # none open: a GPU reset finds no handle of the agent's
    c = nvml.open_nvml()
    c.close(hung=True)  # a call still stuck in the driver: shutdown would wait on it
    assert calls == ["init", "shutdown", "init"] and nvml._users == [0]


def test_one_mig_slot_nvml_refuses_does_not_hide_the_others():
    """Slot 0 refused (NVML's NO_PERMISSION, not an 'absent' code), slot 1 a 5 GiB instance:
    the instance is still listed, and the refused slot is named in the note."""
    from types import SimpleNamespace as NS

    from scripts.agent.gpu import mig

    class NVMLError(Exception):
        def __init__(self, value):
            super().__init__("NVML error %d" % value)
            self.value = value

    def handle_by_index(h, i):
        if i == 0:
            raise NVMLError(4)
        return ("mig", i)

    lib = NS(NVMLError=NVMLError, nvmlDeviceGetMigMode=lambda h: (1, 1), nvmlDeviceGetMaxMigDeviceCount=lambda h: 2,
             nvmlDeviceGetMigDeviceHandleByIndex=handle_by_index, nvmlDeviceGetGpuInstanceId=lambda mh: 1,
             nvmlDeviceGetComputeInstanceId=lambda mh: 0, nvmlDeviceGetUUID=lambda mh: b"MIG-x",
             nvmlDeviceGetMemoryInfo=lambda mh: NS(used=5 << 30, total=10 << 30))
    read = mig.read(nvml.Nvml(lib), "h")
    assert [(i["index"], i["used_mib"]) for i in read["instances"]] == [(1, 5120)], read
    assert "slot 0" in read["note"], read
