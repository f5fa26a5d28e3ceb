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
# A loop's timer: a watchdog that waits between its checks runs `sleep` beside the server it started
TIMERS = ("sleep",)
# Programs that run one command and end with it, changing who or how it runs (sudo with
# use_pty forks a monitor in a session of its own): what starts them is what starts the server
LAUNCHERS = ("sudo", "su", "setpriv", "runuser", "doas", "setsid", "flock", "nohup", "env", "nice", "ionice",
             "taskset", "numactl", "chrt", "stdbuf", "timeout", "chpst", "setuidgid", "s6-setuidgid")
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
    Interactive (`-i`, in any cluster of short options) never (_shell_args)."""
    interactive, code, operand = _shell_args(args)
    return not interactive and (code or operand is not None)


def _shell_args(args):
    """(interactive, -c given, index of the first operand or None) of a shell's arguments: the
    operand is `-c`'s code or a script's path. `--rcfile FILE` and the other options that take a
    value are skipped with it (`bash --rcfile venv.rc -i` is a terminal)."""
    code = False
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in _SHELL_OPT_WITH_VALUE:
            i += 2
            continue
        if arg == "--":
            return False, code, i + 1 if i + 1 < len(args) else None
        if arg.startswith("--"):
            if arg == "--interactive":
                return True, code, None
        elif arg[:1] in "-+" and len(arg) > 1:
            if "i" in arg[1:]:
                return True, code, None
            code = code or "c" in arg[1:]
        else:
            return False, code, i
        i += 1
    return False, code, None


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


_LOOP = re.compile(r"(?:^|[\s;&|(){}!`])(?:while|until|for|select)\s")
SCRIPT_READ_MAX = 1 << 16
SCRIPT_READ_S = 0.2


def shell_code(info):
    """The text a shell wrapper runs: its `-c` string, or its script's first 64 KiB (through
    /proc/PID/cwd for a relative path, a regular file only, read on a thread given 0.2 s: a
    script on a dead mount must not hang the teardown); None when it cannot be read."""
    args = [a for a in (info.get("argv") or []) if a is not None][1:]
    interactive, code, i = _shell_args(args)
    if interactive or i is None:
        return None
    if code:
        return args[i]
    path = args[i]
    if not path.startswith("/"):
        path = "/proc/%d/cwd/%s" % (info["pid"], path)
    return _read_script(path)


def _read_script(path):
    import threading  # here: only a surviving shell wrapper's script is ever read

    got: list = []

    def read():
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
        except OSError:
            return
        try:
            import stat as stat_mod
            if stat_mod.S_ISREG(os.fstat(fd).st_mode):
                got.append(os.read(fd, SCRIPT_READ_MAX).decode("utf-8", "replace"))
        except OSError:
            pass
        finally:
            os.close(fd)

    worker = threading.Thread(target=read, daemon=True)
    worker.start()
    worker.join(SCRIPT_READ_S)
    return got[0] if got else None


def loops(info):
    """May this wrapper start its targets again by itself? True when its code has a loop
    (while, until, for, select) or cannot be read (assumed to); False for an init and for
    code without a loop (`bash -c "SERVER; sleep 20"`: it ends once its commands have run)."""
    if kind(info) != "shell":
        return False
    code = shell_code(info)
    return code is None or bool(_LOOP.search(code))


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


def looping_ancestors(target_pids, procs, never=frozenset()):
    """{pid: [target pids]} for the shell wrappers in the targets' ancestry whose code loops
    (loops()): what restarts a server even when it runs other children beside it."""
    targets = set(target_pids)
    decided: dict = {}
    out: dict = {}
    for pid in sorted(targets):
        for up in ancestry(procs[pid]["ppid"], procs, never) if pid in procs else []:
            if up in targets or procfs.finished(procs[up]) or kind(procs[up]) != "shell":
                continue
            if up not in decided:
                decided[up] = loops(procs[up])
            if decided[up]:
                out.setdefault(up, []).append(pid)
    return out


def _wrapped(pid, targets, found, kids):
    out = set()
    for child in kids.get(pid, []):
        if child in targets:
            out.add(child)
        elif child in found:
            out.update(found[child])
    return out
