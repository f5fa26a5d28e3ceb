"""Tasks that reach hosts without touching their GPUs: hosts, ping, run, oneliner."""
from __future__ import annotations

import re
import sys

from invoke import Exit

from scripts.config import defaults
from scripts.config.defaults import num

from .common import HOST_HELP, READ_FANOUT_HELP, codes, dumps, exit_worst, fanout_width, guarded, hosts_of
from .flags import task

ONELINER_GRACE = num(defaults.ONELINER_GRACE_S)


@task(help={"json": "print the configuration as JSON (a list of hosts; phases a list)",
            "names": "print only the aliases, one per line (for shell completion and scripts)"})
@guarded
def hosts(c, json=False, names=False):
    """List host aliases, the route each one takes and its phases (validates hosts.env)."""
    from scripts.config import hosts as all_hosts
    from scripts.views.render import Col, note, table

    known = all_hosts.load().values()
    if names:
        print("\n".join(h.alias for h in known))
        return
    docs = [{"alias": h.alias, "route": h.describe(), "become": "sudo" if h.route.become else None,
             "python": h.python, "devices": h.devices, "phases": sorted(h.phases), "source": h.source} for h in known]
    if json:
        print(dumps(docs))
        return
    # the hosts file (one: hostconfig.hosts_file) is named once under the table, not in every row,
    # or that none was found and where it was looked for
    from scripts.config.hostconfig import source_words

    rows = [[d["alias"], d["route"], d["python"], d["devices"], ", ".join(d["phases"]) or "-",
             "built-in" if d["source"] == "built-in" else "file"] for d in docs]
    # a column wraps at spaces and after a `/`, never inside a word (`nvidia[0-3]`, an address)
    print(table(["alias", *(Col(h, "wrap", _longest_word(r[i] for r in rows)) if h != "python" else h
                            for i, h in enumerate(("route", "python", "devices", "phases", "from"), 1))], rows))
    print(note(source_words(), indent="", hang="  "))


def _longest_word(texts) -> int:
    """The widest a column of these texts can get without a word cut: its longest word, a
    path's parts between slashes each a word (table wraps there)."""
    return max((len(part) for t in texts for part in re.findall(r"[^\s/]*/?", t)), default=0)


@task(exit_codes=("unreachable", "timed-out"), help={"host": HOST_HELP, "json": "print the agent's JSON answer",
            "timeout": "seconds before a host counts as timed out (exit 7; default 60;"
                       " 0: no limit of its own, the longest wait: 3600)", "fanout": READ_FANOUT_HELP})
@guarded
def ping(c, host=defaults.HOST, json=False, timeout="", fanout=str(defaults.READ_FANOUT)):
    """Reach each host in one round trip: its python, pid, GPU tools and user.

    Says the python version, the agent's pid, whether NVML, nvidia-smi and fuser are there,
    and whether the agent runs as root (`as root via sudo` with ALIAS_BECOME=sudo). The
    first line is a sentence of its own: `invoke --list` shows only that line."""
    from scripts.agent.wire.requests import Ping
    from scripts.config import cliargs
    from scripts.ops import fleet
    from scripts.reach.transport import call_agent
    from scripts.views import ping as ping_view, status as status_view
    from scripts.views.render import fit

    deadline = cliargs.seconds("timeout", timeout) if timeout else None
    if deadline == 0:  # 0 is no limit, as `run -T 0` (the agent's longest wait bounds it)
        deadline = cliargs.MAX_SECONDS
    width = fanout_width(fanout)
    outcomes = fleet.each_host(hosts_of(host), lambda h: call_agent(h, Ping(), deadline_s=deadline), width)
    from .jsonout import failed

    docs = []
    for out in outcomes:
        if out.error is not None:  # in the list too, with its error and exit code
            docs.append(dict(failed(out.error), host=out.host.alias))
            continue
        r = out.value
        become = out.host.route.become
        docs.append(dict(r.doc, host=r.host, wall_s=round(r.wall_s, 3), runs_as=ping_view.runs_as(r.result, become)))
        if not json:
            print(fit(status_view.ping_line(r.host, r.result, r.wall_s) + ping_view.ping_suffix(r.result, become)))
    if json:
        print(dumps(docs))
    exit_worst(codes(outcomes))


@task(remainder=True, exit_codes=("unreachable", "timed-out", (
    "own", "the command's own exit code (255 too; 127 missing, 126 not executable, 128+N killed by signal N)")),
      help={
    "host": HOST_HELP, "timeout": "seconds before a host counts as timed out (exit 7; default 600; 0: no limit)"})
@guarded
def run(c, host=defaults.HOST, timeout="600"):
    """Run `-- CMD ARGS...` on the host exactly (no re-quoting needed); returns its exit code.

    With one host, stdout and stderr pass through byte for byte. With several, each host's
    stdout is printed under a header (`===== gpu1 =====`) once it finishes, and each line of
    its stderr is led by `gpu1: `; a host that could not be reached or timed out has a
    section of its own (`===== gpu3: unreachable (exit 3) =====`) and its error on stderr.
    The fleet's exit code is the highest of its hosts' codes: the command's own (255 too: told
    from ssh's failure; a missing command 127, one not executable 126, one killed by signal N
    128+N, as a shell says), or below: ssh's own failure is unreachable, no answer within
    --timeout (or ssh's connect / keep-alive timeout) timed out.
    """
    from scripts.config import cliargs
    from scripts.config.errors import ConfigError
    from scripts.ops import fleet
    from scripts.reach import remote_cmd

    from .common import code_for

    argv = cliargs.remainder()
    if not argv:
        raise ConfigError("run needs a command after `--`, e.g. invoke run --host gpu1 -- nvidia-smi -L")
    deadline = cliargs.seconds("timeout", timeout)
    targets = hosts_of(host)
    if len(targets) == 1:
        code = remote_cmd.run_on(targets[0], argv, capture=False, deadline_s=deadline).code
        if code:
            raise Exit(code=code)
        return

    results = []
    for out in fleet.each_host(targets, lambda h: remote_cmd.run_on(h, argv, capture=True, deadline_s=deadline)):
        alias = out.host.alias
        if out.error is None:
            print(f"===== {alias} =====", flush=True)
            sys.stdout.buffer.write(out.value.stdout)
            sys.stdout.flush()
            sys.stderr.buffer.write(host_lines(alias, out.value.stderr))
            sys.stderr.flush()
            results.append(out.value.code)
        else:
            from scripts.views.status import failed

            code = code_for(out.error) or 1
            print(f"===== {alias}: {failed(out.failure)} (exit {code}) =====", flush=True)  # a section of its own
            print(f"gpu-pivot: {out.error}", file=sys.stderr, flush=True)
            results.append(code)
    exit_worst(results)


def host_lines(alias: str, data: bytes) -> bytes:
    """A fleet host's stderr, each line led by `alias: ` (its bytes otherwise as they came): its
    stdout has a section of its own, and stderr, read apart from it (`2>err.log`, a terminal
    beside a piped stdout), must still say which host wrote each line. A last line without
    its newline gets one, so the next host's output starts on a line of its own."""
    lines = data.split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    return b"".join(alias.encode() + b": " + line + b"\n" for line in lines)


@task(remainder=True, help={
    "host": HOST_HELP, "action": "'teardown': print the POSIX-shell emergency teardown instead of `-- CMD`",
            "grace": f"for --action teardown: seconds between TERM and KILL (default {ONELINER_GRACE})"})
@guarded
def oneliner(c, host=defaults.HOST, action="", grace=ONELINER_GRACE):
    """Print the line to paste into a terminal that runs `-- CMD ARGS...` (or an action) on the host.

    `--action teardown` prints a POSIX-shell teardown for hosts without python3, carrying the
    host's DEVICES, TARGETS, PROTECT and scope: holders of the device files and programs TARGETS
    names, protected ones skipped, TERM, poll, KILL, report.
    """
    from scripts.config import cliargs
    from scripts.config.errors import ConfigError, show
    from scripts.reach.route import one_liner

    argv = cliargs.remainder()
    if action:
        from scripts.emergency import shell_teardown

        if action != "teardown":
            raise ConfigError(f"--action {show(action)}: the only action is 'teardown'")
        if argv:
            raise ConfigError("give either --action or `-- CMD`, not both")
        grace_s = cliargs.seconds("grace", grace)
        # every host's line first: a pattern the shell cannot match refuses before any line is printed
        lines = [one_liner(h.route, shell_teardown.argv(h, grace_s)) for h in hosts_of(host)]
        print("\n".join(lines))
        return
    if not argv:
        raise ConfigError("oneliner needs a command after `--` (or --action teardown)")
    for h in hosts_of(host):
        print(one_liner(h.route, argv))
