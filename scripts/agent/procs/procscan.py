"""Scan /proc for every process, and for who holds a GPU device, as fuser does but by identity.

Why /proc and not fuser: hosts without psmisc still work, we get pid -> devices in one
pass, and we read everything else about each holder (tree, state, cgroup, files open for
writing) from the same place. An open file is a GPU device by what `stat()` says it is
(devices.DeviceSet), in ANY thread's fd table: a thread made with its own table
(unshare(CLONE_FILES)) or the live thread of an exited (zombie) leader holds fds that
/proc/PID/fd does not show. Processes whose fds cannot be read are reported, never
silently dropped: an unprivileged scan that cannot see a holder must say so, and then
nothing may be called free. Kernel threads have no fds and are skipped.
"""
import ctypes
import os
import pwd
import re
import stat

from . import cgroup, fanout, fdstat, pidrange, procfs, textsafe

PROC = "/proc"
PF_KTHREAD = 0x00200000  # /proc/PID/stat flags: a kernel thread (no command line, no files)
UNSETTLED = "its threads kept exiting while read"
O_ACCMODE = 0o3  # fdinfo flags & 3: 0 read-only, 1 write-only, 2 read-write
O_APPEND = 0o2000  # fdinfo flags are octal, in the kernel's numbering (x86 and arm64 alike)
_NOT_FILES = ("/dev/", "/proc/", "/sys/", "pipe:", "socket:", "anon_inode:", "/memfd:")


def _read(path, mode="rb"):
    data = procfs.read_bytes(path)
    return data if mode == "rb" else data.decode("utf-8", "replace")


def printable(text):
    """Text safe to show on a terminal (textsafe.printable: control characters, newlines and
    bidi overrides as \\xNN / \\uNNNN; an escape sequence in a process title could erase "NOT
    FREE" from the operator's screen). Used for every command line shown; matching uses argv."""
    return textsafe.printable(text)


THREAD_LISTINGS = 3  # a zombie leader's threads, listed again while they vanish under us


def _from_threads(pid, name, proc=PROC):
    """/proc/PID/task/TID/<name> of the first thread besides the leader that shows it (a
    leader that exited first shows an empty cmdline and maps; its threads still share them).
    Threads gone or in their exit read empty too, so they are listed again while new ones keep
    appearing (a relay of short-lived threads hides itself from one listing); after
    THREAD_LISTINGS listings that is None, and the caller counts the process as
    not inspected. No new thread: it is winding down, and b"" is the answer. Listing errors
    propagate (FileNotFoundError: the process is gone)."""
    seen: set = set()
    for _ in range(THREAD_LISTINGS):
        tids = set(os.listdir("%s/%d/task" % (proc, pid))) - {str(pid)}
        for tid in tids:
            try:
                data = _read("%s/%d/task/%s/%s" % (proc, pid, tid, name))
            except OSError:
                continue
            if data:
                return data
        if not tids - seen:
            return b""
        seen |= tids
    return None


def basic(pid, proc=PROC, lean=False):
    """stat + argv + uid of one process, or None when it is gone. `lean`: stat and argv alone
    (what a target pattern is matched on), the rest left to complete()."""
    stat = procfs.read_stat(pid, proc)
    if stat is None:
        return None
    if stat["flags"] & PF_KTHREAD:  # a kernel thread: no command line, no files, root's
        stat.update(argv=[], cmdline="[%s]" % printable(stat["comm"]), uid=0)
        return stat
    try:
        raw = procfs.read_record("%s/%d/cmdline" % (proc, pid))
        if not raw and stat["threads"] > 1:
            raw = _from_threads(pid, "cmdline", proc)  # a zombie leader: its live threads still show it
            if raw is None:
                stat["unreadable"] = UNSETTLED
                raw = b""
    except (FileNotFoundError, ProcessLookupError):
        return None
    except PermissionError:
        raw = b""
    stat["argv"] = [textsafe.decode(a) for a in raw.split(b"\0")[:-1]] if raw else []  # bytes not UTF-8: U+EF80+
    return stat if lean else complete(stat, proc)


GONE_UID = -1  # the uid of a process gone before its owner was read (as not_understood's unknown one)


def complete(stat, proc=PROC):
    """basic()'s record whole: the command line as shown and the owner's uid added to a lean
    one; None when the process is gone. Why lean first: before the first signal the scan reads
    every process's stat and argv, and only those a target pattern names need more; the rest
    is read after the signal (15% of each record's cost, 20,000 times over)."""
    if "uid" in stat:
        return stat
    argv = stat["argv"]
    stat["cmdline"] = printable(" ".join(argv) if argv else "[%s]" % stat["comm"])
    try:
        stat["uid"] = os.stat("%s/%d" % (proc, stat["pid"])).st_uid
    except FileNotFoundError:
        return None
    return stat


# Every fd is stat()-ed through /proc/PID/fd/N (the open file itself, in the holder's mount
# namespace: a device bind-mounted under /proc/... or /sys/..., or opened by any other name,
# is still the device), from cached attributes (fdstat.py: a dead NFS server or a hung FUSE
# daemon must not hang the scan). No readlink() first to skip sockets and pipes: stat() tells
# them apart as cheaply, and one syscall per fd instead of two is ~20% of a scan of a busy host.
# An O_PATH fd (a path handle: the device was never opened, its driver never called) is not
# holding the device, whoever could make one: its fdinfo flags say so.
O_PATH = 0o10000000
KCMP_FILES = 2
_KCMP_NR = {"x86_64": 312, "aarch64": 272, "ppc64le": 354, "s390x": 343}
_kcmp_fn: list = []  # [(syscall, nr) or None], filled once by _kcmp()


def _kcmp():
    if not _kcmp_fn:
        nr = _KCMP_NR.get(os.uname().machine)  # platform.machine(), without importing platform
        try:
            libc = ctypes.CDLL(None, use_errno=True) if nr else None
        except OSError:
            libc = None
        _kcmp_fn.append((libc.syscall, nr) if libc is not None else None)
    return _kcmp_fn[0]


def shares_fd_table(pid, tid):
    """True when thread tid uses its process's fd table (kcmp KCMP_FILES); False when it
    has its own or that cannot be told (then its fds are read too: correctness first)."""
    fn = _kcmp()
    if fn is None:
        return False
    syscall, nr = fn
    return syscall(nr, pid, tid, KCMP_FILES, 0, 0) == 0


def fd_dirs(pid, threads, proc=PROC):
    """The fd directories that together show every fd of the process: its own, plus those
    of threads with an fd table of their own (or of a leader that exited before them)."""
    dirs = ["%s/%d/fd" % (proc, pid)]
    if threads > 1 and proc == PROC:
        try:
            tids = [int(t) for t in os.listdir("%s/%d/task" % (proc, pid)) if int(t) != pid]
        except OSError:
            tids = []
        for tid in tids:
            if not shares_fd_table(pid, tid):
                dirs.append("%s/%d/task/%d/fd" % (proc, pid, tid))
    return dirs


def held_devices(pid, devset, threads=1, proc=PROC, links=None):
    """(sorted GPU devices this pid holds open, None) or ([], why it could not be read).
    `links`, when a dict, gathers (st_dev, st_ino) -> device of the files opened (a mapping of
    the same inode is the same device, whatever name it was opened by). A leader that exited
    first shows no fds of its own; when no thread listed shows one either (gone, or in its
    exit) while new threads keep appearing, they are listed again (a relay of short-lived
    threads hides its fds from one listing), THREAD_LISTINGS times, then
    the process is not inspected. No new thread: it is winding down and holds none we can see."""
    seen: set = set()
    for _ in range(THREAD_LISTINGS):
        dirs = fd_dirs(pid, threads, proc)
        held, denied, quiet = _held_once(dirs, devset, links)
        fresh = set(dirs[1:]) - seen
        if not quiet or not fresh:
            break
        seen |= fresh
        threads = 2  # list them again, whatever the stat read before said
    else:
        return [], UNSETTLED
    if denied and not held:
        return [], denied
    return sorted(held), None


def _held_once(dirs, devset, links):
    """(devices held, 'permission denied' or None, quiet): quiet when no directory listed was
    read whole (the leader's shows no fd; its threads' were gone, or let go while read)."""
    held: set = set()
    denied = None
    shown = False
    for fd_dir in dirs:
        whole, read = True, 0
        try:
            with os.scandir(os.fsencode(fd_dir)) as entries:  # bytes: what statx() takes, no encoding per fd
                for entry in entries:
                    try:
                        st = fdstat.stat_open_file(entry.path, refused_ok=True)  # the open file itself
                    except PermissionError:
                        # listed, but not readable (no CAP_SYS_PTRACE): /proc refuses all of a process's
                        # fds alike, so the rest would cost as much and say the same (a process with
                        # 3,000 fds and 14 threads cost 40,000 refused stat()s a scan)
                        denied = "permission denied"
                        break
                    except OSError:
                        whole = False  # closed while we looked (or its thread's table let go in its exit)
                        continue
                    read += 1
                    name = devset.identify(st)
                    # an O_PATH handle does not hold the device; fdinfo is read only for a device not yet held
                    path_only = False if not name or name in held else _path_only(fd_dir, os.fsdecode(entry.name))
                    if path_only is None:
                        whole = False  # gone between its stat and its fdinfo
                    elif name and not path_only:
                        held.add(name)
                        if links is not None:
                            links[(st.st_dev, st.st_ino)] = name
        except PermissionError:
            denied = "permission denied"
        except (FileNotFoundError, ProcessLookupError, NotADirectoryError):
            continue
        shown = shown or (whole and read > 0)
        if denied:
            break
    return held, denied, not held and not denied and not shown and len(dirs) > 1


def _path_only(fd_dir, name):
    """True when fd `name` is an O_PATH handle (fdinfo flags), None when it is gone by now."""
    try:
        with open("%sinfo/%s" % (fd_dir, name)) as f:
            for line in f:
                if line.startswith("flags:"):
                    return bool(int(line.split()[1], 8) & O_PATH)
    except OSError:
        return None
    return False


def _needle(key):
    dev, ino = key
    return b" %02x:%02x %d " % (os.major(dev), os.minor(dev), ino)


def mapped_by_identity(pid, needles, proc=PROC):
    """Devices this process maps (a CUDA context maps /dev/nvidia*), by the (dev, inode) that
    /proc/PID/maps shows for each mapping - not by its path text, so a mapping made through a
    hard link or under another name still counts, and so does one whose fd was closed.
    `needles`: {b' MAJ:MIN INODE ': device}. Returns a sorted list, or None if unreadable."""
    data = _maps(pid, proc)
    if data is None:
        return None
    if not any(needle in data for needle in needles):  # the common case, at memchr speed
        return []
    by_key = {needle.strip(): name for needle, name in needles.items()}
    return sorted({by_key[m.group(1)] for m in _maps_pattern(tuple(sorted(by_key))).finditer(data)})


def _maps(pid, proc=PROC):
    """The process's /proc maps: its leader's, or - when those read empty (a leader that exited
    first) - a live thread's (_from_threads). b"" when it maps nothing; None when it could not be
    read, which counts as not inspected rather than as mapping nothing."""
    try:
        data = _read("%s/%d/maps" % (proc, pid))
        return data or _from_threads(pid, "maps", proc)
    except (FileNotFoundError, ProcessLookupError):
        return b""
    except OSError:
        return None


def _maps_pattern(keys):
    """One regex for every device's b'MAJ:MIN INODE', anchored on those two columns of a maps
    line (address, perms, offset, then them): a mapped file whose NAME spells a device's
    identity must not count (any user can name a file so, and whoever
    maps it was called a GPU holder). A path cannot fake the start of a line: the kernel
    writes a newline in it as \\012. re caches the compiled pattern across processes."""
    alternatives = b"|".join(re.escape(k) for k in keys)
    return re.compile(rb"^[0-9a-f]+-[0-9a-f]+ \S+ [0-9a-f]+ (" + alternatives + rb")(?= |$)", re.M)


def write_files(pid, proc=PROC):
    """Regular files this process writes in place (fdinfo flags), e.g. a checkpoint: what a stop
    may leave incomplete. Not its stdout/stderr (fd 1, 2) nor files opened for appending:
    those are its logs (`> server.log`, a phase's log, a logging handler), and a log that
    loses its last line loses no data. (Limit: a job that writes its data to stdout is not
    listed.)"""
    out: list = []
    fd_dir = "%s/%d/fd" % (proc, pid)
    try:
        fds = os.listdir(fd_dir)
    except OSError:
        return out
    for fd in fds:
        if fd in ("1", "2"):
            continue
        try:
            target = textsafe.clean(os.readlink("%s/%s" % (fd_dir, fd)))  # a name's non-UTF-8 bytes: U+EF80+
            if not target.startswith("/") or target.startswith(_NOT_FILES):
                continue
            info = _read("%s/%d/fdinfo/%s" % (proc, pid, fd), "r")
        except OSError:
            continue
        for line in info.splitlines():
            if line.startswith("flags:"):
                flags = int(line.split()[1], 8)
                if flags & O_ACCMODE and not flags & O_APPEND:
                    out.append(target.replace(" (deleted)", ""))
                break
    return sorted(set(out))


def real_devices(paths):
    """True when every path is a character device (a real GPU node, not a sandbox file)."""
    try:
        return bool(paths) and all(stat.S_ISCHR(os.stat(p).st_mode) for p in paths)
    except OSError:
        return False


def all_pids(proc=PROC):
    return sorted(int(n) for n in os.listdir(proc) if n.isdigit())


def listing(proc=PROC):
    """The pids in `proc`, as the directory is read (in pid order on /proc): the scan's workers
    begin reading records while the rest is listed (fanout.map_stream)."""
    with os.scandir(proc) as entries:
        for entry in entries:
            if entry.name.isdigit():
                yield int(entry.name)


class Kin:
    """Every process's parent and start time as the scan's first stage read them, kept as each
    part of it sent them, {ppid: [pid, start, pid, start, ...]} (20,000 rows as tuples cost
    the early batch ~15 ms to send, load and index); merged on the first look."""

    def __init__(self, parts):
        self.parts = parts
        self.merged = None

    @classmethod
    def of_rows(cls, rows):
        """From (pid, ppid, start_time) rows."""
        part: dict = {}
        for pid, ppid, start in rows:
            part.setdefault(ppid, []).extend((pid, start))
        return cls([part])

    def children(self, ppid):
        """[(pid, start_time)] of the processes whose parent is ppid."""
        if self.merged is None:
            self.merged = {}
            for part in self.parts:
                for parent, flat in part.items():
                    self.merged.setdefault(parent, []).extend(flat)
        flat = self.merged.get(ppid, ())
        return list(zip(flat[::2], flat[1::2]))


def clock_ticks():
    return os.sysconf("SC_CLK_TCK")


def uptime_s(proc=PROC):
    return float(_read("%s/uptime" % proc, "r").split()[0])


_USER_NAMES: dict = {}  # uid -> name, for the life of the agent process (one run: the passwd file does not change)


def user_name(uid):
    if uid not in _USER_NAMES:
        try:
            _USER_NAMES[uid] = pwd.getpwuid(uid).pw_name
        except (KeyError, OverflowError, TypeError, ValueError):
            _USER_NAMES[uid] = str(uid)
    return _USER_NAMES[uid]


def snapshot(devset, proc=PROC, fds=True, mark=None, early=None, known=None):
    """Every process (basic fields) and which of them hold a GPU device (devices.DeviceSet).

    Returns {'procs': {pid: info}, 'holders': {pid: [devices]}, 'denied': [pids],
    'devices': [paths]}. 'denied' lists processes whose fds could not be read (kernel
    threads, which have none, excepted). On a host of many processes the pids are scanned by
    one worker per core (fanout.py); a device opened under another name by a process of one
    worker and mapped by a process of another is then matched once the parts are merged.
    `fds` False: the records only, no fd table or maps read (scan.collect's confirm=True).
    `mark(info)`: its answer is kept in each record as info["mark"], worked out where the
    record is read (in the workers: the plan's target patterns, tried on every process).

    The whole account: docs/design-notes.md (scripts/agent/procs/procscan.py: `snapshot`)."""
    keys = devset.inode_keys()
    paths = devset.paths
    if not fds:
        devset = None
    read: dict = {}  # a share's records read in the first stage (in the worker that read them)

    def first(share):
        marked: list = []
        kin: dict = {}
        for pid in share:
            info = read[pid] = _record(pid, proc, mark, lean=True)
            if info is not None:
                kin.setdefault(info["ppid"], []).extend((pid, info["start_time"]))
                if info.get("mark"):
                    marked.append(info)
        return marked, kin

    def on_first(answers):
        early([info for marked, _ in answers for info in marked], Kin([kin for _, kin in answers]))

    parts, workers = _fan_out(lambda piece: _scan_part(piece, devset, proc, keys, mark, read, known), proc,
                              first if early is not None else None, on_first, known)
    procs, holders, denied, mapped, links = {}, {}, [], {}, dict(keys)
    for part in parts:
        procs.update(part["procs"])
        for pid in part["same"]:
            procs[pid] = known[pid]
        holders.update(part["holders"])
        denied.extend(part["denied"])
        mapped.update(part["mapped"])
        links.update(part["links"])
    if len(parts) > 1 and len(links) > len(keys):  # another name's identity one part learnt: every part's maps again
        _map_pass(procs, set(denied), {_needle(k): name for k, name in links.items()}, proc, holders, denied, mapped)
    return {"procs": procs, "holders": holders, "denied": sorted(set(denied)), "devices": list(paths),
            "mapped": mapped, "hidden": proc_hidden(proc), "workers": workers}


SHARDED_FROM = 2000  # processes: below this, listing /proc here costs ~3 ms (fanout.map_stream)
SHARDS_PER_WORKER = 8  # shards a sharded scan's queue holds for each worker: a late or slow one takes fewer


def _fan_out(func, proc, first, on_first, known):
    """fanout's answer over every pid in `proc`. On a host of SHARDED_FROM processes or more
    where /proc can be listed from any pid (pidrange.py), each worker lists its own share
    (fanout.map_shards: the listing is no longer this process's alone); else the pids are
    listed here and handed out (fanout.map_stream). The count: the plan's (`known`), else the
    kernel's count of tasks (threads too: one read) and, past it, pidrange's estimate."""
    if proc != PROC:
        return fanout.map_stream(func, listing(proc), lambda n: 1, first=first, on_first=on_first)
    count = len(known) if known else pidrange.threads_on_host(proc) or 0
    lister = pidrange.open_lister(proc) if count >= SHARDED_FROM else None
    try:
        if lister is not None and not known:
            count = min(count, pidrange.estimate(lister))
    except OSError:
        count = 0
    if lister is None or count < SHARDED_FROM:
        if lister is not None:
            lister.close()
        return fanout.map_stream(func, listing(proc), fanout.workers_for, first=first, on_first=on_first)
    try:
        workers = fanout.workers_for(count)
        return fanout.map_shards(func, lambda k, n: pidrange.shard_list(lister, k, n, lambda: listing(proc)),
                                 SHARDS_PER_WORKER * workers, workers, first=first, on_first=on_first)
    finally:
        lister.close()


def record_of(pid, mark=None, proc=PROC):
    """One process's whole record as the scan reads it (with `mark`'s answer), None when gone."""
    return _record(pid, proc, mark)


def _record(pid, proc, mark, lean=False):
    """basic() with the mark, or not_understood()'s record: never raises. `lean`: a record
    the mark does not name is left lean (complete() reads the rest)."""
    try:
        info = basic(pid, proc, lean)
        if info is not None and mark is not None:
            info["mark"] = mark(info)
        if info is not None and lean and info.get("mark"):
            info = complete(info, proc)
    except Exception as exc:  # data no parser here understands: not inspected, never a crash
        info = not_understood(pid, exc)
    return info


# What a confirming scan compares with the plan's record of a process (snapshot's `known`):
# the same process (start time), program name, parent, group and session, and the same task
# flags (no exit begun). Its state and thread count stay as the plan read them: nothing reads
# them of a process that was there before the teardown (settle and targets skip those by start
# time), and its fds are read with the thread count just read.
_SAME_FIELDS = ("start_time", "comm", "ppid", "pgid", "sid", "flags", "arg_start")  # arg_start: an exec moves it


def _same_as_known(pid, proc, known, mark):
    """(record, threads, same) for a pid `known` has: its known record while still the same
    (one read: its stat), else the record read whole; (None, 0, False) when it is gone."""
    try:
        stat = procfs.read_stat(pid, proc)
    except Exception as exc:  # data no parser here understands: as _record does
        return not_understood(pid, exc), 1, False
    if stat is None:
        return None, 0, False
    old = known[pid]
    if all(stat[k] == old.get(k) for k in _SAME_FIELDS) and not procfs.finished(stat):
        return old, stat["threads"], True
    info = _record(pid, proc, mark)
    return info, (info or {}).get("threads", 1), False


def _scan_part(pids, devset, proc, keys, mark=None, read=None, known=None):
    """The scan of some pids: their records (those `read` has already, as read then; those
    `known` has and still the same, as known), the devices their fds hold, then their maps.
    The records taken from `known` are not sent back: "same" lists their pids."""
    procs, holders, denied, links, same = {}, {}, [], dict(keys), []
    read = read or {}
    for pid in pids:
        threads = None
        if known is not None and pid in known and pid not in read:
            info, threads, unchanged = _same_as_known(pid, proc, known, mark)
            if unchanged:
                same.append(pid)
        else:
            info = read[pid] if pid in read else _record(pid, proc, mark)
        if info is not None and "uid" not in info:  # read lean before the first signal
            try:
                done = complete(info, proc)
            except Exception as exc:
                done = not_understood(pid, exc)
            if done is None:  # gone since its lean read (a wrapper that ended with its server)
                info["uid"] = GONE_UID  # kept as read: its parent still links a target to whatever started it
                procs[pid] = info
                continue
            info = done
        if info is None:
            continue
        procs[pid] = info
        if info.get("unreadable"):  # its command line could not be read: it may be anything
            denied.append(pid)
            continue
        if not devset or info["flags"] & PF_KTHREAD:
            continue
        try:
            held, problem = held_devices(pid, devset, info["threads"] if threads is None else threads, proc, links)
        except Exception as exc:
            held, problem = [], "its open files could not be understood (%s)" % type(exc).__name__
        if problem:
            denied.append(pid)
        elif held:
            holders[pid] = held
    mapped: dict = {}
    if devset:
        _map_pass(procs, set(denied), {_needle(k): name for k, name in links.items()}, proc, holders, denied, mapped)
    if same:
        kept = set(same)
        procs = {pid: info for pid, info in procs.items() if pid not in kept}
    return {"procs": procs, "holders": holders, "denied": denied, "mapped": mapped, "same": same,
            "links": {k: v for k, v in links.items() if k not in keys}}


def _map_pass(procs, unreadable, needles, proc, holders, denied, mapped):
    """Mappings: a holder may have closed its fd after mmap. Adds to holders, denied, mapped."""
    if not needles:
        return
    for pid, info in procs.items():
        if info["flags"] & PF_KTHREAD or pid in unreadable:
            continue
        try:
            names = mapped_by_identity(pid, needles, proc)
        except Exception:  # maps text no parser here understands: not inspected
            names = None
        if names is None:
            if pid not in denied:
                denied.append(pid)
        elif names:
            mapped[pid] = names
            holders[pid] = sorted(set(holders.get(pid, [])) | set(names))


def not_understood(pid, exc):
    """The record of a process whose /proc data made a parser fail: counted as not inspected
    (exit 6: it may hold a GPU, so nothing is called free), never the end of the scan. One
    process of any user must not be able to stop root's teardown."""
    try:
        uid = os.stat("%s/%d" % (PROC, pid)).st_uid
    except OSError:
        uid = -1
    return {"pid": pid, "comm": "?", "state": "?", "ppid": 0, "pgid": 0, "sid": 0, "flags": 0, "threads": 1,
            "start_time": 0, "argv": [], "cmdline": "[pid %d: not understood]" % pid, "uid": uid,
            "unreadable": "its /proc data could not be understood (%s)" % type(exc).__name__}


def proc_hidden(proc=PROC):
    """Why /proc does not show every process to us (mounted hidepid= or subset=pid, and we
    are not root), or None. Then a holder may be invisible: nothing may be called free."""
    if os.geteuid() == 0:
        return None
    try:
        with open("%s/self/mountinfo" % proc, errors="surrogateescape") as f:  # a user's FUSE mount: any bytes
            for line in f:
                left, _, right = line.partition(" - ")
                fields = left.split()
                if len(fields) > 4 and fields[4] == proc and right.split()[:1] == ["proc"]:
                    opts = right.split()[-1].split(",")
                    hide = [o for o in opts if (o.startswith("hidepid=") and o not in ("hidepid=0", "hidepid=off"))
                            or o == "subset=pid"]
                    if hide:
                        return "%s is mounted with %s: other users' processes are invisible" % (proc, ",".join(hide))
    except OSError:
        return None
    return None


def detail(info, held, proc=PROC, now_ticks=None, mapped=None):
    """The full per-process record shown to users: add user, age, unit/container, writes;
    "gone": True when the process exited (or its pid was reused) before they were read."""
    pid = info["pid"]
    cg = cgroup.read(pid, proc)
    out = dict(info)
    out.pop("mark", None)  # the scan's own note (snapshot's mark), not part of the record
    out["user"] = user_name(info["uid"])
    out["devices"] = held
    out["unit"] = cg["unit"]
    out["container"] = cgroup.with_pids(cg["container"], pid, proc)
    out["write_files"] = write_files(pid, proc)
    out["mapped_devices"] = list(mapped or [])
    if now_ticks is not None:
        out["age_s"] = max(0.0, (now_ticks - info["start_time"]) / clock_ticks())
    if not _still_there(info, proc):
        # exited since the scan read it (a loop's `sleep 1`): what was read after is nobody's
        # (no cgroup: it would pass for a bare process outside its container and be signalled)
        out["gone"] = True
    return out


def _still_there(info, proc=PROC):
    """False only when the process is seen gone (or its pid reused). A record no parser
    understood (start time unknown) and a stat this agent may not read (hidepid=noaccess, not
    root) cannot tell: still there."""
    if info.get("unreadable") is not None:
        return True
    try:
        return procfs.same_process(info["pid"], info["start_time"], proc)
    except Exception:  # refused, or data no parser here understands
        return True


def children_map(procs):
    kids: dict = {}  # ppid -> [pid]
    for pid, info in procs.items():
        kids.setdefault(info["ppid"], []).append(pid)
    return kids


def descendants(pid, kids):
    """Every pid below `pid` in a children_map, each once."""
    out: set = set()
    stack = [pid]
    while stack:
        for child in kids.get(stack.pop(), ()):
            if child not in out and child != pid:
                out.add(child)
                stack.append(child)
    return out


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
