"""Which processes are targets and which are protected, and why.

Why names and not text: killing by command line and by device file killed monitors and
nvidia-persistenced along with the server. Protection looks at every name a process goes
by (program.names: comm, which is 15 chars: 'nvidia-persiste', argv[0]'s basename, and for
interpreters the script or `-m` module: nvitop and gpustat are Python programs); target
patterns name programs the same way (program.match).

Why names are not enough: any user can call a process `Xorg`, `nvidia-cuda-mps-server` or
shape its argv like an agent call (`exec -a Xorg`), and a protected name is never
signalled - a job's leftover would dodge the teardown and keep the GPU.

The whole account: docs/design-notes.md (scripts/agent/policy/rules.py)."""
import os
import re
import stat

from ..procs import fdstat, procfs
from ..wire import call
from . import program
from .builtin import DEFAULT_TARGETS, PROTECTED_NAMES, PROTECTED_SUFFIXES

_EXPORTER = re.compile(r"(%s)$" % "|".join(re.escape(x) for x in PROTECTED_SUFFIXES))


def names_of(proc):
    """Every name the process goes by, for the protect list."""
    names = {name for name, _ in program.names(proc) if " " not in name}
    names.add(proc.get("comm") or "")
    argv = proc.get("argv") or []
    if argv and os.path.basename(argv[0]).startswith("sshd:"):
        names.add("sshd")
    names.discard("")
    return names


LOGIN_DEFS = "/etc/login.defs"
DEFAULT_UID_MIN = 1000
_state: dict = {"sandbox_uid": None, "uid_min": None}


def trust_own_names(fake_devices):
    """--fake-devices: the names of processes running wholly as our own uid count too (the
    sandbox's stand-ins). Never on a real host: there a name is trusted only by trusted_names."""
    _state["sandbox_uid"] = os.geteuid() if fake_devices else None


def uid_min(path=LOGIN_DEFS):
    """The first uid of a person's account (login.defs UID_MIN; 1000 where it says none)."""
    if _state["uid_min"] is None:
        value = DEFAULT_UID_MIN
        try:
            with open(path) as f:
                for line in f:
                    words = line.split()
                    if len(words) >= 2 and words[0] == "UID_MIN" and re.fullmatch(r"[0-9]+", words[1]):
                        value = int(words[1])
        except OSError:
            pass
        _state["uid_min"] = value
    return _state["uid_min"]


def root_owned_exe(pid):
    """The real path of the program the process runs when that file is a regular file owned by
    root and writable by root only, in directories that are too; else None. stat() of
    /proc/PID/exe is the running file itself, whatever was since renamed over its path.
    Why the directories: the name is what decides a role, and a user may give a root-owned
    file a name of their own in a directory of theirs (`mount --bind /usr/bin/python3
    ~/fake/tmux` in a user namespace: a watchdog that read as tmux)."""
    try:
        st = fdstat.stat_open_file("/proc/%d/exe" % pid)  # cached attributes: a program on a dead NFS server
        path = os.readlink("/proc/%d/exe" % pid)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
        return None
    return path if _root_owned_dirs(pid, path) else None


def _root_owned_dirs(pid, path):
    """Is each directory above `path`, as the process sees it (its root and mounts, through
    /proc/PID/root), root's, and writable by root only? A sticky one (/tmp) may be above the
    program's own directory: no one else may rename or replace root's entry in it; not its
    own directory, where anyone may add a name."""
    where = "/proc/%d/root" % pid
    parts = [""] + [p for p in os.path.dirname(path).split("/") if p]
    for n, part in enumerate(parts):
        where = where + "/" + part if part else where
        try:
            st = fdstat.stat_open_file(where)
        except OSError:
            return False
        sticky_above = st.st_mode & stat.S_ISVTX and n < len(parts) - 1
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or (st.st_mode & 0o022 and not sticky_above):
            return False
    return True


def _exe_unreadable(pid):
    try:
        fdstat.stat_open_file("/proc/%d/exe" % pid)
    except PermissionError:
        return True
    except OSError:
        return False
    return False


def trusted_names(proc):
    """May this process's names protect it? Only if no user could have started it so (see the
    module docstring). An agent that is not root cannot read another user's executable: a
    process wholly of system uids is trusted then (no user can take a system uid), and such an
    agent could not signal it anyway."""
    pid = proc["pid"]
    ids = procfs.uids(pid)
    if not ids:
        return False
    sandbox = _state["sandbox_uid"]
    if sandbox is not None and all(u == sandbox for u in ids):
        return True
    if not all(u < uid_min() for u in ids):
        return False
    return root_owned_exe(pid) is not None or (os.geteuid() != 0 and _exe_unreadable(pid))


def protected_name(proc):
    """(name, why) of the first protected name the process goes by, or None (trust aside)."""
    for name in sorted(names_of(proc)):
        if name in PROTECTED_NAMES:
            return name, "%s (%s)" % (PROTECTED_NAMES[name], name)
        if name.startswith("sshd"):
            return name, "ssh server (%s)" % name
        if _EXPORTER.search(name):
            return name, "metrics exporter (%s)" % name
    return None


def protect_reason(proc, self_chain, extra_protect=()):
    """Why this process must never be signalled, or None."""
    pid = proc["pid"]
    if pid == 1:
        return "PID 1"
    if pid in self_chain:
        return "gpu-pivot agent or its ancestor (ssh session / pct)" if pid != os.getpid() else "gpu-pivot agent"
    if pid in procfs.OWN_WORKERS and proc.get("ppid") == os.getpid():  # its pid, once reaped, is anyone's
        return "this gpu-pivot agent's scan worker"
    cmdline = proc.get("cmdline") or ""
    named = protected_name(proc)
    if named and trusted_names(proc):
        return named[1]
    if call.agent_call(proc.get("argv") or []) and trusted_names(proc):  # another operator's scan: NVML
        return "another gpu-pivot agent"
    for pattern in extra_protect:
        if re.search(pattern, cmdline):
            return "host protect pattern %s" % pattern  # as written: a repr would double each backslash
    return None


def patterns_of(sel):
    """The target patterns of a run: the host's TARGETS (or the defaults) and every --match."""
    return list(sel.target or DEFAULT_TARGETS) + list(sel.match or ())


def target_reason(proc, patterns):
    """Why this process is a target in words ("runs module sglang.launch_server"), or None."""
    hit = program.match(proc, patterns)
    if hit is None:
        return None
    pattern, why = hit
    return "%s (target pattern %s)" % (why, pattern)  # as written, not repr-escaped
