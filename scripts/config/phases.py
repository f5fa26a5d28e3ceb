"""Phases of work a host pivots between (a server, a training job), read from hosts.env.

Why in hosts.env: one file says where a host is and what runs on it, validated together
before anything runs. Keys: ALIAS_PHASE_<NAME>_<FIELD>, e.g. GPU1_PHASE_TRAIN_ARGV.
A command is either ARGV (a JSON array: passed through every hop exactly) or CMD (one
shell string, run by `sh -c` on the host). See hosts.env.example for every field.
"""
from __future__ import annotations

import json
import re
import shlex
from dataclasses import asdict, dataclass

from ..agent.procs import procfs
from ..agent.wire import defaults
from . import gpu_settings
from .errors import ConfigError

PHASE_FIELDS = ("READY_TIMEOUT", "READY", "ARGV", "CMD", "DIR", "ENV", "GPUS", "LOG", "GATES", "PREP",
                "DRAIN_METRICS", "DRAIN_TIMEOUT", "PATCH", "COPY", "SMOKE_URL", "SMOKE_BODY", "LINT", "STOP_TIMEOUT",
                "STOP_SIGNAL", "STOP_SIGNAL_TO", "STOP_CHECKPOINT", "STOP_IDLE", "STOP_DEADLINE", "GPU_SETTINGS")
_PHASE_KEY = re.compile(r"^(?P<alias>[A-Z][A-Z0-9_]*?)_PHASE_(?P<phase>[A-Z][A-Z0-9]*)_(?P<field>%s)$"
                        % "|".join(PHASE_FIELDS))
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
CHECKPOINT_DEADLINE_S = 600.0  # a checkpoint stop's wait when STOP_DEADLINE is not given
_URL = re.compile(r"^https?://[^\s'\"`$;|&<>]+$")


@dataclass(frozen=True)
class Phase:
    """One phase: what to run, where, and how to know it is ready."""

    name: str
    argv: tuple = ()
    shell: bool = False          # argv is ("sh", "-c", CMD) built from a shell string
    dir: str | None = None
    env: tuple = ()              # (("KEY", "VALUE"), ...)
    gpus: str | None = None      # CUDA_VISIBLE_DEVICES, e.g. "0,1"
    log: str | None = None
    ready: str = "holding"       # an http(s) URL, "holding" (alive and holding a GPU) or "alive"
    ready_timeout: float = 1800.0
    gates: tuple = ()            # shell strings, or (("glob", ...), ("min", N)) pairs: a file count
    prep: tuple = ()             # shell strings: CPU-only jobs started alongside (datagen)
    drain_metrics: str | None = None
    drain_timeout: float = 300.0
    patch: str | None = None
    copy: tuple = ()             # ((src, dst), ...)
    smoke_url: str | None = None
    smoke_body: str | None = None
    lint: bool = True
    stop_timeout: float = defaults.STOP_TIMEOUT_S
    stop_signal: str | None = None      # a checkpoint stop: this signal first (agent teardown/checkpoint.py),
    stop_signal_to: str = "top"         # to what the launch command started ("top"), or every process ("all"),
    stop_checkpoint: str | None = None  # then a wait for a new closed file matching this glob,
    stop_idle: str | None = None        # or for this shell condition to exit 0,
    stop_deadline: float = CHECKPOINT_DEADLINE_S  # at most this long; then TERM -> KILL
    gpu_settings: tuple = ()     # (("power_limit_w", 500), ...): set before it starts (config/gpu_settings.py)

    @property
    def is_server(self) -> bool:
        return self.ready.startswith("http")

    @property
    def is_deploy(self) -> bool:
        return bool(self.patch or self.copy)

    def checkpoint_stop(self) -> dict | None:
        """The stop a teardown of this host runs first while this phase runs (None: none declared)."""
        if not self.stop_signal:
            return None
        return {"phase": self.name, "signal": self.stop_signal, "to": self.stop_signal_to,
                "checkpoint": self.stop_checkpoint, "idle": self.stop_idle, "deadline_s": self.stop_deadline}

    def spec(self) -> dict:
        """What the agent needs to start, check and stop it (JSON-able)."""
        out = asdict(self)
        out["env"] = dict(self.env)
        out["gates"] = [g if isinstance(g, str) else dict(g) for g in self.gates]
        out["copy"] = [list(p) for p in self.copy]
        return out


def split_phase_key(key: str):
    """'GPU1_PHASE_TRAIN_ARGV' -> ('gpu1', 'train', 'ARGV'), or None."""
    m = _PHASE_KEY.match(key)
    return (m.group("alias").lower(), m.group("phase").lower(), m.group("field")) if m else None


def _fail(alias, phase, fld, value, why):
    raise ConfigError(f"{alias.upper()}_PHASE_{phase.upper()}_{fld}={value!r}: {why}")


def _json_list(alias, phase, fld, value):
    try:
        out = json.loads(value)
    except ValueError as exc:
        _fail(alias, phase, fld, value, f"not valid JSON ({exc})")
    if not isinstance(out, list):
        _fail(alias, phase, fld, value, "must be a JSON array")
    return out


def _seconds(alias, phase, fld, value):
    try:
        out = float(value)
    except ValueError:
        out = -1
    if not out > 0 or out == float("inf"):
        _fail(alias, phase, fld, value, "must be a positive number of seconds")
    return out


def _abs(alias, phase, fld, value):
    if not value.startswith("/") or "\n" in value or "\0" in value:
        _fail(alias, phase, fld, value, "must be an absolute path")
    return value


def _argv(alias, name, keys) -> dict:
    if ("ARGV" in keys) == ("CMD" in keys):
        _fail(alias, name, "ARGV" if "ARGV" in keys else "CMD", keys.get("ARGV", keys.get("CMD", "")),
              "a phase needs exactly one of ARGV (JSON array) or CMD (shell string)")
    if "ARGV" in keys:
        argv = _json_list(alias, name, "ARGV", keys["ARGV"])
        if not argv or not all(isinstance(a, str) and "\0" not in a for a in argv):
            _fail(alias, name, "ARGV", keys["ARGV"], "must be a non-empty JSON array of strings")
        return {"argv": tuple(argv)}
    if not keys["CMD"].strip():
        _fail(alias, name, "CMD", keys["CMD"], "empty command")
    return {"argv": ("sh", "-c", keys["CMD"]), "shell": True}


def _env(alias, name, value):
    try:
        pairs = [item.split("=", 1) for item in shlex.split(value)]
    except ValueError as exc:
        _fail(alias, name, "ENV", value, str(exc))
    for pair in pairs:
        if len(pair) != 2 or not _ENV_NAME.match(pair[0]):
            _fail(alias, name, "ENV", value, f"{'='.join(pair)!r} is not NAME=VALUE")
    return tuple((k, v) for k, v in pairs)


def _gpus(alias, name, value):
    if not re.match(r"^\d+(,\d+)*$", value):
        _fail(alias, name, "GPUS", value, "must be GPU indexes like 0,1,2")
    return value


def _url(fld):
    def check(alias, name, value):
        if not (_URL.match(value) or (fld == "READY" and value in ("holding", "alive"))):
            _fail(alias, name, fld, value,
                  "must be an http(s) URL" + (" or 'holding' or 'alive'" if fld == "READY" else ""))
        return value
    return check


def _gates(alias, name, value):
    gates = _json_list(alias, name, "GATES", value)
    for g in gates:
        if not (isinstance(g, str) or (isinstance(g, dict) and isinstance(g.get("glob"), str)
                                       and isinstance(g.get("min"), int) and g["min"] >= 0)):
            _fail(alias, name, "GATES", value, f"{g!r} is neither a command nor {{\"glob\": ..., \"min\": N}}")
    # A gate's kind is its JSON type, never its first character: a string is a shell command
    # (`{ test -f a; }` is a shell group), an object a file count. Objects are kept as sorted
    # (key, value) pairs so a Phase stays hashable; spec() gives dicts back.
    return tuple(g if isinstance(g, str) else tuple(sorted(g.items())) for g in gates)


def _prep(alias, name, value):
    prep = _json_list(alias, name, "PREP", value)
    if not all(isinstance(p, str) and p.strip() for p in prep):
        _fail(alias, name, "PREP", value, "must be a JSON array of shell commands")
    return tuple(prep)


def _copy(alias, name, value):
    pairs = _json_list(alias, name, "COPY", value)
    if not all(isinstance(p, list) and len(p) == 2 and all(isinstance(x, str) and x.startswith("/") for x in p)
               for p in pairs):
        _fail(alias, name, "COPY", value, "must be a JSON array of [absolute src, absolute dst] pairs")
    return tuple(tuple(p) for p in pairs)


def _lint(alias, name, value):
    if value not in ("on", "off"):
        _fail(alias, name, "LINT", value, "must be on or off")
    return value == "on"


def _signal(alias, name, value):
    if procfs.signal_number(value) is None:
        _fail(alias, name, "STOP_SIGNAL", value, "not a signal name (e.g. USR1, SIGUSR2, INT)")
    return value


def _checkpoint_stop(alias, name, keys, kw):
    """A stop's fields go together: CHECKPOINT, IDLE, DEADLINE need SIGNAL, which needs one of
    CHECKPOINT or IDLE to wait for; the deadline fits the longest wait (MAX_WAIT_S)."""
    for fld in ("STOP_SIGNAL_TO", "STOP_CHECKPOINT", "STOP_IDLE", "STOP_DEADLINE"):
        if fld in keys and "STOP_SIGNAL" not in keys:
            _fail(alias, name, fld, keys[fld], "needs STOP_SIGNAL (the signal that asks the job to checkpoint)")
    if "STOP_SIGNAL" in keys and not (kw.get("stop_checkpoint") or kw.get("stop_idle")):
        _fail(alias, name, "STOP_SIGNAL", keys["STOP_SIGNAL"],
              "needs STOP_CHECKPOINT (a glob) or STOP_IDLE (a shell condition) to wait for")
    if kw.get("stop_deadline", 0) > defaults.MAX_WAIT_S:
        _fail(alias, name, "STOP_DEADLINE", keys["STOP_DEADLINE"], f"at most {defaults.MAX_WAIT_S} seconds")


def _signal_to(alias, name, value):
    """top: only what the launch command started (a DataLoader worker or any child without a
    handler would die of the signal); all: every process of the phase (ranks that each save)."""
    if value not in ("top", "all"):
        _fail(alias, name, "STOP_SIGNAL_TO", value, "must be top (what the launch command started) or all")
    return value


def _idle(alias, name, value):
    if not value.strip() or "\0" in value:
        _fail(alias, name, "STOP_IDLE", value, "must be a shell condition (exit 0: idle)")
    return value
def _gpu_settings(alias, name, value):
    return tuple(sorted(gpu_settings.parse(f"{alias.upper()}_PHASE_{name.upper()}_GPU_SETTINGS", value).items()))


def _abs_of(fld):
    return lambda alias, name, value: _abs(alias, name, fld, value)


def _seconds_of(fld):
    return lambda alias, name, value: _seconds(alias, name, fld, value)


# Each optional field: its checker, (alias, phase, text) -> the Phase attribute (named fld.lower())
_FIELDS = {
    "DIR": _abs_of("DIR"), "LOG": _abs_of("LOG"), "PATCH": _abs_of("PATCH"), "ENV": _env, "GPUS": _gpus,
    "READY": _url("READY"), "DRAIN_METRICS": _url("DRAIN_METRICS"), "SMOKE_URL": _url("SMOKE_URL"),
    "READY_TIMEOUT": _seconds_of("READY_TIMEOUT"), "DRAIN_TIMEOUT": _seconds_of("DRAIN_TIMEOUT"),
    "STOP_TIMEOUT": _seconds_of("STOP_TIMEOUT"), "GATES": _gates, "PREP": _prep, "COPY": _copy,
    "SMOKE_BODY": lambda alias, name, value: value, "LINT": _lint, "STOP_SIGNAL": _signal, "STOP_SIGNAL_TO": _signal_to,
    "STOP_CHECKPOINT": _abs_of("STOP_CHECKPOINT"), "STOP_IDLE": _idle, "STOP_DEADLINE": _seconds_of("STOP_DEADLINE"),
    "GPU_SETTINGS": _gpu_settings,
}


def build_phase(alias: str, name: str, keys: dict) -> Phase:
    """Validate one phase's fields (FIELD -> text) and build it: one checker per field (_FIELDS)."""
    kw: dict = {"name": name, **_argv(alias, name, keys)}
    for fld, check in _FIELDS.items():
        if fld in keys:
            kw[fld.lower()] = check(alias, name, keys[fld])
    _checkpoint_stop(alias, name, keys, kw)
    if "PATCH" in kw and not kw.get("dir"):
        _fail(alias, name, "PATCH", keys["PATCH"], "a patch needs the phase's DIR (patch -p1 runs there)")
    return Phase(**kw)
