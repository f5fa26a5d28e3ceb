"""gpu-pivot tasks: free the GPUs of a host, prove it, start the next phase.

Thin on purpose: each task validates its flags, calls scripts/, and renders. Exit codes:
0 ok / GPUs free; 1 done but not free; 2 bad input (nothing ran); 3 host unreachable or
agent failed there; 4 host locked by another teardown; 5 a pivot gate failed.
Hosts come from hosts.env (see hosts.env.example); `local` and `sandbox` are built in.
"""
from __future__ import annotations

import functools
import getpass
import json as _json
import os
import re
import signal
import socket
import subprocess
import sys

from invoke import Collection, Exit, task

from scripts import audit_log, cliargs, fleet, phase_ops, sandbox as sandbox_mod, status_view, teardown_view
from scripts.agent.statedir import StateDirError
from scripts.pivot import Pivot, PivotOptions
from scripts.hostconfig import ConfigError, load_hosts, select_hosts
from scripts.render import shorten, table
from scripts.route import HostUnreachable
from scripts.transport import AgentError, call_agent

DEFAULT_HOST = os.environ.get("GPU_PIVOT_HOST", "sandbox")
HOST_HELP = "host alias(es): 'gpu1', 'gpu1,gpu2', 'gpu[1-8]' (default: $GPU_PIVOT_HOST or 'sandbox')"
EXIT_UNREACHABLE = 3


def guarded(fn):
    """Turn the errors users cause or meet into one line and the documented exit code."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except ConfigError as exc:
            raise Exit(f"gpu-pivot: {exc}", code=2) from None
        except (HostUnreachable, AgentError) as exc:
            raise Exit(f"gpu-pivot: {exc}", code=EXIT_UNREACHABLE) from None
        except StateDirError as exc:  # a local state directory (audit log, ssh sockets) refused
            raise Exit(f"gpu-pivot: {exc}", code=EXIT_UNREACHABLE) from None

    return wrapper


def _hosts(spec: str) -> list:
    return select_hosts(spec, load_hosts())


def _exit_worst(codes: list) -> None:
    worst = max(codes, default=0)
    if worst:
        raise Exit(code=worst)


def _codes(outcomes: list, agent_code: bool = False) -> list:
    """Each host's exit code: the agent's own (when it decides, e.g. verify) or 0 when it
    answered; 3 for an unreachable host or a failed agent, whose error is printed here."""
    codes = []
    for out in outcomes:
        if out.error is None:
            codes.append(out.value.code if agent_code else 0)
            continue
        print(f"gpu-pivot: {out.error}", file=sys.stderr)
        codes.append(EXIT_UNREACHABLE if isinstance(out.error, (HostUnreachable, AgentError)) else 1)
    return codes


@task(help={"json": "print the configuration as JSON"})
@guarded
def hosts(c, json=False):
    """List host aliases, the route each one takes and its phases (validates hosts.env)."""
    known = load_hosts()
    rows = [[h.alias, h.describe(), h.python, h.devices, ",".join(sorted(h.phases)) or "-", h.source]
            for h in known.values()]
    if json:
        print(_json.dumps([dict(zip(["alias", "route", "python", "devices", "phases", "source"], r)) for r in rows], indent=1))
    else:
        print(table(["alias", "route", "python", "devices", "phases", "from"], rows))


@task(help={"host": HOST_HELP, "json": "print the agent's JSON answer"})
@guarded
def ping(c, host=DEFAULT_HOST, json=False):
    """Reach each host in one round trip: python version, pid, NVML / nvidia-smi / fuser there."""
    targets = _hosts(host)
    outcomes = fleet.each_host(targets, lambda h: call_agent(h, "ping"))
    docs = []
    for out in outcomes:
        if out.error is None:
            r = out.value
            docs.append(dict(r.doc, host=r.host, wall_s=round(r.wall_s, 3)))
            if not json:
                d = r.doc
                print(f"{r.host}: {d['hostname']} python {d['python']} pid {d['pid']} "
                      f"nvml={'yes' if d['nvml'] else 'no'} nvidia-smi={'yes' if d['nvidia_smi'] else 'no'} "
                      f"fuser={'yes' if d['fuser'] else 'no'} devices={len(d['devices'])} ({r.wall_s * 1000:.0f} ms)")
    if json:
        print(_json.dumps(docs, indent=1, sort_keys=True))
    _exit_worst(_codes(outcomes))


@task(help={"host": HOST_HELP})
@guarded
def run(c, host=DEFAULT_HOST):
    """Run `-- CMD ARGS...` on the host exactly (no re-quoting needed); returns its exit code.

    With one host, stdout and stderr pass through byte for byte. With several, each host's
    output is printed under a header once it finishes. ssh's own failure exits 3.
    """
    argv = cliargs.remainder()
    if not argv:
        raise ConfigError("run needs a command after `--`, e.g. invoke run --host gpu1 -- nvidia-smi -L")
    targets = _hosts(host)
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
            raise HostUnreachable(f"{h.alias}: host unreachable (ssh exit 255: {proc.stderr.decode(errors='replace').strip()})")
        return proc

    codes = []
    for out in fleet.each_host(targets, one):
        print(f"===== {out.host.alias} =====", flush=True)
        if out.error is None:
            sys.stdout.buffer.write(out.value.stdout)
            sys.stdout.flush()
            sys.stderr.buffer.write(out.value.stderr)
            sys.stderr.flush()
            codes.append(out.value.returncode)
        else:
            print(f"gpu-pivot: {out.error}", file=sys.stderr)
            codes.append(EXIT_UNREACHABLE)
    _exit_worst(codes)


@task(help={"host": HOST_HELP, "action": "'teardown': print the POSIX-shell emergency teardown instead of `-- CMD`",
            "grace": "for --action teardown: seconds between TERM and KILL (default 30)"})
@guarded
def oneliner(c, host=DEFAULT_HOST, action="", grace="30"):
    """Print the line to paste into a terminal that runs `-- CMD ARGS...` (or an action) on the host.

    `--action teardown` prints a POSIX-shell teardown for hosts without python3: holders of
    the device files (fuser or /proc), protected names skipped, TERM, poll, KILL, report.
    """
    argv = cliargs.remainder()
    if action:
        from scripts import shell_teardown

        if action != "teardown":
            raise ConfigError(f"--action {action!r}: the only action is 'teardown'")
        if argv:
            raise ConfigError("give either --action or `-- CMD`, not both")
        grace_s = cliargs.seconds("grace", grace)
        for h in _hosts(host):
            print(h.route.one_liner(shell_teardown.argv(h, grace_s)))
        return
    if not argv:
        raise ConfigError("oneliner needs a command after `--` (or --action teardown)")
    for h in _hosts(host):
        print(h.route.one_liner(argv))


@task(positional=["action"], help={"action": "up, down or status", "json": "print JSON"})
@guarded
def sandbox(c, action, json=False):
    """The SANDBOX host: fake GPU device files on this machine held by a fake server tree.

    `up` starts `python3 -m sglang.launch_server` (a SANDBOX stand-in) with two workers
    titled sglang::scheduler_TP0/1, a process named nvidia-persistenced, an `nvitop`
    monitor and an unrelated job. `down` stops exactly those (by pid + start time).
    Its directory ($GPU_PIVOT_SANDBOX_DIR, else /run/gpu-pivot/sandbox as root,
    $XDG_RUNTIME_DIR/gpu-pivot/sandbox or $XDG_STATE_HOME/gpu-pivot/sandbox) is created 0700;
    one that is a link, not ours or writable by others is refused, exit 3, nothing run.
    """
    actions = {"up": sandbox_mod.up, "down": sandbox_mod.down, "status": sandbox_mod.status}
    if action in ("--help", "-h"):  # Invoke hands --help to a positional argument as its value
        print("Usage: invoke sandbox up|down|status [--json]\n\nDocstring:\n  " + sandbox.__doc__.strip())
        return
    if action not in actions:
        raise ConfigError(f"sandbox {action!r}: expected one of up, down, status")
    state = actions[action]()
    if json:
        print(_json.dumps(state, indent=1, sort_keys=True))
        return
    print(f"SANDBOX ({state['dir']}; device files {state['devices']})")
    rows = [[role, p["pid"], "alive" if p["alive"] else "gone"] for role, p in sorted(state["processes"].items())]
    if action == "down":
        print("stopped:" if rows else "nothing was running")
    print(table(["role", "pid", "now" if action != "down" else "before"], rows) if rows else "(no sandbox processes)")


def _print_doc(host, doc, *parts):
    print(status_view.header(host.alias, doc, host.sandbox))
    for part in parts:
        text = part(doc)
        if text:
            print(text)


@task(help={"host": HOST_HELP, "json": "print the scan as JSON"})
@guarded
def status(c, host=DEFAULT_HOST, json=False):
    """Show who holds each GPU: per-GPU memory table and holder table (protected ones marked).

    Exit 0; 6 when some process could not be inspected (its open files are not readable by
    this user, so it may hold a GPU unseen: run as root); 3 unreachable.
    """
    targets = _hosts(host)
    outcomes = fleet.each_host(targets, lambda h: call_agent(h, "scan"))
    docs = {}
    for out in outcomes:
        if out.error is None:
            docs[out.host.alias] = out.value.doc
            if not json:
                _print_doc(out.host, out.value.doc, status_view.gpu_table, status_view.holder_table,
                           status_view.last_teardown)
    if json:
        print(_json.dumps(docs, indent=1, sort_keys=True))
    _exit_worst(_codes(outcomes, agent_code=True))


@task(help={"host": HOST_HELP, "wait": "poll up to this many seconds (every 50 ms) until free",
            "max_used_mib": "count a GPU as free at or under this many MiB used (default 0)",
            "json": "print the result as JSON"})
@guarded
def verify(c, host=DEFAULT_HOST, wait="0", max_used_mib="0", json=False):
    """Exit 0 when every GPU is free (no compute process, 0 MiB used, no unprotected holder), else 1.

    Exit 6 when the only obstacle is processes this user could not inspect (run as root:
    a holder among them would be unseen, so FREE is never said).
    """
    wait_s = cliargs.seconds("wait", wait)
    max_mib = cliargs.whole("max-used-mib", max_used_mib)
    targets = _hosts(host)
    args = ["--wait", wait_s, "--max-used-mib", max_mib]
    outcomes = fleet.each_host(targets, lambda h: call_agent(h, "verify", args))
    codes, docs = [], {}
    for out in outcomes:
        if out.error is not None:
            continue
        doc = out.value.doc
        docs[out.host.alias] = doc
        if not json:
            _print_doc(out.host, doc, status_view.gpu_table)
            print("FREE: every GPU is free" if doc["free"] else "NOT FREE:\n  " + "\n  ".join(doc["problems"]))
            text = status_view.still_holding(doc)
            if text:
                print(text)
    if json:
        print(_json.dumps(docs, indent=1, sort_keys=True))
    codes = _codes(outcomes, agent_code=True)
    _exit_worst(codes)


def _selection_args(match, only_matching, disable) -> list:
    args = []
    for pattern in match or []:
        args += ["--match", cliargs.pattern("match", pattern)]
    if only_matching:
        args.append("--only-matching")
    if disable:
        args.append("--disable")
    return args


PLAN_HELP = {
    "host": HOST_HELP,
    "match": "extra target pattern, repeatable: a regex naming PROGRAMS (the executable, the module or script"
             " an interpreter runs, or a process title like sglang::scheduler_TP0), never an argument of"
             " another program; one matching the empty string ('', '.*') is refused",
    "only_matching": "stop only pattern matches and their trees; leave other GPU holders and report them",
    "disable": "also `systemctl disable` a unit that is stopped (e.g. an auto-started vLLM service)",
    "json": "print the result as JSON",
}


@task(iterable=["match"], help=PLAN_HELP)
@guarded
def plan(c, host=DEFAULT_HOST, match=None, only_matching=False, disable=False, json=False):
    """Dry run: what a teardown would stop (targets, with why) and keep (protected), and the MiB it frees."""
    targets = _hosts(host)
    args = _selection_args(match, only_matching, disable)
    outcomes = fleet.each_host(targets, lambda h: call_agent(h, "plan", args))
    docs = {o.host.alias: o.value.doc for o in outcomes if o.error is None}
    if json:
        print(_json.dumps(docs, indent=1, sort_keys=True))
    else:
        for out in outcomes:
            if out.error is None:
                _print_doc(out.host, out.value.doc, status_view.gpu_table, lambda d: teardown_view.plan_tables(d["plan"]))
    _exit_worst(_codes(outcomes))


@task(iterable=["match"], help=dict(
    PLAN_HELP,
    grace="seconds between SIGTERM and SIGKILL (default 30)",
    timeout="seconds to wait for the GPUs to be free after that (default 60)",
    wait_lock="wait this many seconds if another teardown holds the host's lock (default: fail at once, exit 4)",
    max_used_mib="count a GPU as free at or under this many MiB used (default 0)",
    dry_run="show the plan and signal nothing",
    settle="seconds the GPUs must stay free after the targets are gone, to catch a respawn (default 2)",
    yes="do not ask before signalling (required when not on a terminal)",
    fanout="hosts torn down at once (default 16)",
))
@guarded
def teardown(c, host=DEFAULT_HOST, match=None, only_matching=False, disable=False, grace="30", timeout="60",
             wait_lock="0", max_used_mib="0", dry_run=False, yes=False, json=False, fanout="16", settle="2"):
    """Free every GPU of the host(s) and prove it, harming nothing else.

    Order: lock the host; plan (targets + their trees and process groups, orphans holding a
    GPU; protected: PID 1, sshd, nvidia-persistenced, DCGM, exporters, monitors, this
    session); SIGTERM all targets at once; poll every 50 ms; SIGKILL what outlives --grace;
    verify the GPUs free (NVML v2, 0 MiB used) and keep watching --settle seconds for a
    respawn. Targets are PROGRAMS named by a pattern (module, script, executable or process
    title), never a mere argument of another program. Exit 0 freed and verified, 1 done but
    not free, 2 bad input, 3 host unreachable or its state dir unusable (nothing signalled),
    4 locked by another teardown, 6 not every process could be inspected (run as root),
    130 Ctrl-C (the host side goes on).
    """
    hosts_ = _hosts(host)
    args = _selection_args(match, only_matching, disable) + [
        "--grace", cliargs.seconds("grace", grace), "--timeout", cliargs.seconds("timeout", timeout),
        "--wait-lock", cliargs.seconds("wait-lock", wait_lock), "--max-used-mib", cliargs.whole("max-used-mib", max_used_mib),
        "--settle", cliargs.seconds("settle", settle),
        "--operator", operator()]
    width = cliargs.whole("fanout", fanout, minimum=1)
    if dry_run:
        return plan(c, host=host, match=match, only_matching=only_matching, disable=disable, json=json)
    approved = {}
    if not yes:
        if not sys.stdin.isatty():
            raise ConfigError("not on a terminal and no --yes: refusing to signal anything (see the plan with --dry-run)")
        approved = _confirm(hosts_, _selection_args(match, only_matching, disable))

    fleet_mode = len(hosts_) > 1

    def one(h):
        extra = ["--approved", approved[h.alias]] if h.alias in approved else []
        progress = None if json or fleet_mode else (lambda p: print(teardown_view.progress_line(h.alias, p), flush=True))
        result = call_agent(h, "teardown", args + extra, on_progress=progress)
        if result.doc.get("actions"):
            audit_log.append(h.alias, result.doc["actions"])
        return result

    done = (lambda out: print(teardown_view.host_line(out), flush=True)) if fleet_mode and not json else None
    with _ctrl_c_continues(hosts_, "the teardown continues"):
        outcomes = fleet.each_host(hosts_, one, width, on_done=done)
    codes = _codes(outcomes, agent_code=True)
    if json:
        print(_json.dumps({o.host.alias: o.value.doc for o in outcomes if o.error is None}, indent=1, sort_keys=True))
    elif fleet_mode:
        for out in outcomes:  # details only where something needs a person
            if out.error is None and out.value.code:
                _report_teardown(out.host, out.value)
        print(teardown_summary(outcomes))
    elif outcomes[0].error is None:
        _report_teardown(outcomes[0].host, outcomes[0].value)
    _exit_worst(codes)


EXIT_INTERRUPTED = 130


class _ctrl_c_continues:
    """While a teardown runs, Ctrl-C says the host side continues and how to see it; exit 130.

    The agent does not stop: behind ssh it ignores the hangup, and on this machine it runs
    in its own session (transport.call_agent). Why a SIGINT handler and os._exit rather
    than `except KeyboardInterrupt`: a fleet's worker threads would be joined on the way
    out, i.e. we would wait for every host's teardown before exiting; and the message is
    written with os.write, since the interrupted code may hold sys.stdout's lock.
    """

    def __init__(self, hosts_, what: str):
        names = ",".join(h.alias for h in hosts_)
        self.line = f"interrupted: {what} on {names}; see its result with `invoke status --host {names}`\n"

    def _on_sigint(self, signum, frame):
        try:
            sys.stdout.flush()
        except Exception:  # reentrant flush, closed pipe: the line below matters more
            pass
        os.write(2, self.line.encode())
        os._exit(EXIT_INTERRUPTED)

    def __enter__(self):
        self.old = signal.signal(signal.SIGINT, self._on_sigint)

    def __exit__(self, *exc):
        signal.signal(signal.SIGINT, self.old)


def operator() -> str:
    return f"{getpass.getuser()}@{socket.gethostname()}"


def _confirm(hosts_, args) -> dict:
    """Show each host's plan and ask once; returns {alias: 'pid:start,...'} that was approved."""
    outcomes = fleet.each_host(hosts_, lambda h: call_agent(h, "plan", args))
    approved = {}
    for out in outcomes:
        if out.error is not None:
            raise out.error
        doc = out.value.doc
        _print_doc(out.host, doc, lambda d: teardown_view.plan_tables(d["plan"]))
        approved[out.host.alias] = ",".join(f"{t['pid']}:{t['start_time']}" for t in doc["plan"]["targets"])
    answer = input("Signal the targets above? Only they will be signalled. [y/N] ").strip().lower()
    if answer not in ("y", "yes"):
        raise Exit("aborted: nothing was signalled", code=1)
    return approved


def _report_teardown(host, result) -> None:
    doc = result.doc
    if doc.get("locked") or doc.get("state_error"):
        print("== " + teardown_view.verdict_lines(host.alias, doc, result.code)[0])
        return
    _print_doc(host, doc, teardown_view.actions, teardown_view.before_after)
    print("\n".join(teardown_view.verdict_lines(host.alias, doc, result.code)))
    if result.code:
        text = status_view.still_holding(doc)
        if text:
            print(text)


def teardown_summary(outcomes) -> str:
    rows = []
    for out in outcomes:
        if out.error is not None:
            rows.append([out.host.alias, "-", "-", "-", "-", f"unreachable: {shorten(str(out.error), 40)}"])
            continue
        d, code = out.value.doc, out.value.code
        result = "locked" if d.get("locked") else ("freed" if code == 0 else "NOT FREE")
        plan_ = d.get("plan") or {"targets": [], "protected": []}
        rows.append([out.host.alias, d.get("freed_mib", "-"), len(plan_["targets"]), len(plan_["protected"]),
                     f"{out.value.wall_s:.2f}s", result])
    return "Summary\n" + table(["host", "freed MiB", "targets", "protected kept", "wall", "result"], rows, "  ")


def _one_host(spec: str):
    hosts_ = _hosts(spec)
    if len(hosts_) != 1:
        raise ConfigError(f"--host {spec!r}: this task takes exactly one host")
    return hosts_[0]


@task(help={"host": HOST_HELP, "phase": "phase name (see `invoke hosts --json` / hosts.env.example)"})
@guarded
def start(c, host=DEFAULT_HOST, phase=""):
    """Start a configured phase so it outlives the ssh session (systemd-run where systemd is PID 1, else setsid + log)."""
    h = _one_host(host)
    ph = phase_ops.phase_of(h, phase)
    r = phase_ops.start(h, ph)
    if r.code:
        raise Exit(f"gpu-pivot: {h.alias}: {r.doc.get('error')}", code=1)
    st = r.doc["state"]
    print(f"{h.alias}: phase {ph.name} started via {st['how']}: {st.get('unit') or 'pid %s, log %s' % (st['pid'], st['log'])}")


@task(help={"host": HOST_HELP, "phase": "phase name"})
@guarded
def stop(c, host=DEFAULT_HOST, phase=""):
    """Stop a phase started by gpu-pivot: systemctl stop, or SIGTERM its session and SIGKILL after its stop timeout."""
    h = _one_host(host)
    ph = phase_ops.phase_of(h, phase)
    r = phase_ops.stop(h, ph, operator())
    if r.doc.get("actions"):
        audit_log.append(h.alias, r.doc["actions"])
    print(f"{h.alias}: phase {ph.name}: " + (r.doc.get("note") or f"stopped {r.doc['stopped']}" +
                                             (f", still alive {r.doc['left']}" if r.doc.get("left") else "")))
    if r.code:
        raise Exit(code=1)


@task(help={"host": HOST_HELP, "phase": "phase name", "lines": "how many lines (default 50)",
            "follow": "keep printing new lines until Ctrl-C"})
@guarded
def logs(c, host=DEFAULT_HOST, phase="", lines="50", follow=False):
    """Show a phase's log (its log file, or journald for a systemd-run unit)."""
    h = _one_host(host)
    ph = phase_ops.phase_of(h, phase)
    n = cliargs.whole("lines", lines)
    if follow:
        raise Exit(code=phase_ops.follow_logs(h, ph, n))
    r = phase_ops.logs(h, ph, n)
    if r.code:
        raise Exit(f"gpu-pivot: {h.alias}: {r.doc.get('error')}", code=1)
    print("\n".join(r.doc["lines"]))


@task(help={"host": HOST_HELP, "gpus": "CUDA_VISIBLE_DEVICES the server will get (e.g. 0,1)"})
@guarded
def lint_launch(c, host=DEFAULT_HOST, gpus=""):
    """Check a server launch command (after `--`) on the host: EAGLE vs EAGLE3 draft, TP > GPUs, port taken,
    model/draft path missing, GPUs not free. Exit 0 clean, 5 findings."""
    argv = cliargs.remainder()
    if not argv:
        raise ConfigError("lint-launch needs the launch command after `--`")
    h = _one_host(host)
    r = phase_ops.lint(h, argv, gpus or None)
    for f in r.doc["findings"]:
        print(f"{h.alias}: {f['check']}: {f['message']}")
    if not r.doc["findings"]:
        print(f"{h.alias}: launch command OK ({r.doc['gpus_visible']} GPU(s) visible)")
    if r.code:
        raise Exit(code=r.code)


@task(iterable=["match"], help=dict(
    {k: v for k, v in PLAN_HELP.items() if k != "json"}, to="the phase to move to", dry_run="print every step and run none", yes="do not ask before the teardown",
    force="start even if the launch lint finds problems", drain="the running server's /metrics URL to drain first",
    grace="teardown: seconds between SIGTERM and SIGKILL (default 30)",
    timeout="teardown: seconds to wait for free GPUs (default 60)",
    ready_timeout="override the phase's readiness timeout (seconds)"))
@guarded
def pivot(c, host=DEFAULT_HOST, to="", match=None, only_matching=False, disable=False, dry_run=False, yes=False,
          force=False, drain="", grace="30", timeout="60", ready_timeout=""):
    """Move a host to the next phase: drain, teardown, gates, launch lint, start, wait ready, audit.

    Exit 0 done; 1 not ready / rolled back / a prep job failed; 3 unreachable; 4 locked;
    5 a gate or the launch lint blocked the start (nothing started).
    """
    h = _one_host(host)
    ph = phase_ops.phase_of(h, to)
    if drain and not re.match(r"^https?://\S+$", drain):
        raise ConfigError(f"--drain {drain!r}: must be an http(s) URL")
    td_args = _selection_args(match, only_matching, disable) + [
        "--grace", cliargs.seconds("grace", grace), "--timeout", cliargs.seconds("timeout", timeout),
        "--operator", operator()]
    rt = cliargs.seconds("ready-timeout", ready_timeout) if ready_timeout else None
    if not dry_run and not yes:
        if not sys.stdin.isatty():
            raise ConfigError("not on a terminal and no --yes: refusing to signal anything (see the steps with --dry-run)")
        approved = _confirm([h], _selection_args(match, only_matching, disable))
        td_args += ["--approved", approved[h.alias]]
    opts = PivotOptions(teardown_args=td_args, drain_url=drain or None, dry_run=dry_run, force=force,
                        operator=operator(), ready_timeout=rt)
    with _ctrl_c_continues([h], "the pivot stops here; a teardown already under way continues"):
        code = Pivot(h, ph, opts, out=lambda line: print(line, flush=True)).run()
    if code:
        raise Exit(code=code)


@task(help={"lines": "how many of the newest records (default 20)", "json": "print JSON lines"})
@guarded
def audit(c, lines="20", json=False):
    """Show the local audit log: every signal, unit stop and pivot, with host, operator and result."""
    recs = audit_log.read()[-cliargs.whole("lines", lines):]
    if json:
        for r in recs:
            print(_json.dumps(r, sort_keys=True))
        return
    print(f"audit log: {audit_log.audit_path()}")
    rows = [[r.get("time", ""), r.get("alias", ""), r.get("operator", ""), r.get("signal") or r.get("event"),
             r.get("pid", r.get("to", "")), r.get("result") or r.get("verdict"), shorten(r.get("cmdline") or "", 50)]
            for r in recs]
    print(table(["time", "host", "operator", "action", "pid/phase", "result", "cmdline"], rows))


ns = Collection(hosts, ping, run, oneliner, sandbox, status, verify, plan, teardown, start, stop, logs, lint_launch,
                pivot, audit)
