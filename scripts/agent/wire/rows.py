"""The rows inside results (a GPU, a holder, a plan target, an action...), as TypedDicts.

Why: mypy checks every key the local side reads. Types only (under TYPE_CHECKING); rows stay
plain dicts. An optional key is in a `total=False` class (3.8 has no NotRequired)."""
from __future__ import annotations

from typing import Any, TypedDict

from .gpu_rows import (  # noqa: F401 (re-exported: rows.GpuRow and its parts)
    Fabric,
    GpuProcess,
    GpuRow,
    GpuSettings,
    Health,
    Mig,
    MigInstance,
    Mps,
    MpsClient,
    MpsControl,
    MpsQuit,
    MpsServer,
)


class Container(TypedDict, total=False):
    """A process's container (agent/procs/cgroup.py); an LXC one seen from its node: pid inside, label."""
    kind: str  # "docker", "lxc", "kubernetes"
    id: str
    name: str | None  # docker's name, where the plan looked it up
    pid: int
    node_pid: int
    label: str


class _Pid(TypedDict):
    pid: int


class ProcessRow(_Pid, total=False):
    """A process as every kind of row names one (procscan.py detail, plan._row): what
    render.Command.of, render.command and status_view.where read."""
    start_time: int  # clock ticks since boot: with pid, which process it is
    ppid: int
    pgid: int
    sid: int
    uid: int
    user: str
    state: str  # /proc's one letter: R, S, D, Z, ...
    comm: str
    argv: list[str]
    cmdline: str
    unit: str | None
    container: Container | None
    gpu_mib: dict[str, int | None]  # GPU index (a string, as JSON keys are) -> MiB it uses there
    devices: list[str]  # the GPU device files it holds open
    write_files: list[str]  # files it writes in place (not logs)
    protected: str | None  # why it is never signalled; None: it may be


class Holder(ProcessRow, total=False):
    """ScanResult.holders: a process that holds a GPU (device file, mapping or memory)."""
    mapped_devices: list[str]
    age_s: float
    flags: int
    threads: int
    unreadable: str


class PlanRow(ProcessRow, total=False):
    """Plan.targets, protected, left_alone, starters (teardown/plan.py _row); TeardownResult.adopted."""
    reason: str
    via: str  # targets: "signal", "systemctl stop UNIT", "docker stop ID", ...
    hint: str  # starters: the command that stops exactly it
    fate: str  # starters: "stop" (frozen, ended after the targets), "freeze" (frozen, thawed), "watch" (a terminal)
    role: str  # starters: launcher, shell, terminal or starter (agent/policy/relation.py)
    foreground: bool  # a terminal's shell whose foreground job was a target: Ctrl-C for a loop typed there
    manager: PlanManagerRef  # the manager that runs and restarts it (supervisord, runit, podman, a pod...)
    wraps: list[int]  # starters, and wrappers stopped as targets: the pids of the targets it is related to


class ForeignPid(TypedDict):
    """ScanResult.foreign_gpu_pids: a pid the GPU source lists that /proc here does not show."""
    pid: int
    gpu: int
    used_mib: int | None


class LastTeardown(TypedDict, total=False):
    """ScanResult.last_teardown: the summary of the host's last teardown (agent/state/lastrun.py)."""
    started: str | None
    finished: str | None
    operator: str | None
    exit_code: int | None
    verdict: str | None
    signalled: int | None
    stuck: Any
    freed_mib: int | None
    wall_s: float | None
    state: str | None  # "running", "finished"


class LockHold(TypedDict, total=False):
    """TeardownResult.hold: the lock's text once a pivot's holder owns it (teardown/hold.py)."""
    phase: str
    pid: int  # the holder's
    since: float  # epoch seconds
    until: float  # the holder's own deadline


class StillHolding(ProcessRow, total=False):
    """still_holding (agent/teardown/verify.py); gpu None: a device file held, no memory used."""
    gpu: int | None
    used_mib: int | None


class Action(ProcessRow, total=False):
    """actions (and signal_failures): one audit record (agent/state/auditlog.py)."""
    time: str
    host: str
    operator: str
    signal: str  # "SIGTERM", "SIGKILL", "systemctl stop UNIT", ...
    result: str  # "sent", "gone", or why not
    comes_back: str  # a unit or container that starts again by itself (agent/teardown/units.py)
    shm: str  # "file" or "sysv": shared memory removed or kept (agent/teardown/shm.py)


class Respawn(ProcessRow, total=False):
    """TeardownResult.appeared (a respawn: agent/teardown/settle.py) and ignored (not a respawn)."""
    why: str
    started_by: str
    include: str | None  # what to add to stop what restarts it


class Stuck(ProcessRow, total=False):
    """TeardownResult.stuck: a target that did not end (agent/teardown/run.py stuck_report)."""
    in_exit: bool
    why: str
    wchan: str | None


class Unit(TypedDict, total=False):
    """Plan.units: a systemd unit the teardown stops (ctid: inside that LXC container)."""
    unit: str
    ctid: str | None
    pids: list[int]
    disable: bool
    pending: str  # no process yet: a restart its manager scheduled runs a target (agent/teardown/pending.py)


class PlanContainer(TypedDict, total=False):
    """Plan.containers: a docker container the teardown stops."""
    id: str
    name: str | None
    pids: list[int]
    disable: bool
    pending: str  # no process yet: docker is restarting it, and it runs a target


class PlanManagerRef(TypedDict):
    """PlanRow.manager: which manager runs the process, and the command that stops it."""
    kind: str  # supervisord, runit, s6, daemontools, podman, nerdctl, cri-containerd, crio, kubernetes, ray
    name: str | None
    stop_command: str | None


class PlanManager(TypedDict, total=False):
    """Plan.managers: a manager's stop (agent/teardown/plan.py _stop_item): `run`, or named only, with why."""
    kind: str
    name: str | None
    command: str | None
    argv: list[str] | None
    pids: list[int]
    run: bool
    why: str
    first: str | None  # to run before `command` (kubectl cordon NODE)
    comes_back: str | None
    daemon_pid: int | None
    main_pid: int | None  # what the manager runs itself: its stop signals it


class Writing(TypedDict):
    """Plan.writing: a target that writes files in place."""
    pid: int
    files: list[str]


class ShmLeftover(TypedDict, total=False):
    """Plan.shm, TeardownResult.shm_removed: a /dev/shm file or System V segment (teardown/shm.py)."""
    kind: str
    path: str
    shmid: int
    bytes: int
    pid: int
    uid: int
    removed: bool
    why: str


class CheckpointStop(TypedDict, total=False):
    """Plan's and TeardownResult/StopResult's checkpoint_stops (agent/teardown/checkpoint.py)."""
    phase: str
    signal: str
    checkpoint: str | None  # the glob in a plan; the file that arrived in a result
    deadline_s: float
    pids: list[int]
    waits_for: str
    outcome: str  # "checkpoint", "idle", "job exited" or "deadline"; arrived: a checkpoint did
    arrived: bool
    waited_s: float
    note: str | None  # why a new file did not count


class Unseen(TypedDict):
    """Plan.unseen: a target whose starter cannot be seen from the agent (agent/policy/relation.py)."""
    pid: int
    start_time: int
    cmdline: str
    why: str  # "PID 812's parent is outside this PID namespace (...)"


class Scope(TypedDict, total=False):
    """Plan.scope: only processes with `text` in their command line, of `uid`."""
    text: str | None
    uid: int | None


class PhaseState(TypedDict, total=False):
    """StartResult.state: {how: 'systemd-run', unit} or {how: 'setsid', pid, start_time, log}."""
    how: str
    unit: str
    pid: int
    start_time: int
    log: str
    exit_file: str
    name: str
    argv: list[str]
    started: float
    prep: list[Any]


class Prep(TypedDict, total=False):
    """ReadyResult.prep: one preparation job of a phase."""
    cmd: str
    pid: int
    exit: int | None
    status: str  # "running", "exited N", "gone"


class Check(TypedDict):
    """ResetResult.checks: one precondition and its answer."""
    check: str
    ok: bool
    detail: str


class SettingRow(TypedDict, total=False):
    """A GPU setting before and after a write (gpu/settings_write.py); result: set, already, FAILED."""
    gpu: int
    field: str
    before: Any
    want: Any
    after: Any
    result: str
    error: str | None


class Gate(TypedDict, total=False):
    """GatesResult.gates: one gate and its answer."""
    gate: str
    ok: bool
    detail: str


class Finding(TypedDict):
    """LintResult.findings: one finding about a launch command."""
    check: str
    message: str
