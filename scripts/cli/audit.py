"""The `audit` task: the operator's local audit log of every signal, unit stop and pivot."""
from __future__ import annotations

import sys

from scripts import defaults

from .common import guarded
from .flags import task


@task(help={"lines": f"how many of the newest records (default {defaults.AUDIT_LINES})", "json": "print JSON lines"})
@guarded
def audit(c, lines=str(defaults.AUDIT_LINES), json=False):
    """Show the local audit log: every signal, unit stop and pivot, with host, operator and result."""
    from scripts import audit_log, cliargs
    from scripts.render import Col, Command, safe, table

    n = cliargs.whole("lines", lines)
    recs, skipped = audit_log.read_counted()
    if skipped:  # torn, not JSON, or not a record ([1,2], "argv": 5): skipped, never silently
        print(f"gpu-pivot: audit: {skipped} line(s) of {safe(audit_log.audit_path())} could not be read (torn, or not "
              "records); skipped", file=sys.stderr)
    recs = recs[-n:] if n else []  # [-0:] would be every record
    if json:
        from scripts.agent.contract import textsafe

        for r in recs:
            print(textsafe.dumps(r, sort_keys=True))  # valid Unicode: a non-UTF-8 byte is U+EF80+
        return
    print(f"audit log: {safe(audit_log.audit_path())}")
    rows = [[_when(r.get("time", "")), r.get("alias", ""), r.get("operator", ""), r.get("signal") or r.get("event"),
             r.get("pid", r.get("to", "")), r.get("result") or r.get("verdict"),
             Command.of(r) if r.get("cmdline") else "-"] for r in recs]
    # every column but the time may give way, down to what fits 80 columns
    heads = ["time (UTC)", Col("host", "cut", 6), Col("operator", "cut", 8), Col("action", "cut", 7),
             Col("pid/to", "cut", 6), Col("result", "wrap", 10), Col("command", "command", 12)]
    print(table(heads, rows))


def _when(stamp) -> str:
    """A record's time in UTC, in 19 columns ('2026-11-30 10:48:44'): records carry each
    host's own offset (contract.TIME_FORMAT). Text that is not such a time is shown as it is."""
    import datetime

    from scripts.agent import contract

    try:
        when = datetime.datetime.strptime(str(stamp), contract.TIME_FORMAT)
    except ValueError:
        return str(stamp)
    return when.astimezone(datetime.UTC).strftime("%Y-%m-%d %H:%M:%S")
