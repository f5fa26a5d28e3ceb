"""The `audit` task: the operator's local audit log of every signal, unit stop and pivot."""
from __future__ import annotations

from scripts import defaults

from .common import guarded
from .flags import task


@task(help={"lines": f"how many of the newest records (default {defaults.AUDIT_LINES})", "json": "print JSON lines"})
@guarded
def audit(c, lines=str(defaults.AUDIT_LINES), json=False):
    """Show the local audit log: every signal, unit stop and pivot, with host, operator and result."""
    from scripts import audit_log, cliargs
    from scripts.render import Col, Command, table

    n = cliargs.whole("lines", lines)
    recs = audit_log.read()[-n:] if n else []  # [-0:] would be every record
    if json:
        import json as json_

        for r in recs:
            print(json_.dumps(r, sort_keys=True))
        return
    print(f"audit log: {audit_log.audit_path()}")
    rows = [[r.get("time", ""), r.get("alias", ""), r.get("operator", ""), r.get("signal") or r.get("event"),
             r.get("pid", r.get("to", "")), r.get("result") or r.get("verdict"),
             Command.of(r) if r.get("cmdline") else "-"] for r in recs]
    heads = ["time", "host", "operator", "action", "pid/phase", Col("result", "wrap"), Col("command", "command", 24)]
    print(table(heads, rows))
