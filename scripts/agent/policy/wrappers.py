"""What stands between a server and whatever starts it: wrappers and supervisors.

Why: servers are rarely started bare. A unit runs `bash -c "cd /srv && . ./env.sh && python3
-m sglang.launch_server ...; echo server exited"`, a container runs `docker-init -- vllm serve`,
a script loops `vllm serve ...; sleep 1`. Signalling the server alone leaves the thing that
restarts it: systemd's Restart=always, docker's restart policy, the loop. So a wrapper is
- a shell that runs code or a script (`bash -c ...`, `sh -c ...`, `bash supervise.sh`), never an
  interactive shell (a tmux pane's or a login shell: someone's terminal), or
- an init: docker-init, tini, dumb-init, catatonit,
and it wraps targets when every child it has is a target, another such wrapper, or a log
filter fed by the server's output (`... | tee server.log`: it ends at the server's EOF).

The whole account: docs/design-notes.md (scripts/agent/policy/wrappers.py)."""
import os

from ..procs import procfs
from . import shellcode
from .builtin import INITS, LAUNCHERS, LOG_FILTERS, TIMERS


def kind(info):
    """'init', 'shell' or None: may this process be a wrapper at all, by what it runs."""
    argv = [a for a in (info.get("argv") or []) if a]
    comm = info.get("comm") or ""
    base = os.path.basename(argv[0]) if argv else ""
    if base in INITS or comm in INITS:
        return "init"
    if argv and shellcode.shell_form(info)[0] in ("inline", "script", "stdin"):
        return "shell"
    return None


def launcher(info):
    """Does this process only launch one command and end with it (sudo and its monitor, su,
    setpriv, setsid, flock, nohup, ...)?"""
    argv = info.get("argv") or []
    base = os.path.basename(argv[0]) if argv and argv[0] else ""
    return base in LAUNCHERS or (info.get("comm") or "") in LAUNCHERS


def find(target_pids, procs, kids, never=frozenset()):
    """({pid: [target pids it wraps]}, {helper pids}) for every process that wraps targets:
    walking up from each target, a parent that is a wrapper by kind() and whose every live
    child is a target, a wrapper already found, a launcher of those (`sudo SERVER`: walked
    through), a log filter or a loop's timer (`sleep`), with at least one of the first three.
    `never`: PID 1, the agent's chain, protected processes."""
    targets = set(target_pids)
    found: dict = {}
    through: dict = {}  # launchers whose every live child is a target or a wrapper: {pid: [target pids]}
    helpers: set = set()
    changed = True
    while changed:  # a wrapper of a wrapper is found once the inner one is
        changed = False
        for pid in sorted(targets | set(found) | set(through)):
            parent = procs.get(pid, {}).get("ppid")
            if parent in found or parent in through or parent in targets or parent in never \
                    or parent in (None, 0, 1):
                continue
            info = procs.get(parent)
            if info is None or procfs.finished(info):
                continue
            is_launcher = kind(info) is None and launcher(info)
            if kind(info) is None and not is_launcher:
                continue
            live = [c for c in kids.get(parent, []) if not procfs.finished(procs[c])]
            inner = [c for c in live if c in targets or c in found or c in through]
            side = [c for c in live if c not in inner and _helper(procs[c])]
            if inner and len(inner) + len(side) == len(live):
                wrapped = sorted(_wrapped(parent, targets, {**found, **through}, kids))
                (through if is_launcher else found)[parent] = wrapped
                helpers.update(side)
                changed = True
    return found, helpers


def _helper(info):
    """A log filter fed by the server's output, or a loop's timer."""
    argv = info.get("argv") or []
    return bool(argv) and os.path.basename(argv[0]) in LOG_FILTERS + TIMERS


def started_by_wrapper(info, procs):
    """Was this session leader started by a wrapper or a launcher, or by a helper in a
    wrapper's session (`while :; do flock LOCK setsid python3 launch.py; done`)? A terminal's
    shell is not: its parent is sshd, a multiplexer or a terminal, each leading a session of
    its own."""
    parent = procs.get(info["ppid"])
    if parent is None or parent["pid"] in (0, 1):
        return False
    leader = procs.get(parent["sid"])
    return kind(parent) is not None or launcher(parent) or (leader is not None and kind(leader) is not None)


def ancestry(pid, procs, stop=frozenset()):
    """[pid, its parent, ...] from `pid` up, the processes that could start it again: ends
    after a session leader (a terminal's shell, a multiplexer's pane, a unit's main process)
    unless it is a launcher or a wrapper or launcher started it (`while :; do setsid python3
    launch.py; done`, `while :; do sudo python3 server.py; done`: the loop restarts it), and
    before PID 1, a pid in `stop` (the agent's chain) or a cycle (a pid reused between reads)."""
    out: list = []
    while pid not in (0, 1) and pid in procs and pid not in stop and pid not in out:
        info = procs[pid]
        out.append(pid)
        if info["sid"] == pid and not launcher(info) and not started_by_wrapper(info, procs):
            break
        pid = info["ppid"]
    return out


def _wrapped(pid, targets, found, kids):
    out = set()
    for child in kids.get(pid, []):
        if child in targets:
            out.add(child)
        elif child in found:
            out.update(found[child])
    return out
