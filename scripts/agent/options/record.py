"""The agent's options: one typed record of every flag, made once from argparse's answer
(Options.of, in cli.parse). Only the entry points take it (the command line, each
subcommand's run(opts), annotated so mypy checks each field read); what they call gets the
few values it reads, or a small record (Selection, GpuSource, settle.Window).

Why one record and not argparse's Namespace: a subcommand's code hands its options down to
the scan, the plan, the settle window and the GPU reader, which read the same fields whichever
subcommand runs them. A Namespace takes any attribute, so a typo reads as "absent" and a
module could park its own state on it; this record has a slot per flag and nothing else, a
flag the subcommand's parser lacks reads None (False for a switch), and mypy knows each
field's type. Tests make one the same way (Options(**fields) or cli.parse(argv)).

The whole account: docs/design-notes.md (scripts/agent/options/record.py)."""
from __future__ import annotations

import re
import sys

from ..policy import program, selection
from ..policy.selection import Selection
from ..procs import devices
from ..wire import defaults, frame
from ..wire.call import COMMON_FLAGS, SELECTION_FLAGS, SUBCOMMANDS
from ..wire.codes import UsageError


# Every flag of every subcommand, read off the wire's table (each request's flags). Not given: a
# switch is False, the device glob, the threshold and the settle window are the parser's
# defaults, any other is None.
def _dests(flags):
    return tuple(f[2:].replace("-", "_") for f in flags)


COMMON = ("command",) + _dests(COMMON_FLAGS)
SELECTION = _dests(SELECTION_FLAGS)
OWN = tuple(sorted(set(_dests(f for flags in SUBCOMMANDS.values() for f in flags)) - set(SELECTION)))
SWITCHES = frozenset(("json", "progress", "fake_devices", "only_matching", "stop_starters", "all_users",
                      "disable", "follow", "yes", "keep_shm", "quiesce", "probe", "intruders"))
FIELDS = COMMON + SELECTION + OWN


class Options:
    """The flags of one agent run. `settle`: the teardown's settle window in seconds, the default
    (SETTLE_S) where --settle was not given, and then `settle_auto` (the window may be cut short
    when nothing that could restart a target survives: settle.py)."""

    __slots__ = FIELDS + ("settle_auto", "_gpus")

    # common
    command: str | None
    marker: str | None
    json: bool
    progress: bool
    devices: str
    fake_devices: bool
    run_dir: str | None
    # selection (SELECTING subcommands; None elsewhere)
    protect: list[str] | None
    target: list[str] | None
    match: list[str] | None
    fake_gpus: str | None
    scope: str | None
    scope_uid: int | None
    # the free threshold, the phase spec
    max_used_mib: int
    spec: str | None
    # plan and teardown
    only_matching: bool
    stop_starters: bool
    all_users: bool
    disable: bool
    checkpoint_stop: list[str] | None  # running phases' checkpoint stops (teardown/checkpoint.py)
    grace: float
    timeout: float
    wait_lock: float
    operator: str | None
    approved: str | None
    mps: str | None
    settle: float
    settle_auto: bool
    keep_shm: bool  # keep the shared memory the targets left (teardown/shm.py)
    hold_s: float | None  # once FREED, the lock stays a pivot's this long at most (teardown/hold.py)
    hold_phase: str | None
    hold_token: str | None
    # one subcommand's own
    wait: float
    argv: str | None
    gpus: str | None
    url: str | None
    action: str | None
    lines: int | None
    follow: bool
    gpu: str | None
    yes: bool
    quiesce: bool  # reset: stop the daemons that block it, put them back after (teardown/quiesce.py)
    settings: str | None  # gpu-settings: the settings to set, a JSON object (gpu/settings_cmd.py)
    probe: bool  # verify: the CUDA probe on each GPU (gpu/probe.py)
    probe_mib: int | None
    token: str | None  # release: the hold's token
    intruders: bool  # phase-ready: name a process outside the phase that opens a GPU

    def __init__(self, **values):
        for name in FIELDS:
            setattr(self, name, values.pop(name, False if name in SWITCHES else None))
        if values:
            raise TypeError("Options has no field %s" % ", ".join(sorted(values)))
        if self.devices is None:
            self.devices = defaults.DEVICE_GLOB
        if self.max_used_mib is None:
            self.max_used_mib = defaults.MAX_USED_MIB
        self.settle_auto = self.settle is None
        if self.settle is None:
            self.settle = defaults.SETTLE_S
        self._gpus = None

    @classmethod
    def of(cls, namespace):
        """The options argparse parsed (its Namespace), as this record."""
        return cls(**vars(namespace))

    @property
    def gpu_source(self):
        """Where this run reads its GPUs (devices.GpuSource), made once: its DeviceSet is found once."""
        if self._gpus is None:
            self._gpus = devices.GpuSource(self.devices, self.fake_devices, self.fake_gpus)
        return self._gpus

    @property
    def selection(self):
        """What this run selects (policy/selection.py): what the scan, the plan and the settle
        window read, handed down in place of this record."""
        return Selection(self.gpu_source, **{name: getattr(self, name) for name in selection.FLAGS})

    def device_set(self):
        """The host's GPU devices (devices.DeviceSet), found once per agent run. Raises
        devices.DeviceError for a glob that names anything but GPU devices."""
        return self.gpu_source.device_set()

    def emit_progress(self, **fields):
        """One progress line when the caller asked for them; never fails on a closed pipe."""
        if not self.progress:
            return
        try:
            sys.stdout.write(frame.progress_line(fields))
            sys.stdout.flush()
        except (BrokenPipeError, OSError):
            self.progress = False  # the connection dropped: keep working, stop talking

    def __repr__(self):
        return "Options(%s)" % ", ".join("%s=%r" % (n, getattr(self, n)) for n in FIELDS)


def check_values(opts):
    """Raise UsageError for a value no subcommand should act on: the agent is also run by itself
    (an epilog, a pasted command), where nothing on the local side checked it first. A wait that
    is not a number of seconds up to MAX_WAIT_S (nan compares false everywhere, so a loop on it
    never ends), a negative threshold or uid, a run dir or device glob that is not absolute."""
    for flag in ("wait", "grace", "timeout", "settle", "wait_lock"):  # verify's, a teardown's, a drain's
        value = getattr(opts, flag)
        if value is not None and not 0 <= value <= defaults.MAX_WAIT_S:  # also refuses nan
            raise UsageError("--%s %r: seconds from 0 to %d" % (flag.replace("_", "-"), value, defaults.MAX_WAIT_S))
    for flag, value in (("max-used-mib", opts.max_used_mib), ("scope-uid", opts.scope_uid)):
        if value is not None and value < 0:
            raise UsageError("--%s %r: must be 0 or more" % (flag, value))
    if opts.probe_mib is not None and not 1 <= opts.probe_mib <= defaults.MAX_PROBE_MIB:
        raise UsageError("--probe-mib %r: MiB from 1 to %d" % (opts.probe_mib, defaults.MAX_PROBE_MIB))
    for flag, value in (("run-dir", opts.run_dir), ("devices", opts.devices)):
        if value is not None and not value.startswith("/"):
            raise UsageError("--%s %r: must be an absolute path" % (flag, value))


def check_patterns(opts):
    """Raise UsageError for a selection pattern that is not a regex or matches everything, or
    for a scope that narrows nothing (empty or blanks: a variable that expanded to nothing)."""
    if opts.scope is not None and not opts.scope.strip():
        raise UsageError("--scope %r: an empty scope narrows nothing, so it would reach every process; "
                         "give the text the targets' command lines contain" % opts.scope)
    for flag in ("target", "match", "protect"):
        for pattern in getattr(opts, flag) or []:
            try:
                empty = program.matches_empty(pattern)
            except (re.error, OverflowError, RecursionError) as exc:
                raise UsageError("--%s %r: not a valid regular expression (%s)" % (flag, pattern, exc)) from None
            if empty:
                raise UsageError("--%s %r: matches the empty string, so it would match every process; "
                                 "name a program (e.g. 'sglang\\.launch_server')" % (flag, pattern))
