"""The `audit` task: the operator's local audit log of every signal, unit stop and pivot."""
from __future__ import annotations

import sys

from scripts.config import defaults

from .common import guarded
from .flags import task


@task(exit_codes=(("unreachable", "the audit log's directory is unsafe or unusable"),),
      help={"lines": f"how many of the newest records (default {defaults.AUDIT_LINES})",
            "json": "print the records as one JSON list (oldest first; [] when there are none)"})
@guarded
def audit(c, lines=str(defaults.AUDIT_LINES), json=False):
    """Show the local audit log: every signal, unit stop and pivot, with host, operator and result."""
    from scripts.config import cliargs
    from scripts.ops import audit_log
    from scripts.views.render import Col, Command, note, safe, table, width

    n = cliargs.whole("lines", lines)
    recs, skipped = audit_log.read_counted()
    if skipped:  # torn, not JSON, or not a record ([1,2], "argv": 5): skipped, never silently
        print(f"gpu-pivot: audit: {skipped} line(s) of {safe(audit_log.audit_path())} could not be read (torn, or not "
              "records); skipped", file=sys.stderr)
    recs = recs[-n:] if n else []  # [-0:] would be every record
    if json:
        from scripts.agent.procs import textsafe

        print(textsafe.dumps(recs, sort_keys=True))  # one document; valid Unicode: a non-UTF-8 byte is U+EF80+
        return
    print(note(f"audit log: {audit_log.audit_path()}", "", "  "))  # a long path on a line of its own, whole
    short = width() < 70  # a narrow pane: the time without its year (14 columns, not 19)
    rows = [[_when(r.get("time", ""), short), r.get("alias", ""), r.get("pid", r.get("to", "")), r.get("operator", ""),
             r.get("signal") or _setting(r) or r.get("event"), r.get("result") or r.get("verdict"),
             Command.of(r) if r.get("cmdline") else "-"] for r in recs]
    # time, host and pid identify a record and come first, never cut (a host cut to `san...`
    # named none); the others give way, and on a narrow screen go under the row, command first;
    # an action wraps (`systemctl stop` cut to `syste...` named no action)
    heads = ["time (UTC)", "host", "pid/to", Col("operator", "cut", 8), Col("action", "wrap", 7),
             Col("result", "wrap", 10), Col("command", "command", 20)]
    print(table(heads, rows))


def _setting(r) -> str | None:
    """A GPU setting's change as its action: 'GPU 0 power_limit_w 450 -> 700' (event gpu-setting)."""
    if r.get("event") != "gpu-setting":
        return None
    return f"GPU {r.get('gpu')} {r.get('field')} {r.get('before')} -> {r.get('after')}"


def _when(stamp, short: bool = False) -> str:
    """A record's time in UTC, in 19 columns ('2026-11-30 10:48:44'; `short`: 14, '11-30
    10:48:44'): records carry each host's own offset (defaults.TIME_FORMAT). Text that is
    not such a time is shown as it is."""
    import datetime

    from scripts.agent.wire import defaults as shared

    try:
        when = datetime.datetime.strptime(str(stamp), shared.TIME_FORMAT)
    except ValueError:
        return str(stamp)
    return when.astimezone(datetime.UTC).strftime("%m-%d %H:%M:%S" if short else "%Y-%m-%d %H:%M:%S")
