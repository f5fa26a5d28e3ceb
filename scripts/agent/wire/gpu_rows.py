"""The GPU rows inside results (a GPU as its source read it, its health, fabric, probe, MIG,
settings, MPS daemons), as TypedDicts: types only, like rows.py, which re-exports them."""

from __future__ import annotations

from typing import Any, TypedDict


class GpuProcess(TypedDict):
    """GpuRow.processes: a compute process the GPU source lists."""

    pid: int
    used_mib: int | None


class Health(TypedDict):
    verdict: str  # agent/gpu/health.py ORDER
    reasons: list[str]


class Fabric(TypedDict):  # agent/gpu/fabric.py: state completed, in progress, not started, not supported
    state: str
    status: str | None  # NVML's words where the registration did not succeed


class MigInstance(TypedDict, total=False):
    index: int
    gpu_instance: int | None
    compute_instance: int | None
    uuid: str | None
    used_mib: int | None
    total_mib: int | None


class Mig(TypedDict, total=False):
    current: str
    pending: str | None
    instances: list[MigInstance]
    note: str


class GpuSettings(TypedDict, total=False):
    """GpuRow.settings (agent/gpu/settings.py); None: not supported (not_supported) or unread."""

    persistence: str | None  # "on", "off"
    compute_mode: str | None  # "default", "exclusive_process", "prohibited", ...
    graphics_clock_mhz: int | None  # application clocks
    memory_clock_mhz: int | None
    power_limit_w: float | None
    power_default_w: float | None
    mig: str | None  # "on", "off": the current MIG mode
    not_supported: list[str]
    unread: dict[str, str]


class _Gpu(TypedDict):
    index: int
    name: str
    used_mib: int | None
    reserved_mib: int | None
    total_mib: int | None
    processes: list[GpuProcess]


class GpuRow(_Gpu, total=False):
    """ScanResult.gpus, TeardownResult.before and after: one GPU as the source read it."""

    uuid: str
    unread: Any
    memory_call: str
    health: Health  # where assessed (views/health.py gpu_health reads it)
    fabric: Fabric  # where NVML reports one (agent/gpu/fabric.py)
    probe: dict  # verify --probe (agent/gpu/probe.py): state (ok, failed, hung, hidden...), seconds, error
    mig: Mig  # where read
    settings: GpuSettings  # status only (agent/gpu/settings.py)


class MpsControl(TypedDict, total=False):
    pid: int
    uid: int | None
    start_time: int
    pipe_dir: str | None
    cmdline: str | None


class MpsClient(TypedDict, total=False):
    pid: int
    gpu: int
    cmdline: str
    via: str


class MpsServer(MpsControl, total=False):  # and a control daemon's pid, uid, start_time, pipe_dir
    control: int | None
    gpus: dict[str, int | None]  # GPU index -> MiB
    clients: list[MpsClient]


class Mps(TypedDict, total=False):
    """ScanResult.mps, TeardownResult.mps: MPS daemons (agent/gpu/mps.py describe)."""

    controls: list[MpsControl]
    servers: list[MpsServer]


class MpsQuit(TypedDict, total=False):
    """TeardownResult.mps_quit: one control daemon told `quit` (agent/gpu/mps.py quit_daemon)."""

    control: int
    pipe_dir: str | None
    sent: bool
    output: str
    servers_gone: bool
    waited_s: float
    error: str | None
