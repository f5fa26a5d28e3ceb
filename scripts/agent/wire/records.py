"""Every agent result as a typed record, one per subcommand (JSON with "command" and "exit_code"): the
agent writes it, the local side reads it; a missing required field is a ContractError naming it."""
from __future__ import annotations

from .codes import EXIT_OK
from .valuerecord import ValueRecord

TYPE_CHECKING = False  # typing costs the agent ~3 ms a start; mypy and ruff read this block by its name
if TYPE_CHECKING:  # absolute: the bundle ships what relative imports name, and rows are for mypy only
    from typing import Any

    from scripts.agent.wire import rows


class ContractError(ValueError):
    """An agent result without a key the contract requires (the agent and this module disagree)."""


def _need(doc, key, command):
    try:
        return doc[key]
    except KeyError:
        raise ContractError("the agent's %s result has no %r" % (command, key)) from None


def _fields(cls, code, doc, command, skip=()):
    """The keyword arguments of record `cls` read from `doc` (see the rule above)."""
    kw = {}
    for name in cls.field_names():
        if name == "code":
            kw[name] = code
        elif name in skip:
            continue
        elif not hasattr(cls, name):  # no default: required
            kw[name] = _need(doc, name, command)
        elif doc.get(name) is not None:
            kw[name] = doc[name]
    return kw


class Record(ValueRecord):
    """A result record (valuerecord.py): read-only, equal by value, its fields the annotations."""

    __hash__ = None  # type: ignore[assignment]  # equal by value, and its lists are mutable


class PingResult(Record):
    hostname: str
    pid: int
    uid: int
    python: str
    nvml: bool
    nvidia_smi: str | None
    fuser: str | None
    devices: list[str]
    sudo_user: str | None = None  # the user who became root with sudo, where the agent could tell
    code: int = EXIT_OK


class ScanResult(Record):
    hostname: str
    gpus: list[rows.GpuRow]
    holders: list[rows.Holder]
    gpu_source: str
    gpu_source_tried: list[str] = []
    devices_glob: str | None = None
    devices: list[str] = []
    denied: list[int] = []  # pids whose fds could not be read: nothing is called free
    denied_protected: list[int] = []  # the same, but protected: they cannot block FREE
    proc_hidden: str | None = None  # why /proc hides processes from this user (hidepid), if it does
    foreign_gpu_pids: list[rows.ForeignPid] = []
    last_teardown: rows.LastTeardown | None = None
    lock: str | None = None  # the host lock's holder in words while it is held (state/lockpeek.py)
    mps: rows.Mps | None = None
    code: int = EXIT_OK


class VerifyResult(Record):
    scan: ScanResult  # the same document, read as a scan
    free: bool
    problems: list[str]
    still_holding: list[rows.StillHolding] = []
    waited_s: float = 0.0
    probe: dict | None = None  # verify --probe (agent/gpu/probe.py); per GPU in gpus[].probe
    code: int = EXIT_OK


class Plan(Record):
    targets: list[rows.PlanRow]
    protected: list[rows.PlanRow]
    left_alone: list[rows.PlanRow] = []
    will_free_mib: int | None = None  # None: unknown (no per-process memory)
    units: list[rows.Unit] = []
    containers: list[rows.PlanContainer] = []
    managers: list[rows.PlanManager] = []  # other managers' stops: supervisorctl, sv down, podman stop; or named only
    starters: list[rows.PlanRow] = []  # related to a target (agent/policy/relation.py): fate stop, freeze or watch
    gone: list[rows.PlanRow] = []  # targets (and wrappers) that exited before the plan was made: not signalled
    writing: list[rows.Writing] = []
    shm: list[rows.ShmLeftover] = []  # /dev/shm files and SysV segments the targets may leave (teardown/shm.py)
    unseen: list[rows.Unseen] = []  # targets whose parent is outside the agent's sight: never FREED
    checkpoint_stops: list[rows.CheckpointStop] = []  # a running phase's stop, sent first (teardown/checkpoint.py)
    scope: rows.Scope = {}
    rules: list[str] = []

    def approved(self):
        """What it signals or stops, as `--approved` takes it (PID:START, unit=NAME, container=ID)."""
        return ",".join(["%(pid)s:%(start_time)s" % t for t in self.targets + self.starters if t.get("fate") != "watch"]
                        + ["unit=" + u["unit"] for u in self.units if u.get("pending")]
                        + ["container=" + c["id"] for c in self.containers if c.get("pending")])


class PlanResult(Record):
    scan: ScanResult
    plan: Plan
    code: int = EXIT_OK


class TeardownResult(Record):
    """Not started (state_error: nothing signalled), locked (error says by whom), or run."""
    code: int
    hostname: str | None = None
    locked: bool = False
    error: str | None = None
    state_error: str | None = None
    plan: Plan | None = None  # None when it did not run
    before: list[rows.GpuRow] = []  # GPU rows, as ScanResult.gpus
    after: list[rows.GpuRow] = []
    gpu_source: str | None = None
    actions: list[rows.Action] = []  # audit records {signal, pid, result, cmdline}
    problems: list[str] = []
    still_holding: list[rows.StillHolding] = []
    freed_mib: int | None = None  # None: unknown
    signalled: int = 0
    wall_s: float = 0.0
    free_at_s: float | None = None
    settled_at_s: float | None = None
    settle_s: float = 0.0
    unapproved: list[rows.PlanRow] = []
    adopted: list[rows.PlanRow] = []
    signal_failures: list[rows.Action] = []
    appeared: list[rows.Respawn] = []  # respawns: {pid, cmdline, why, started_by, include}
    ignored: list[rows.Respawn] = []  # seen in the settle window, not a respawn: {pid, cmdline, why}
    settle_ended: str | None = None  # why the window ended as soon as the GPUs read free
    stuck: list[rows.Stuck] = []
    concurrent_teardowns: list[rows.ProcessRow] = []  # other users' teardowns: {pid, user, cmdline}
    record_errors: list[str] = []
    shm_removed: list[rows.ShmLeftover] = []  # after FREED: each leftover, removed or kept, with its bytes
    mps: rows.Mps | None = None  # MPS as seen at the end (after: its GPU rows carry health)
    mps_quit: list[rows.MpsQuit] = []  # --mps quit: [{control, pipe_dir, sent, servers_gone, waited_s, error}]
    checkpoint_stops: list[rows.CheckpointStop] = []  # each running phase's checkpoint stop, before the plan
    hold: rows.LockHold | None = None  # --hold-s: the lock's text once its holder owns it (teardown/hold.py)
    # The scan it ended on, as the document carries it (a scan's keys; its GPU rows are `after`):
    holders: list[rows.Holder] = []
    denied: list[int] = []  # pids whose fds could not be read then: not free
    proc_hidden: str | None = None

    @property
    def ran(self):
        """False when nothing was signalled because it never started (locked, state dir refused)."""
        return self.plan is not None


class StartResult(Record):
    started: bool
    state: rows.PhaseState | None = None
    error: str | None = None
    code: int = EXIT_OK


class ReadyResult(Record):
    ready: bool
    detail: str = ""
    waited_s: float = 0.0
    log_tail: list[str] = []
    prep: list[rows.Prep] = []
    error: str | None = None
    intruders: list[rows.ProcessRow] = []  # --intruders: outside the phase, holding a GPU (phases/intruders.py)
    code: int = EXIT_OK


class StopResult(Record):
    stopped: list[Any]
    left: list[int] = []
    note: str | None = None
    actions: list[rows.Action] = []
    checkpoint_stops: list[rows.CheckpointStop] = []
    code: int = EXIT_OK


class LogsResult(Record):
    lines: list[str] = []
    where: str | None = None
    error: str | None = None
    code: int = EXIT_OK


class SmokeResult(Record):
    ok: bool
    status: int | None = None
    body: str = ""
    error: str | None = None
    code: int = EXIT_OK


class DrainResult(Record):
    drained: bool
    waited_s: float
    running: float | None = None
    note: str | None = None
    code: int = EXIT_OK


class GatesResult(Record):
    passed: bool
    gates: list[rows.Gate]  # [{gate, ok, detail}]
    code: int = EXIT_OK


class DeployResult(Record):
    ok: bool
    files: list[str]
    detail: str
    action: str
    code: int = EXIT_OK


class ResetResult(Record):
    """checks: [{check, ok, detail}]; command: the argv it runs (or would run, in a dry run)."""

    gpu: int
    checks: list[rows.Check]
    command: list[str]
    ready: bool
    ran: bool = False
    output: str | None = None
    note: str | None = None
    hostname: str | None = None
    quiesce: dict[str, Any] | None = None  # --quiesce: {daemons, persistence, steps, health} (teardown/quiesce.py)
    code: int = EXIT_OK


class SettingsResult(Record):
    rows: list[rows.SettingRow]  # each GPU's each setting asked for (gpu/settings_write.py)
    hostname: str | None = None
    note: str | None = None
    code: int = EXIT_OK


class ReleaseResult(Record):  # a pivot's hold ended, or was not held (ended), or is not ours
    released: bool
    held: bool = False
    held_s: float | None = None
    note: str | None = None  # not held: why
    error: str | None = None
    code: int = EXIT_OK


class LintResult(Record):
    findings: list[rows.Finding]  # [{check, message}]
    gpus_visible: int
    code: int = EXIT_OK


RESULTS = {
    "ping": PingResult, "scan": ScanResult, "verify": VerifyResult, "plan": PlanResult,
    "teardown": TeardownResult, "phase-start": StartResult, "phase-ready": ReadyResult,
    "phase-stop": StopResult, "phase-logs": LogsResult, "smoke": SmokeResult, "drain": DrainResult,
    "gates": GatesResult, "lint": LintResult, "deploy": DeployResult, "reset": ResetResult,
    "gpu-settings": SettingsResult, "release": ReleaseResult}


def read_plan(doc, command="plan"):
    """A plan (the "plan" object of a plan or teardown result) as a Plan."""
    return Plan(**_fields(Plan, None, doc, command))


def read_document(doc):
    """The record of a whole result document as the agent printed it (it names its command)."""
    return read(_need(doc, "command", "agent"), _need(doc, "exit_code", "agent"), doc)


def read(subcommand, code, doc):
    """The typed record of one subcommand's result document (RESULTS). Raises ContractError."""
    cls = RESULTS[subcommand]
    if cls is VerifyResult or cls is PlanResult:
        kw = _fields(cls, code, doc, subcommand, skip=("scan", "plan"))
        kw["scan"] = ScanResult(**_fields(ScanResult, code, doc, subcommand))
        if cls is PlanResult:
            kw["plan"] = read_plan(_need(doc, "plan", subcommand), subcommand)
        return cls(**kw)
    if cls is TeardownResult:
        if doc.get("locked"):
            return cls(code=code, hostname=doc.get("hostname"), locked=True, error=_need(doc, "error", subcommand))
        if doc.get("state_error"):
            return cls(code=code, hostname=doc.get("hostname"), error=doc.get("error"), state_error=doc["state_error"])
        kw = _fields(cls, code, doc, subcommand, skip=("plan",))
        for key in ("hostname", "before", "after", "wall_s"):  # required of a teardown that ran
            kw[key] = _need(doc, key, subcommand)
        return cls(plan=read_plan(_need(doc, "plan", subcommand), subcommand), **kw)
    if cls is StartResult and _need(doc, "started", subcommand):
        _need(doc, "state", subcommand)  # a started phase says how and where
    return cls(**_fields(cls, code, doc, subcommand))


def written(cls, more=(), **fields):
    """The document of a result the agent builds as record `cls`. The record is made first, of
    `fields` and the keys of `more` it names: a field it lacks, or a required one left out,
    fails in the agent (TypeError), not as a ContractError on the operator's side. The document
    is `more` with `fields` over it, `code` as "exit_code", extra keys (timings) as they are."""
    doc = dict(more)
    doc.update(fields)
    names = cls.field_names()
    kw = {key: value for key, value in doc.items() if key in fields or key in names}
    if "scan" in names:  # verify's and plan's: a scan's document with their keys beside, as read() reads it
        kw["scan"] = ScanResult(**_named(ScanResult, doc))
        if "plan" in names:
            kw["plan"] = Plan(**_named(Plan, doc["plan"]))
    cls(**kw)
    doc["exit_code"] = doc.pop("code")
    return doc


def _named(cls, doc):
    return {key: doc[key] for key in cls.field_names() if key in doc}
