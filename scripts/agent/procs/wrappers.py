"""What stands between a server and whatever starts it: wrappers and supervisors.

Why: servers are rarely started bare. A unit runs `bash -c "cd /srv && . ./env.sh && python3
-m sglang.launch_server ...; echo server exited"`, a container runs `docker-init -- vllm serve`,
a script loops `vllm serve ...; sleep 1`. Signalling the server alone leaves the thing that
restarts it: systemd's Restart=always, docker's restart policy, the loop. So a wrapper is
- a shell that runs code or a script (`bash -c ...`, `sh -c ...`, `bash supervise.sh`), never an
  interactive shell (a tmux pane's or a login shell: someone's terminal), or
- an init: docker-init, tini, dumb-init, catatonit,
and it wraps targets when every child it has is a target, another such wrapper, or a log
filter fed by the server's output (`... | tee server.log`: it ends at the server's EOF). A unit
or container that holds only targets, wrappers and their log filters is stopped through its
manager (plan.py). A
wrapper outside any unit or container is a free-standing supervisor: the plan names it, and
`--stop-supervisors` makes it a target too (it is never signalled otherwise: a shell loop is
someone's process, and the flag is how the operator says it may go).
"""
import os
import re

from . import procfs

INITS = ("docker-init", "tini", "tini-static", "dumb-init", "catatonit")
LOG_FILTERS = ("tee", "logger", "cat", "ts", "rotatelogs", "multilog", "svlogd", "cronolog")
_SHELL = re.compile(r"^(bash|sh|dash|zsh|ksh|ash|busybox)$")


_SHELL_OPT_WITH_VALUE = ("--rcfile", "--init-file", "-O", "+O", "-o", "+o")


def kind(info):
    """'init', 'shell' or None: may this process be a wrapper at all, by what it runs."""
    argv = [a for a in (info.get("argv") or []) if a]
    comm = info.get("comm") or ""
    base = os.path.basename(argv[0]) if argv else ""
    if base in INITS or comm in INITS:
        return "init"
    if argv and _SHELL.match(base) and _runs_code_or_script(argv[1:]):
        return "shell"
    return None


def _runs_code_or_script(args):
    """Does a shell with these arguments run `-c` code or a script (not someone's terminal)?
    Interactive (`-i`, in any cluster of short options) never; `--rcfile FILE` and the other
    options that take a value are skipped with it (`bash --rcfile venv.rc -i` is a terminal)."""
    code = False
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in _SHELL_OPT_WITH_VALUE:
            i += 2
            continue
        if arg == "--":
            return code or i + 1 < len(args)
        if arg.startswith("--"):
            if arg == "--interactive":
                return False
        elif arg[:1] in "-+" and len(arg) > 1:
            if "i" in arg[1:]:
                return False
            code = code or "c" in arg[1:]
        else:
            return True  # code's text, or a script's path
        i += 1
    return False


def find(target_pids, procs, kids, never=frozenset()):
    """({pid: [target pids it wraps]}, {log filter pids}) for every process that wraps
    targets: walking up from each target, a parent that is a wrapper by kind() and whose every
    live child is a target, a wrapper already found or a log filter (with at least one of the
    first two). `never`: PID 1, the agent's chain, protected processes."""
    targets = set(target_pids)
    found: dict = {}
    filters: set = set()
    changed = True
    while changed:  # a wrapper of a wrapper is found once the inner one is
        changed = False
        for pid in sorted(targets | set(found)):
            parent = procs.get(pid, {}).get("ppid")
            if parent in found or parent in targets or parent in never or parent in (None, 0, 1):
                continue
            info = procs.get(parent)
            if info is None or procfs.finished(info) or kind(info) is None:
                continue
            live = [c for c in kids.get(parent, []) if not procfs.finished(procs[c])]
            inner = [c for c in live if c in targets or c in found]
            logs = [c for c in live if c not in inner and _log_filter(procs[c])]
            if inner and len(inner) + len(logs) == len(live):
                found[parent] = sorted(_wrapped(parent, targets, found, kids))
                filters.update(logs)
                changed = True
    return found, filters


def _log_filter(info):
    argv = info.get("argv") or []
    return bool(argv) and os.path.basename(argv[0]) in LOG_FILTERS


def _wrapped(pid, targets, found, kids):
    out = set()
    for child in kids.get(pid, []):
        if child in targets:
            out.add(child)
        elif child in found:
            out.update(found[child])
    return out
