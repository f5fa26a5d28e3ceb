"""One request per agent subcommand: its own flags (the agent's parser and options read them),
the argv the local side sends (argv) and how long the caller waits (deadline_s), both from the
fields, never from an argv read back. Frozen, equal by value (valuerecord.py); `replace` makes a changed copy."""
from __future__ import annotations

from . import defaults as shared
from .frame import encode_spec
from .valuerecord import ValueRecord

TYPE_CHECKING = False  # typing costs the agent ~3 ms a start: mypy reads this block by its name
if TYPE_CHECKING:

    from typing import ClassVar

    from typing_extensions import Self, dataclass_transform
else:
    def dataclass_transform(**_):
        return lambda cls: cls

# A floor for one call's round trip (ssh connect, the bundle, the scan); each request adds the
# waits its fields ask for: a teardown with --grace 30 may rightly take minutes, a ping never.
BASE_DEADLINE_S = 60.0
SPEC_FLAG = "--spec"
QUIESCE_S = 8 * 60  # reset --quiesce: up to four units stopped and started, each systemctl call 60 s at most


@dataclass_transform(frozen_default=True, kw_only_default=True)
class Request(ValueRecord):
    """`name`: the subcommand; `flags`: its own, in the parser's order; `selecting`: it also
    takes the host's selection (call.SELECTION_FLAGS). Fields are the annotations but ClassVars."""

    name = ""
    flags: ClassVar[tuple[str, ...]] = ()
    selecting = False

    @classmethod
    def field_names(cls) -> list:
        return [f for c in reversed(cls.__mro__) for f, kind in vars(c).get("__annotations__", {}).items()
                if not str(kind).startswith("ClassVar")]

    def replace(self, **changes) -> Self:
        return type(self)(**dict(vars(self), **changes))

    def __hash__(self):
        return hash((type(self).__name__, repr(self)))

    def argv(self) -> list:
        return []

    def deadline_s(self) -> float:
        return BASE_DEADLINE_S


class Ping(Request):
    name = "ping"


class Scan(Request):
    name, selecting = "scan", True


class Verify(Request):
    name, selecting = "verify", True
    flags = ("--max-used-mib", "--wait", "--probe", "--probe-mib")
    wait: float = shared.VERIFY_WAIT_S  # poll this long for free GPUs (0: look once)
    max_used_mib: int = shared.MAX_USED_MIB
    probe_mib: int | None = None  # --probe with a test buffer of this size (agent/gpu/probe.py)

    def argv(self) -> list:
        probe = [] if self.probe_mib is None else ["--probe", "--probe-mib", self.probe_mib]
        return ["--wait", self.wait, "--max-used-mib", self.max_used_mib] + probe

    def deadline_s(self) -> float:
        return BASE_DEADLINE_S + self.wait + (0 if self.probe_mib is None else shared.PROBE_DEADLINE_S)


class Plan(Request):
    """What a teardown would stop. `checkpoint_stops`: the specs of the host's phases' checkpoint
    stops (teardown/checkpoint.py), which transport.call_agent fills from the host."""

    name, selecting = "plan", True
    flags: ClassVar[tuple[str, ...]] = ("--only-matching", "--stop-starters", "--all-users", "--disable",
                                        "--checkpoint-stop")
    match: tuple = ()  # extra target patterns
    only_matching: bool = False
    disable: bool = False
    stop_starters: bool = False
    all_users: bool = False
    checkpoint_stops: tuple = ()

    def selection(self) -> list:
        """The flags that choose targets (a teardown takes the same)."""
        args = ["--match=" + m for m in self.match]  # =: a pattern may start with "-"
        args += ["--only-matching"] * self.only_matching + ["--disable"] * self.disable
        args += ["--all-users"] * self.all_users + ["--stop-starters"] * self.stop_starters
        return args + ["--checkpoint-stop=" + encode_spec(s) for s in self.checkpoint_stops]

    def argv(self) -> list:
        return self.selection()


class Teardown(Plan):
    """None: the flag is not passed and the agent's own rule holds (settle: SETTLE_S, or none
    when nothing can respawn; wait_lock: fail at once; operator: the agent's guess)."""

    name = "teardown"
    flags = Plan.flags + ("--max-used-mib", "--grace", "--timeout", "--wait-lock", "--operator", "--approved",
                          "--settle", "--mps", "--keep-shm", "--hold-s", "--hold-phase", "--hold-token")
    grace: float = shared.GRACE_S
    timeout: float = shared.TIMEOUT_S
    settle: float | None = None
    wait_lock: float | None = None
    max_used_mib: int = shared.MAX_USED_MIB
    operator: str | None = None
    mps_quit: bool = False
    keep_shm: bool = False  # keep what the targets left in /dev/shm and System V shared memory
    approved: str | None = None  # "pid:start,...": only these are signalled
    hold: tuple | None = None  # (seconds, phase, token): once FREED the lock stays a pivot's (agent hold.py)

    def plan(self) -> Plan:
        """The plan of the same selection (what a person approves before this teardown)."""
        return Plan(**{f: getattr(self, f) for f in Plan.field_names()})

    def argv(self) -> list:
        args = self.selection() + ["--grace", self.grace, "--timeout", self.timeout]
        args += [] if self.wait_lock is None else ["--wait-lock", self.wait_lock]
        args += ["--max-used-mib", self.max_used_mib]
        args += [] if self.operator is None else ["--operator", self.operator]
        args += [] if self.settle is None else ["--settle", self.settle]
        args += ["--mps", "quit"] * self.mps_quit + ["--keep-shm"] * self.keep_shm
        if self.hold is not None:
            args += ["--hold-s", self.hold[0], "--hold-phase", self.hold[1], "--hold-token", self.hold[2]]
        return args + ([] if self.approved is None else ["--approved", self.approved])

    def deadline_s(self) -> float:
        """Every wait it asks for: grace, wait-lock, settle and its timeout twice (once for TERM,
        once for KILL), the MPS daemons' one quit limit, the longest checkpoint stop first."""
        waits = self.grace + 2 * self.timeout + (self.wait_lock or 0.0) + (self.settle or 0.0)
        stops = max([float(s["deadline_s"]) for s in self.checkpoint_stops], default=0.0)
        return BASE_DEADLINE_S + waits + stops + (shared.MPS_QUIT_TIMEOUT_S if self.mps_quit else 0.0)


class _Phase(Request):
    """A phase's subcommand: the phase's spec (config Phase.spec()) goes as --spec."""

    flags: ClassVar[tuple[str, ...]] = (SPEC_FLAG,)
    spec: dict

    def argv(self) -> list:
        return [SPEC_FLAG, encode_spec(self.spec)]


class PhaseStart(_Phase):
    name = "phase-start"


class PhaseReady(_Phase):
    name, selecting = "phase-ready", True
    flags = (SPEC_FLAG, "--wait", "--intruders")
    wait: float = 0.0
    intruders: bool = False  # name a process outside the phase that opens a GPU meanwhile

    def argv(self) -> list:
        return super().argv() + ["--wait", self.wait] + ["--intruders"] * self.intruders

    def deadline_s(self) -> float:
        return BASE_DEADLINE_S + self.wait


class PhaseStop(_Phase):
    name = "phase-stop"
    flags = (SPEC_FLAG, "--operator")
    operator: str

    def argv(self) -> list:
        return super().argv() + ["--operator", self.operator]

    def deadline_s(self) -> float:
        """Its checkpoint stop's wait, then TERM -> KILL."""
        spec = self.spec
        stop = float(spec.get("stop_deadline") or 0) if spec.get("stop_signal") else 0.0
        return BASE_DEADLINE_S + 2 * float(spec.get("stop_timeout") or 0) + stop


class PhaseLogs(_Phase):
    name = "phase-logs"
    flags = (SPEC_FLAG, "--lines", "--follow")
    lines: int
    follow: bool = False  # until Ctrl-C: no deadline (ops/phase.follow_logs)

    def argv(self) -> list:
        return super().argv() + ["--lines", self.lines] + ["--follow"] * self.follow


class Smoke(_Phase):
    name = "smoke"

    def deadline_s(self) -> float:
        return BASE_DEADLINE_S + shared.SMOKE_TIMEOUT_S


class Drain(Request):
    name = "drain"
    flags = ("--url", "--timeout")
    url: str
    timeout: float

    def argv(self) -> list:
        return ["--url", self.url, "--timeout", self.timeout]

    def deadline_s(self) -> float:
        return BASE_DEADLINE_S + self.timeout


class Gates(_Phase):
    name = "gates"

    def deadline_s(self) -> float:
        return BASE_DEADLINE_S + shared.GATE_TIMEOUT_S * len(self.spec.get("gates") or ())


class Lint(Request):
    name, selecting = "lint", True
    flags = ("--max-used-mib", "--argv", "--gpus")
    command: str  # the launch command as JSON (a list of words)
    gpus: str | None = None
    max_used_mib: int = shared.MAX_USED_MIB

    def argv(self) -> list:
        gpus = [] if self.gpus is None else ["--gpus", self.gpus]
        return ["--argv", self.command, "--max-used-mib", self.max_used_mib] + gpus


class Deploy(_Phase):
    name = "deploy"
    flags = (SPEC_FLAG, "--action")
    action: str

    def argv(self) -> list:
        return super().argv() + ["--action", self.action]


class Reset(Request):
    name, selecting = "reset", True
    flags = ("--gpu", "--yes", "--quiesce")
    gpu: int
    yes: bool = False
    quiesce: bool = False

    def argv(self) -> list:
        return ["--gpu", self.gpu] + ["--yes"] * self.yes + ["--quiesce"] * self.quiesce

    def deadline_s(self) -> float:
        """nvidia-smi --gpu-reset is bounded by the agent itself; --quiesce adds its units'."""
        return BASE_DEADLINE_S + shared.RESET_TIMEOUT_S + (QUIESCE_S if self.quiesce else 0)


class GpuSettings(Request):
    name, selecting = "gpu-settings", True
    flags = ("--settings", "--operator")
    settings: str  # a JSON object {field: value} (agent gpu/settings_cmd.py)
    operator: str

    def argv(self) -> list:
        return ["--settings", self.settings, "--operator", self.operator]


class Release(Request):
    name = "release"
    flags = ("--token",)
    token: str

    def argv(self) -> list:
        return ["--token", self.token]


# Every subcommand, in the agent parser's order.
REQUESTS = (Ping, Scan, Verify, Plan, Teardown, PhaseStart, PhaseReady, PhaseStop, PhaseLogs, Smoke, Drain,
            Gates, Lint, Deploy, Reset, GpuSettings, Release)
