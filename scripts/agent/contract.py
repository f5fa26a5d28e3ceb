"""What crosses the wire between the local side and the agent, defined once for both.

Why one module: the agent runs on the GPU host from a bundle sent on stdin, the local side
on the operator's machine; they agree on the agent's argv (subcommands, the flags each
takes, the nonce), the marker lines around the result, the progress lines, the phase spec,
the exit codes and the shape of every result. Each side imports only this module from the
other: the agent imports nothing of the local side, and the local side imports nothing of
scripts/agent but this (tests/test_layers.py keeps it so). The local side reads every
result through the records at the end of this file, one reader per result type, so a key
the agent renames fails in one place, loudly (ContractError), instead of as a KeyError in
a view.

Standard library only, Python 3.8 syntax: it ships in the agent bundle.
"""
from __future__ import annotations

import binascii
import json
import os
import re

from . import textsafe  # noqa: F401  (re-exported)

# Shared primitives, re-exported for the local side. Both sides must apply the SAME checks:
# statedir makes and checks private state directories and files (the agent's run dir on the
# host; the local audit log, ssh ControlPath and sandbox directories here), and procfs
# identifies a process by pid + start time and signals it only if it is still that one (the
# agent's targets; the sandbox's processes here). A second copy on the local side would drift.
# textsafe is the one escaping rule for host text (terminals) and JSON (valid Unicode).
from .procs import procfs  # noqa: F401  (re-exported)
from .state import statedir  # noqa: F401  (re-exported)
from .subcommands import MODULES as SUBCOMMAND_MODULES  # noqa: F401  (re-exported: the bundle ships by it)

# a teardown's and a verify's defaults, re-exported
from .waits import GRACE_S, MAX_USED_MIB, SETTLE_S, TIMEOUT_S, VERIFY_WAIT_S, WAIT_LOCK_S  # noqa: F401

TYPE_CHECKING = False  # typing costs the agent ~3 ms a start; mypy and ruff read this block by its name
if TYPE_CHECKING:
    from typing import Any, TypedDict

    # -- rows: the dicts inside results --------------------------------------------------------
    # What the agent prints inside a result (a GPU, a holder, a plan target, an action...), as
    # TypedDicts, so mypy checks every key the local side reads (row["pid"]). Types only: they
    # exist for mypy (this block never runs), rows stay the plain dicts json.loads makes, and
    # the JSON is what the agent prints. A key the agent may leave out is in a `total=False`
    # class (no NotRequired: Python 3.8 has none); a class with required keys and optional
    # ones is two, the second deriving from the first. mypy lets `row["key"]` read an
    # optional key, so the split matters for what a row must hold, not for reading it.

    class Container(TypedDict, total=False):
        """The container a process runs in (agent/procs/cgroup.py); an LXC one seen from its node
        also carries the pid inside it and a label to show."""
        kind: str  # "docker", "lxc", "kubernetes"
        id: str
        name: str | None  # docker's name, where the plan looked it up
        pid: int
        node_pid: int
        label: str

    class _Pid(TypedDict):
        pid: int

    class ProcessRow(_Pid, total=False):
        """A process, as every kind of row names one (holders, plan rows, still holding, stuck,
        respawns, ...): each kind carries some of these (agent/procs/procscan.py detail, plan._row).
        What render.Command.of, render.command and status_view.where read."""
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
        """Plan.targets, protected, left_alone and supervisors (agent/teardown/plan.py _row);
        TeardownResult.adopted: a row and why it is one."""
        reason: str
        via: str  # targets: "signal", "systemctl stop UNIT", "docker stop ID", ...
        hint: str  # supervisors: how to stop it too
        manager: PlanManagerRef  # the manager that runs and restarts it (supervisord, runit, podman, a pod...)
        wraps: list[int]  # supervisors, and wrappers stopped as targets: the pids of the targets it runs

    class GpuProcess(TypedDict):
        """GpuRow.processes: a compute process the GPU source lists."""
        pid: int
        used_mib: int | None

    class Health(TypedDict):
        verdict: str  # HEALTH_VERDICTS
        reasons: list[str]

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
        health: Health  # where assessed (gpu_health reads it)
        mig: Mig  # where read

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

    class MpsServer(TypedDict, total=False):
        pid: int
        uid: int | None
        start_time: int
        control: int | None
        pipe_dir: str | None
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

    class StillHolding(ProcessRow, total=False):
        """VerifyResult and TeardownResult.still_holding (agent/teardown/verify.py): what holds a GPU;
        gpu None: a holder of a device file with no memory on any GPU."""
        gpu: int | None
        used_mib: int | None

    class Action(ProcessRow, total=False):
        """TeardownResult.actions, StopResult.actions: one audit record (agent/state/auditlog.py):
        a signal sent, a unit or container stopped; signal_failures: one that failed."""
        time: str
        host: str
        operator: str
        signal: str  # "SIGTERM", "SIGKILL", "systemctl stop UNIT", ...
        result: str  # "sent", "gone", or why not
        comes_back: str  # a unit or container that starts again by itself (agent/teardown/units.py)

    class Respawn(ProcessRow, total=False):
        """TeardownResult.appeared (a respawn: agent/teardown/settle.py) and ignored (seen in the settle
        window, not a respawn)."""
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

    class PlanContainer(TypedDict, total=False):
        """Plan.containers: a docker container the teardown stops."""
        id: str
        name: str | None
        pids: list[int]
        disable: bool

    class PlanManagerRef(TypedDict):
        """PlanRow.manager: which manager runs the process, and the command that stops it."""
        kind: str  # supervisord, runit, s6, daemontools, podman, nerdctl, cri-containerd, crio, kubernetes, ray
        name: str | None
        stop_command: str | None

    class PlanManager(TypedDict, total=False):
        """Plan.managers: a manager's stop (agent/teardown/plan.py _stop_item): run by the
        teardown (`run`) or named only, with why."""
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

    class Gate(TypedDict, total=False):
        """GatesResult.gates: one gate and its answer."""
        gate: str
        ok: bool
        detail: str

    class Finding(TypedDict):
        """LintResult.findings: one finding about a launch command."""
        check: str
        message: str

# -- exit codes ----------------------------------------------------------------------------------

EXIT_OK = 0
EXIT_NOT_FREE = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
EXIT_LOCKED = 4
EXIT_GATE = 5
EXIT_UNINSPECTED = 6
EXIT_TIMED_OUT = 7     # no answer in time: ssh's connect or keep-alive timeout, or the call's deadline
EXIT_DECLINED = 8      # the operator answered no at the confirmation: nothing was done
EXIT_UNHEALTHY = 9     # free, but a GPU's health verdict says drain, reset or reboot (agent/gpu/health.py)
EXIT_OUTPUT = 10       # stdout could not be written (disk full, I/O error): the task's own code is on stderr
EXIT_INTERRUPTED = 130
EXIT_CLOSED_PIPE = 141  # 128 + SIGPIPE, as a shell reports a program its reader left: Invoke's own output
EXIT_FAILED = EXIT_NOT_FREE  # the same 1, for subcommands not about free GPUs: not started, not ready, not stopped

# (code, name, meaning): the one table the README, the task docstrings and both sides follow.
EXIT_CODES = (
    (EXIT_OK, "ok", "done; for teardown and verify: every GPU free, verified"),
    (EXIT_NOT_FREE, "not-free", "done but not free (or not ready, rolled back, a prep job failed)"),
    (EXIT_USAGE, "usage", "bad input: one line names the bad value; nothing ran"),
    (EXIT_UNREACHABLE, "unreachable", "host unreachable, the agent failed there, or a state directory is unusable"),
    (EXIT_LOCKED, "locked", "another teardown holds the host's lock"),
    (EXIT_GATE, "gate-failed", "a pivot's drain, a gate or the launch lint blocked it: nothing started"),
    (EXIT_UNINSPECTED, "uninspected", "not every process could be inspected (run as root): never called free"),
    (EXIT_TIMED_OUT, "timed-out", "the host did not answer in time (ssh connect or keep-alive timeout, or the "
                                  "call's --timeout); other hosts of a fleet still finish"),
    (EXIT_DECLINED, "declined", "the confirmation was answered no: nothing was signalled or started"),
    (EXIT_UNHEALTHY, "unhealthy", "free, but a GPU's health verdict is drain, reset needed or reboot needed"),
    (EXIT_OUTPUT, "output-failed", "stdout could not be written (disk full, I/O error); the task ran to its end "
                                   "and its own exit code is named on stderr"),
    (EXIT_INTERRUPTED, "interrupted", "Ctrl-C on the local side; the host side continues"),
    (EXIT_CLOSED_PIPE, "closed-pipe", "the reader closed the pipe of Invoke's own --list, --help or --version"),
)


def exit_name(code):
    """'locked' for 4; 'exit N' for a code outside the table (e.g. a remote command's own)."""
    for number, name, _ in EXIT_CODES:
        if number == code:
            return name
    return "exit %s" % code


# -- defaults both sides use ---------------------------------------------------------------------

DEVICE_GLOB = "/dev/nvidia*"          # the GPU device files, when a host names none
TIME_FORMAT = "%Y-%m-%dT%H:%M:%S%z"  # audit records, last.json, pivot records: ISO 8601 with offset
MAX_WAIT_S = 3600  # the longest wait either side accepts: a typo must not hold a host's lock for days
MPS_QUIT_TIMEOUT_S = 10.0  # `teardown --mps quit`: every daemon's quit together (mps.py); the caller waits more
RESET_TIMEOUT_S = 120  # `nvidia-smi --gpu-reset` may take this long on the host (reset.py); the caller waits more
GATE_TIMEOUT_S = 600.0  # each command gate of a phase (phases/gates.py); the caller waits this per gate
SMOKE_TIMEOUT_S = 60.0  # a phase's smoke request (phases/run.py); the caller waits this more
STOP_TIMEOUT_S = 30.0  # a phase's stop: SIGTERM to SIGKILL, when its spec names none (phases/run.py)

# -- subcommands and their flags -----------------------------------------------------------------

STDIN = "-"  # the agent's source comes on stdin: `python3 - SUBCOMMAND ...`
# The transport's form: `python3 -S -c BOOT - SUBCOMMAND ...`, stdin = the bundle zlib-compressed
# (bundle.agent_stream). Why: Python reads a script from stdin at ~0.25 ms per KB, where raw
# bytes cost nothing, and -S skips site (.pth files: 50-85 ms on a torch host) before the first
# signal; the agent adds site only when it imports pynvml (gpuinfo.import_pynvml), after them.
# The first statement drops '' (the working directory, which `-c` and `-` put first on sys.path):
# the agent runs as root in whatever directory the operator stands in, and a zlib.py or json.py
# another user left there must never be imported (tests/test_agent_imports.py).
BOOT = ("import sys;sys.path[:]=[p for p in sys.path if p];import zlib;"
        "_D=zlib.decompress(sys.stdin.buffer.read());exec(_D[:_D.index(bytes(1))])")
STREAM_FLAGS = ("-S", "-c", BOOT)

# Every subcommand takes these (the transport sends the first ones; --json is for people).
COMMON_FLAGS = ("--marker", "--json", "--progress", "--devices", "--fake-devices", "--run-dir")
# What the host's configuration selects (targets, protect list, scope); only SELECTING take them.
SELECTION_FLAGS = ("--protect", "--target", "--match", "--fake-gpus", "--scope", "--scope-uid")
SELECTING = ("scan", "verify", "plan", "teardown", "lint", "reset")
SPEC_FLAG = "--spec"

# Each subcommand and its own flags (beyond COMMON_FLAGS, and SELECTION_FLAGS for SELECTING).
# The agent's parser is built in this order; tests/test_contract.py checks it has exactly these.
SUBCOMMANDS = {
    "ping": (),
    "scan": (),
    "verify": ("--max-used-mib", "--wait"),
    "plan": ("--only-matching", "--stop-supervisors", "--all-users", "--disable"),
    "teardown": ("--only-matching", "--stop-supervisors", "--all-users", "--disable", "--max-used-mib", "--grace",
                 "--timeout",
                 "--wait-lock", "--operator", "--approved", "--settle", "--mps"),
    "phase-start": (SPEC_FLAG,),
    "phase-ready": (SPEC_FLAG, "--wait"),
    "phase-stop": (SPEC_FLAG, "--operator"),
    "phase-logs": (SPEC_FLAG, "--lines", "--follow"),
    "smoke": (SPEC_FLAG,),
    "drain": ("--url", "--timeout"),
    "gates": (SPEC_FLAG,),
    "lint": ("--max-used-mib", "--argv", "--gpus"),
    "deploy": (SPEC_FLAG, "--action"),
    "reset": ("--gpu", "--yes"),
}


def new_nonce():
    """16 hex digits, fresh per call: what the result's marker lines carry."""
    return binascii.hexlify(os.urandom(8)).decode()


# Never signalled, by any of the names a process goes by (rules.names_of). One list for the
# agent and the shell one-liner (shell_teardown generates its `case` from it; a test keeps
# scripts/emergency/teardown.sh equal). Names ending in a suffix below are exporters.

# The target patterns when a host names none: programs (see agent/procs/program.py), matched
# whole against a process's module, script, executable or title. Here, in the wire, because the
# shell one-liner (scripts/emergency) is generated from the same list as the agent's rules.
DEFAULT_TARGETS = (
    r"sglang\.launch_server",
    r"sglang serve",
    r"sglang::.*",
    r"vllm serve",
    r"vllm\.entrypoints",
    r"VLLM::.*",
    r"torchrun",
)

PROTECTED_NAMES = {
    "sshd": "ssh server",
    "nvidia-persistenced": "NVIDIA persistence daemon",
    "nvidia-persiste": "NVIDIA persistence daemon",
    "nv-hostengine": "DCGM host engine",
    "dcgm-exporter": "DCGM exporter",
    "nvidia-smi": "GPU monitor",
    "nvitop": "GPU monitor",
    "gpustat": "GPU monitor",
    "nvtop": "GPU monitor",
    "nvidia-dcgm": "DCGM",
    "pct": "Proxmox pct (route)",
    "lxc-attach": "Proxmox lxc-attach (route)",
    "systemd": "init/systemd",
    "nv-fabricmanager": "NVIDIA Fabric Manager (NVSwitch fabric)",
    "nvidia-fabricmanager": "NVIDIA Fabric Manager (NVSwitch fabric)",
    "Xorg": "X server (display GPU)",
    "Xwayland": "X server (display GPU)",
    "lxc-start": "LXC container monitor (lxc-start / [lxc monitor])",
    "lxc-monitord": "LXC monitor daemon",
    "nvidia-cuda-mps-control": "CUDA MPS control daemon",
    "nvidia-cuda-mps-server": "CUDA MPS server (its daemon quits it: teardown --mps quit)",
}
PROTECTED_SUFFIXES = ("-exporter", "_exporter")


def agent_argv(python, subcommand, nonce, devices=DEVICE_GLOB, progress=False, run_dir=None,  # noqa: PLR0913
               fake_devices=False, targets=(), protect=(), fake_gpus=None, scope=None, scope_uid=None, args=(),
               stream=False):  # one keyword per hosts.env key and flag the agent takes
    """The agent's argv on the host: `PYTHON - SUBCOMMAND --devices GLOB --marker NONCE ...`,
    or with `stream` `PYTHON -S -c BOOT - SUBCOMMAND ...` (stdin: bundle.agent_stream()).

    The selection (targets, protect, fake_gpus, scope, scope_uid) goes only to the
    subcommands that take it. `args` are the subcommand's own flags, as given.
    """
    if subcommand not in SUBCOMMANDS:
        raise ValueError("unknown agent subcommand %r" % subcommand)
    # Values go as --flag=VALUE: a value that starts with '-' (a scope such as '--token', a
    # pattern such as '-serve') would otherwise be read by argparse as another flag.
    argv = [python] + list(STREAM_FLAGS if stream else ()) + [STDIN, subcommand, "--devices=" + devices, "--marker",
                                                              nonce]
    if progress:
        argv.append("--progress")
    if run_dir:
        argv.append("--run-dir=" + run_dir)
    if fake_devices:
        argv.append("--fake-devices")
    if subcommand in SELECTING:
        argv += ["--target=" + p for p in targets]
        argv += ["--protect=" + p for p in protect]
        if fake_gpus:
            argv.append("--fake-gpus=" + fake_gpus)
        if scope:
            argv.append("--scope=" + scope)
        if scope_uid is not None:
            argv.append("--scope-uid=%d" % scope_uid)
    return argv + [str(a) for a in args]


def agent_call(argv):
    """The subcommand of an argv shaped as agent_argv() makes it, or None.

    What the agent uses to know another gpu-pivot agent when it sees one in /proc (to protect
    it, or to find another user's teardown): interpreter `pythonX.Y`, `-`, a known
    subcommand, and `--marker` followed by a hex nonce (either form of agent_argv()).
    """
    if list(argv[1:1 + len(STREAM_FLAGS)]) == list(STREAM_FLAGS):
        argv = argv[:1] + argv[1 + len(STREAM_FLAGS):]
    if len(argv) < 5 or argv[1] != STDIN or argv[2] not in SUBCOMMANDS:
        return None
    exe = os.path.basename(argv[0])
    if not (exe.startswith("python") and all(c.isdigit() or c == "." for c in exe[len("python"):])):
        return None
    for i, word in enumerate(argv[:-1]):
        if word == "--marker":
            nonce = argv[i + 1]
            return argv[2] if nonce and all(c in "0123456789abcdef" for c in nonce) else None
    return None


# -- what program a process runs ------------------------------------------------------------------
# The agent names a process by its program (program.py: targets are programs, not text); the
# local side shows the same name in its tables (scripts/views/render.py). One parser for both.
INTERPRETERS = re.compile(r"^(python[0-9.]*m?|pypy[0-9.]*|perl[0-9.]*|ruby[0-9.]*|node|nodejs|bash|sh|dash|zsh|ksh)$")
# interpreter options that take the next argument as their value
_OPT_WITH_VALUE = {"-X", "-W", "-Q", "-I", "-e", "-E", "-r", "-o", "-O"}
_PY_OPT_WITH_VALUE = {"-X", "-W", "-Q"}
_CODE_FLAGS = {"-c", "-e", "-E", "--eval", "-p", "--print"}


def interpreted(argv):
    """(kind, value, rest) for what an interpreter argv runs: ('module', 'a.b', rest),
    ('script', '/x/y.py', rest), ('code', None, []) or (None, None, [])."""
    name = os.path.basename(argv[0])
    python = name.startswith("python") or name.startswith("pypy")
    with_value = _PY_OPT_WITH_VALUE if python else _OPT_WITH_VALUE
    i = 1
    while i < len(argv):
        arg = argv[i]
        if arg == "-m" and python and i + 1 < len(argv):
            return "module", argv[i + 1], argv[i + 2:]
        if python and arg.startswith("-m") and len(arg) > 2:
            return "module", arg[2:], argv[i + 1:]
        if arg in _CODE_FLAGS or (python and arg.startswith("-c")):
            return "code", None, []
        if arg == "--":
            i += 1
            break
        if arg.startswith("-") and arg != "-":
            i += 2 if arg in with_value else 1
            continue
        break
    if i < len(argv) and argv[i] != "-":
        return "script", argv[i], argv[i + 1:]
    return None, None, []


def program_of(argv):
    """([words naming the program], [its arguments]), without the interpreter: `python3 -m
    sglang.launch_server X` is `sglang.launch_server`, `python3 /x/train.py` is `train.py`,
    `/usr/bin/nvidia-persistenced` is `nvidia-persistenced`; a title the program set
    (`sglang::scheduler_TP0`) stays whole. How a process is named to people, on both sides."""
    first = argv[0]
    if "::" in first or " " in first.strip():
        return [first.strip()], list(argv[1:])
    base = os.path.basename(first) or first
    if not INTERPRETERS.match(base):
        return [base], list(argv[1:])
    kind, value, rest = interpreted(argv)
    if kind == "module":
        return [value], list(rest)
    if kind == "script":
        return [os.path.basename(value) or value], list(rest)
    return [base], list(argv[1:])  # inline code (-c) or a bare interpreter: its arguments say what it is


# -- the result's marker lines -------------------------------------------------------------------
# Login shells print MOTDs and rc-file noise on stdout. The local side keeps only what lies
# between `begin` and `end` lines carrying a nonce it chose, so noise (or a process printing
# a fake marker) cannot be mistaken for the result.

MARKER_PREFIX = "=====gpu-pivot-result"


def begin(nonce):
    return "%s %s begin=====" % (MARKER_PREFIX, nonce)


def end(nonce):
    return "%s %s end=====" % (MARKER_PREFIX, nonce)


def frame(nonce, text):
    """The result as the agent prints it: begin line, the JSON text, end line."""
    return "\n".join([begin(nonce), text, end(nonce)]) + "\n"


class MarkerError(ValueError):
    """The output had no well-formed result block."""


def extract(text, nonce):
    """The text between this nonce's marker lines; MarkerError when absent or unclosed."""
    lines = text.splitlines()
    b, e = begin(nonce), end(nonce)
    try:
        start = lines.index(b)
    except ValueError:
        raise MarkerError("no result marker in the agent's output") from None
    try:
        stop = lines.index(e, start + 1)
    except ValueError:
        raise MarkerError("the agent's result was cut off (begin marker without end marker)") from None
    return "\n".join(lines[start + 1:stop])


# -- progress lines ------------------------------------------------------------------------------
# With --progress the agent prints these on stdout before its result, one JSON object per
# line, so the local side can show a teardown or a wait while it runs.

PROGRESS_PREFIX = "gpu-pivot-progress "


def progress_line(fields):
    return PROGRESS_PREFIX + json.dumps(fields, sort_keys=True) + "\n"


def parse_progress(line):
    """The fields of a progress line, or None when the line is not one (it is output then)."""
    if not line.startswith(PROGRESS_PREFIX):
        return None
    try:
        fields = json.loads(line[len(PROGRESS_PREFIX):])
    except ValueError:
        return None
    return fields if isinstance(fields, dict) else None


# -- the phase spec ------------------------------------------------------------------------------
# A phase travels as base64 of its JSON: one argv word, nothing for any shell layer to
# re-parse, whatever its commands hold.


def encode_spec(spec):
    return binascii.b2a_base64(json.dumps(spec, sort_keys=True).encode(), newline=False).decode()


def decode_spec(text):
    return json.loads(binascii.a2b_base64(text.encode()).decode())


def spec_args(spec):
    return [SPEC_FLAG, encode_spec(spec)]


# -- results ------------------------------------------------------------------------------------
# Every result is one JSON object with "command" and "exit_code"; a bad flag gives
# {"usage_error": TEXT} and exit 2 instead. The records below are how the local side reads
# each kind (read(), below): a field without a default is required (a result without it is a
# ContractError naming the key); the others take their default when the key is absent or
# null. Lists of rows (GPUs, holders, plan targets, actions) stay the dicts the JSON holds
# (not read key by key here: one view renders each kind of row); their keys are typed by the
# row TypedDicts at the top of this file, for mypy only.

USAGE_ERROR = "usage_error"
AGENT_ERROR = "agent_error"  # {"agent_error": "IndexError: ... at program.py:72 in names"}: the agent failed (exit 3)


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


class Record:
    """A result record: its fields are the class's annotations, in order; a field without a
    class-level default is required. Read-only once made; a list or dict default is copied.

    Why not dataclasses: the agent imports this module on every call and never makes a
    record, and creating fifteen dataclasses costs it about 15 ms each time.
    """

    def __init__(self, **values):
        for name in self.field_names():
            if name in values:
                value = values.pop(name)
            elif hasattr(type(self), name):
                value = getattr(type(self), name)
                value = type(value)(value) if isinstance(value, (list, dict)) else value
            else:
                raise TypeError("%s: %r is required" % (type(self).__name__, name))
            object.__setattr__(self, name, value)
        if values:
            raise TypeError("%s has no field %s" % (type(self).__name__, ", ".join(sorted(values))))

    @classmethod
    def field_names(cls):
        return list(cls.__annotations__)

    def __setattr__(self, name, value):
        raise AttributeError("%s is read-only" % type(self).__name__)

    def __eq__(self, other):
        return type(self) is type(other) and vars(self) == vars(other)

    __hash__ = None  # type: ignore[assignment]  # equal by value, and its lists are mutable

    def __repr__(self):
        return "%s(%s)" % (type(self).__name__, ", ".join("%s=%r" % item for item in vars(self).items()))


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
    """gpus: [{index, name, used_mib, reserved_mib, total_mib, processes: [{pid, used_mib}],
    health: {verdict, reasons}, mig: {current, pending, instances}}] (health and mig where read:
    see gpu_health); holders: [{pid, user, state, cmdline, devices, gpu_mib, protected, unit,
    container, ...}]; mps: {controls, servers: [{pid, gpus, clients, pipe_dir}]} where MPS runs."""

    hostname: str
    gpus: list[GpuRow]
    holders: list[Holder]
    gpu_source: str
    gpu_source_tried: list[str] = []
    devices_glob: str | None = None
    devices: list[str] = []
    denied: list[int] = []  # pids whose fds could not be read: nothing is called free
    denied_protected: list[int] = []  # the same, but protected: they cannot block FREE
    proc_hidden: str | None = None  # why /proc hides processes from this user (hidepid), if it does
    foreign_gpu_pids: list[ForeignPid] = []
    last_teardown: LastTeardown | None = None
    mps: Mps | None = None
    code: int = EXIT_OK


# A GPU's health verdict (scripts/agent/gpu/health.py), worst last; "unknown" where nothing was read.
HEALTH_VERDICTS = ("ok", "unknown", "drain", "reset needed", "reboot needed")


def gpu_health(row: GpuRow) -> Health:
    """{verdict, reasons} of one GPU row of a scan, verify or teardown result; 'unknown' when
    the agent did not assess it (an older agent, or a row from before the teardown)."""
    h: Health | dict[str, Any] = row.get("health") or {}
    return {"verdict": h.get("verdict") or "unknown", "reasons": list(h.get("reasons") or [])}


class VerifyResult(Record):
    scan: ScanResult  # the same document, read as a scan
    free: bool
    problems: list[str]
    still_holding: list[StillHolding] = []
    waited_s: float = 0.0
    code: int = EXIT_OK


class Plan(Record):
    """targets, protected, left_alone: rows {pid, start_time, state, cmdline, reason, gpu_mib, via, ...}."""

    targets: list[PlanRow]
    protected: list[PlanRow]
    left_alone: list[PlanRow] = []
    will_free_mib: int = 0
    units: list[Unit] = []
    containers: list[PlanContainer] = []
    managers: list[PlanManager] = []  # other managers' stops: supervisorctl, sv down, podman stop; or named only
    supervisors: list[PlanRow] = []
    gone: list[PlanRow] = []  # targets (and wrappers) that exited before the plan was made: not signalled
    writing: list[Writing] = []
    scope: Scope = {}
    rules: list[str] = []

    def approved(self):
        """The targets as `--approved PID:START,...` takes them (what the operator saw)."""
        return ",".join("%s:%s" % (t["pid"], t["start_time"]) for t in self.targets)


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
    before: list[GpuRow] = []  # GPU rows, as ScanResult.gpus
    after: list[GpuRow] = []
    gpu_source: str | None = None
    actions: list[Action] = []  # audit records {signal, pid, result, cmdline}
    problems: list[str] = []
    still_holding: list[StillHolding] = []
    freed_mib: int = 0
    signalled: int = 0
    wall_s: float = 0.0
    free_at_s: float | None = None
    settled_at_s: float | None = None
    settle_s: float = 0.0
    unapproved: list[PlanRow] = []
    adopted: list[PlanRow] = []
    signal_failures: list[Action] = []
    appeared: list[Respawn] = []  # respawns: {pid, cmdline, why, started_by, include}
    ignored: list[Respawn] = []  # seen in the settle window, not a respawn: {pid, cmdline, why}
    settle_ended: str | None = None  # why the window ended as soon as the GPUs read free
    stuck: list[Stuck] = []
    concurrent_teardowns: list[ProcessRow] = []  # other users' teardowns: {pid, user, cmdline}
    record_errors: list[str] = []
    mps: Mps | None = None  # MPS as seen at the end (after: its GPU rows carry health)
    mps_quit: list[MpsQuit] = []  # --mps quit: [{control, pipe_dir, sent, servers_gone, waited_s, error}]
    # The scan it ended on, as the document carries it (a scan's keys; its GPU rows are `after`):
    holders: list[Holder] = []
    denied: list[int] = []  # pids whose fds could not be read then: not free
    proc_hidden: str | None = None

    @property
    def ran(self):
        """False when nothing was signalled because it never started (locked, state dir refused)."""
        return self.plan is not None


class StartResult(Record):
    """state: {how: 'systemd-run', unit} or {how: 'setsid', pid, start_time, log}."""

    started: bool
    state: PhaseState | None = None
    error: str | None = None
    code: int = EXIT_OK


class ReadyResult(Record):
    """prep: [{cmd, pid, exit, status}], the phase's preparation jobs."""

    ready: bool
    detail: str = ""
    waited_s: float = 0.0
    log_tail: list[str] = []
    prep: list[Prep] = []
    error: str | None = None
    code: int = EXIT_OK


class StopResult(Record):
    stopped: list[Any]
    left: list[int] = []
    note: str | None = None
    actions: list[Action] = []
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
    gates: list[Gate]  # [{gate, ok, detail}]
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
    checks: list[Check]
    command: list[str]
    ready: bool
    ran: bool = False
    output: str | None = None
    note: str | None = None
    hostname: str | None = None
    code: int = EXIT_OK


class LintResult(Record):
    findings: list[Finding]  # [{check, message}]
    gpus_visible: int
    code: int = EXIT_OK


RESULTS = {
    "ping": PingResult, "scan": ScanResult, "verify": VerifyResult, "plan": PlanResult,
    "teardown": TeardownResult, "phase-start": StartResult, "phase-ready": ReadyResult,
    "phase-stop": StopResult, "phase-logs": LogsResult, "smoke": SmokeResult, "drain": DrainResult,
    "gates": GatesResult, "lint": LintResult, "deploy": DeployResult, "reset": ResetResult,
}


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
