"""Scan /proc for every process, and for who holds a GPU device file, as fuser does.

Why /proc and not fuser: hosts without psmisc still work, we get pid -> device files in
one pass, and we read everything else about each holder (tree, state, cgroup, files open
for writing) from the same place. fuser's output is parsed elsewhere to cross-check.
Permission-denied entries are reported, never silently dropped: an unprivileged scan
that cannot see a holder must say so.
"""
import glob
import os
import pwd
import stat

from . import cgroup, procfs

PROC = "/proc"
O_ACCMODE = 0o3  # fdinfo flags & 3: 0 read-only, 1 write-only, 2 read-write
_NOT_FILES = ("/dev/", "/proc/", "/sys/", "pipe:", "socket:", "anon_inode:", "/memfd:")


def device_paths(pattern):
    """The device files the glob names, as the paths /proc/PID/fd links will show."""
    return {os.path.realpath(p) for p in glob.glob(pattern)}


def _read(path, mode="rb"):
    with open(path, mode) as f:
        return f.read()


def basic(pid, proc=PROC):
    """stat + argv + uid of one process, or None when it is gone."""
    stat = procfs.read_stat(pid, proc)
    if stat is None:
        return None
    try:
        raw = _read("%s/%d/cmdline" % (proc, pid))
    except (FileNotFoundError, ProcessLookupError):
        return None
    except PermissionError:
        raw = b""
    argv = [a.decode("utf-8", "replace") for a in raw.split(b"\0")[:-1]] if raw else []
    stat["argv"] = argv
    stat["cmdline"] = " ".join(argv) if argv else "[%s]" % stat["comm"]
    try:
        stat["uid"] = os.stat("%s/%d" % (proc, pid)).st_uid
    except FileNotFoundError:
        return None
    return stat


def held_devices(pid, devices, proc=PROC):
    """(sorted device files this pid holds open, None) or ([], 'permission denied')."""
    fd_dir = "%s/%d/fd" % (proc, pid)
    held = set()
    try:
        with os.scandir(fd_dir) as entries:
            for entry in entries:
                try:
                    target = os.readlink(entry.path)
                except OSError:
                    continue
                if target in devices:
                    held.add(target)
    except PermissionError:
        return [], "permission denied"
    except (FileNotFoundError, ProcessLookupError, NotADirectoryError):
        return [], None
    return sorted(held), None


def write_files(pid, proc=PROC):
    """Regular files this process has open for writing (fdinfo flags), e.g. a checkpoint."""
    out = []
    fd_dir = "%s/%d/fd" % (proc, pid)
    try:
        fds = os.listdir(fd_dir)
    except OSError:
        return out
    for fd in fds:
        try:
            target = os.readlink("%s/%s" % (fd_dir, fd))
            if not target.startswith("/") or target.startswith(_NOT_FILES):
                continue
            info = _read("%s/%d/fdinfo/%s" % (proc, pid, fd), "r")
        except OSError:
            continue
        for line in info.splitlines():
            if line.startswith("flags:") and int(line.split()[1], 8) & O_ACCMODE:
                out.append(target.replace(" (deleted)", ""))
                break
    return sorted(set(out))


def mapped_devices(pid, devices, proc=PROC):
    """Device files memory-mapped by the process: a CUDA context maps /dev/nvidia*, while a
    process that only opened an NVML handle (a monitor) holds the files without mapping them
    (fuser shows F...m vs F....)."""
    out = set()
    try:
        with open("%s/%d/maps" % (proc, pid)) as f:
            for line in f:
                parts = line.split(None, 5)
                if len(parts) == 6 and parts[5].rstrip("\n") in devices:
                    path = parts[5].rstrip("\n")
                    out.add(path)
    except OSError:
        return None  # unknown (gone, or not allowed): callers must not treat it as "not mapped"
    return sorted(out)


def real_devices(paths):
    """True when every path is a character device (a real GPU node, not a sandbox file)."""
    try:
        return bool(paths) and all(stat.S_ISCHR(os.stat(p).st_mode) for p in paths)
    except OSError:
        return False


def all_pids(proc=PROC):
    return sorted(int(n) for n in os.listdir(proc) if n.isdigit())


def clock_ticks():
    return os.sysconf("SC_CLK_TCK")


def uptime_s(proc=PROC):
    return float(_read("%s/uptime" % proc, "r").split()[0])


def user_name(uid, cache={}):
    if uid not in cache:
        try:
            cache[uid] = pwd.getpwuid(uid).pw_name
        except KeyError:
            cache[uid] = str(uid)
    return cache[uid]


def snapshot(devices_glob, proc=PROC):
    """Every process (basic fields) and which of them hold a GPU device file.

    Returns {'procs': {pid: info}, 'holders': {pid: [device files]}, 'denied': [pids]}.
    """
    devices = device_paths(devices_glob)
    procs, holders, denied = {}, {}, []
    for pid in all_pids(proc):
        info = basic(pid, proc)
        if info is None:
            continue
        procs[pid] = info
        if not devices:
            continue
        held, problem = held_devices(pid, devices, proc)
        if problem:
            denied.append(pid)
        elif held:
            holders[pid] = held
    return {"procs": procs, "holders": holders, "denied": denied, "devices": sorted(devices)}


def detail(info, held, proc=PROC, now_ticks=None):
    """The full per-process record shown to users: add user, age, unit/container, writes."""
    pid = info["pid"]
    cg = cgroup.read(pid, proc)
    out = dict(info)
    out["user"] = user_name(info["uid"])
    out["devices"] = held
    out["unit"] = cg["unit"]
    out["container"] = cg["container"]
    out["write_files"] = write_files(pid, proc)
    out["mapped_devices"] = mapped_devices(pid, set(held), proc) if held else []
    if now_ticks is not None:
        out["age_s"] = max(0.0, (now_ticks - info["start_time"]) / clock_ticks())
    return out


def children_map(procs):
    kids = {}
    for pid, info in procs.items():
        kids.setdefault(info["ppid"], []).append(pid)
    return kids


def ancestors(pid, procs):
    """pid, its parent, ... up to PID 1 (inclusive), as far as /proc shows them."""
    chain, seen = [], set()
    while pid and pid not in seen:
        seen.add(pid)
        chain.append(pid)
        info = procs.get(pid)
        if info is None:
            break
        pid = info["ppid"]
    return chain


def self_chain(procs):
    """The agent and its ancestors: never targets (the ssh session, `pct`, the shell)."""
    return set(ancestors(os.getpid(), procs))
