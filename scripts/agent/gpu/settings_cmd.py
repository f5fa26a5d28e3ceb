"""Set every GPU's settings (`gpu-settings --settings JSON`): what a pivot runs after its
teardown (the host's baseline) and before it starts the next phase (the phase's own).

Why here and checked again: the agent is also run by itself, and a setting it does not know
must stop it before any GPU is written. Each change is an audit record (before, after) on
the host, and travels back in the result for the operator's log. Needs NVML: there is no
other source that sets.
"""
import json
import socket
import time

from ..options.record import Options
from ..state.auditlog import Audit
from ..wire import codes, defaults, records
from . import gpuinfo, settings_write

WORDS = {"persistence": ("on", "off"), "compute_mode": tuple(settings_write.MODE_OF), "mig": ("on", "off")}
NUMBERS = ("graphics_clock_mhz", "memory_clock_mhz", "power_limit_w")


def add_arguments(parser):
    parser.add_argument("--settings", required=True, help="the settings, a JSON object: {\"power_limit_w\": 700, ...}")
    parser.add_argument("--operator", default="gpu-pivot", help="who asked, for the audit log")


def wanted(text):
    """The settings asked for, checked: UsageError names the bad field or value."""
    try:
        want = json.loads(text)
    except ValueError:
        want = None
    if not isinstance(want, dict) or not want:
        raise codes.UsageError("--settings %r: not a JSON object of GPU settings" % (text,))
    for name, value in want.items():
        if name in WORDS and value not in WORDS[name]:
            raise codes.UsageError("--settings: %s must be %s, not %r" % (name, " or ".join(WORDS[name]), value))
        if name in NUMBERS and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
            raise codes.UsageError("--settings: %s must be a positive number, not %r" % (name, value))
        if name not in WORDS and name not in NUMBERS:
            raise codes.UsageError("--settings: unknown setting %r" % (name,))
    return want


def run(opts: Options):
    want = wanted(opts.settings)
    source, tried = gpuinfo.open_source(opts.fake_gpus, opts.devices)
    try:
        if getattr(source, "settings_nv", None) is None:
            out = {"rows": [], "note": "not set: GPU settings are set through NVML, and this host has none (%s)"
                   % "; ".join(tried or [getattr(source, "name", "none")])}
            return codes.EXIT_FAILED, records.written(records.SettingsResult, out, code=codes.EXIT_FAILED,
                                                      hostname=socket.gethostname())
        rows = settings_write.apply(source, want)
    finally:
        source.close()
    audit = Audit(opts.operator or "gpu-pivot")
    for row in rows:
        if row["result"] != "already":
            audit.record(dict(row, time=time.strftime(defaults.TIME_FORMAT), host=audit.host,
                              operator=audit.operator, event="gpu-setting"))
    failed = [r for r in rows if r["result"] == "FAILED"]
    code = codes.EXIT_FAILED if failed else codes.EXIT_OK
    return code, records.written(records.SettingsResult, {"audit_errors": audit.write_errors}, code=code,
                                 rows=rows, hostname=audit.host)
