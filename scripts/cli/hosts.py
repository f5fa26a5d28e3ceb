"""Tasks that reach hosts without touching their GPUs: hosts, ping, run, oneliner."""
from __future__ import annotations

import sys

from invoke import Exit, task

from scripts import defaults
from scripts.defaults import num

from .common import HOST_HELP, codes, dumps, exit_worst, guarded, hosts_of

ONELINER_GRACE = num(defaults.ONELINER_GRACE_S)


@task(help={"json": "print the configuration as JSON"})
@guarded
def hosts(c, json=False):
    """List host aliases, the route each one takes and its phases (validates hosts.env)."""
    from scripts import hosts as all_hosts
    from scripts.render import table

    head = ["alias", "route", "python", "devices", "phases", "source"]
    rows = [[h.alias, h.describe(), h.python, h.devices, ",".join(sorted(h.phases)) or "-", h.source]
            for h in all_hosts.load().values()]
    if json:
        import json as json_

        print(json_.dumps([dict(zip(head, r, strict=True)) for r in rows], indent=1))
    else:
        print(table(head[:-1] + ["from"], rows))


@task(help={"host": HOST_HELP, "json": "print the agent's JSON answer"})
@guarded
def ping(c, host=defaults.HOST, json=False):
    """Reach each host in one round trip: python version, pid, NVML / nvidia-smi / fuser there."""
    from scripts import fleet, status_view
    from scripts.transport import call_agent

    outcomes = fleet.each_host(hosts_of(host), lambda h: call_agent(h, "ping"))
    docs = []
    for out in outcomes:
        if out.error is None:
            r = out.value
            docs.append(dict(r.doc, host=r.host, wall_s=round(r.wall_s, 3)))
            if not json:
                print(status_view.ping_line(r.host, r.result, r.wall_s))
    if json:
        print(dumps(docs))
    exit_worst(codes(outcomes))


@task(help={"host": HOST_HELP})
@guarded
def run(c, host=defaults.HOST):
    """Run `-- CMD ARGS...` on the host exactly (no re-quoting needed); returns its exit code.

    With one host, stdout and stderr pass through byte for byte. With several, each host's
    output is printed under a header once it finishes. ssh's own failure exits 3.
    """
    import subprocess

    from scripts import cliargs, fleet
    from scripts.agent import contract
    from scripts.config_error import ConfigError
    from scripts.route import HostUnreachable

    argv = cliargs.remainder()
    if not argv:
        raise ConfigError("run needs a command after `--`, e.g. invoke run --host gpu1 -- nvidia-smi -L")
    targets = hosts_of(host)
    if len(targets) == 1:
        route = targets[0].route
        code = subprocess.run(route.wrap(argv)).returncode
        if route.ssh_failed(code):
            raise HostUnreachable(f"{targets[0].alias}: host unreachable (ssh exit 255)")
        if code:
            raise Exit(code=code)
        return

    def one(h):
        proc = subprocess.run(h.route.wrap(argv), capture_output=True)
        if h.route.ssh_failed(proc.returncode):
            raise HostUnreachable(f"{h.alias}: host unreachable (ssh exit 255: "
                                  f"{proc.stderr.decode(errors='replace').strip()})")
        return proc

    results = []
    for out in fleet.each_host(targets, one):
        print(f"===== {out.host.alias} =====", flush=True)
        if out.error is None:
            sys.stdout.buffer.write(out.value.stdout)
            sys.stdout.flush()
            sys.stderr.buffer.write(out.value.stderr)
            sys.stderr.flush()
            results.append(out.value.returncode)
        else:
            print(f"gpu-pivot: {out.error}", file=sys.stderr)
            results.append(contract.EXIT_UNREACHABLE)
    exit_worst(results)


@task(help={"host": HOST_HELP, "action": "'teardown': print the POSIX-shell emergency teardown instead of `-- CMD`",
            "grace": f"for --action teardown: seconds between TERM and KILL (default {ONELINER_GRACE})"})
@guarded
def oneliner(c, host=defaults.HOST, action="", grace=ONELINER_GRACE):
    """Print the line to paste into a terminal that runs `-- CMD ARGS...` (or an action) on the host.

    `--action teardown` prints a POSIX-shell teardown for hosts without python3: holders of
    the device files (fuser or /proc), protected names skipped, TERM, poll, KILL, report.
    """
    from scripts import cliargs
    from scripts.config_error import ConfigError

    argv = cliargs.remainder()
    if action:
        from scripts import shell_teardown

        if action != "teardown":
            raise ConfigError(f"--action {action!r}: the only action is 'teardown'")
        if argv:
            raise ConfigError("give either --action or `-- CMD`, not both")
        grace_s = cliargs.seconds("grace", grace)
        for h in hosts_of(host):
            print(h.route.one_liner(shell_teardown.argv(h, grace_s)))
        return
    if not argv:
        raise ConfigError("oneliner needs a command after `--` (or --action teardown)")
    for h in hosts_of(host):
        print(h.route.one_liner(argv))
