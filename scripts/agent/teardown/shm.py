"""Shared memory the stopped targets left behind: /dev/shm files and System V segments.

Why: a SIGKILLed NCCL rank never unlinks its /dev/shm/nccl-* segments; they pile up until the
next init fails with "No space left on device" (NCCL #290/#525, llm-d #352). A leftover is
only what a target itself held: a file it had open or mapped (read from its fds and maps
before its signal: once it is gone nothing says what it held), owned by its uid, changed
since it started (weights staged before the server started stay), that no live process
holds when it is removed (unlinking a live rank's file crashes it: OLMo #151); and a System
V segment a target created (or attached last) with no attachment left. Only regular files
on the /dev/shm tmpfs, by a path with no link in it, unlinked through a directory fd.
Limits: a process that opens a file between the last check and the unlink loses it; a
process of another PID or IPC namespace is not seen.
"""
import os
import stat
import struct
import time

SHM = "/dev/shm"
IPC_RMID = 0
AT_FDCWD, AT_SYMLINK_NOFOLLOW, STATX_INO, STATX_BTIME = -100, 0x100, 0x100, 0x800


def _shm_dev():
    """The st_dev of /dev/shm when a tmpfs is mounted there, else None (nothing is touched)."""
    try:
        with open("/proc/self/mountinfo") as f:
            mounted = any(len(p) > 4 and p[4] == SHM and p[p.index("-") + 1] == "tmpfs"
                          for p in (line.split() for line in f) if "-" in p)
        return os.lstat(SHM).st_dev if mounted else None
    except (OSError, ValueError):
        return None


def _start_wall(start_ticks):
    """The wall time a process started, from its start time in clock ticks since boot."""
    boot = time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)
    return boot + start_ticks / float(os.sysconf("SC_CLK_TCK"))


def _start_margin():
    """Seconds after a target's recorded start before a change counts as its own: /proc gives
    the start truncated to a clock tick, so a file written in the same tick just before the
    process began (weights staged by the launch script) would read as changed after it. One
    tick, and 5 ms for the coarse clock file times are stamped with."""
    return 1.0 / os.sysconf("SC_CLK_TCK") + 0.005


def _held_by(pid):
    """{(dev, inode): path} of the /dev/shm files process `pid` has open or mapped."""
    out = {}
    fd_dir = "/proc/%d/fd" % pid
    try:
        fds = os.listdir(fd_dir)
    except OSError:
        fds = []
    for fd in fds:
        try:
            link = os.readlink("%s/%s" % (fd_dir, fd))
            if link.startswith(SHM + "/") and not link.endswith(" (deleted)"):
                st = os.stat("%s/%s" % (fd_dir, fd))  # the open file itself, not what the name says now
                out[(st.st_dev, st.st_ino)] = link
        except OSError:
            continue
    try:
        with open("/proc/%d/maps" % pid, "rb") as f:
            for line in f:
                if b" " + SHM.encode() + b"/" not in line or line.endswith(b" (deleted)\n"):
                    continue
                parts = line.split(None, 5)
                major, minor = parts[3].split(b":")
                out.setdefault((os.makedev(int(major, 16), int(minor, 16)), int(parts[4])),
                               parts[5].rstrip(b"\n").decode("utf-8", "surrogateescape"))
    except (OSError, ValueError, IndexError):
        pass
    return out


def candidates(targets):
    """The /dev/shm files the targets (rows with pid, start_time, uid) hold that may be leftovers,
    read now, before their signal: [{path, dev, ino, uid, bytes, pid, start_time}]."""
    dev = _shm_dev()
    out: list = []
    seen: set = set()
    if dev is None:
        return out
    for t in targets:
        uid = t["uid"]
        since = _start_wall(t["start_time"]) + _start_margin()  # the start time is whole clock ticks
        for (fdev, ino), path in sorted(_held_by(t["pid"]).items()):
            row = _file_row(path, fdev, ino, uid, since, dev)
            if row is not None and (fdev, ino) not in seen:
                seen.add((fdev, ino))
                out.append(dict(row, pid=t["pid"], start_time=t["start_time"]))
    return out


def gather(targets):
    """(candidates, owners) of the targets (rows with pid, start_time), read before their
    signal: the /dev/shm files and System V segments that may be left behind, and each
    target's (pid, start_time, uid), which a segment's creator or last user is compared with
    after the verdict."""
    owners = []
    for t in targets:
        try:
            uid = os.stat("/proc/%d" % t["pid"]).st_uid
        except OSError:
            continue
        owners.append({"pid": t["pid"], "start_time": t["start_time"], "uid": uid})
    return candidates(owners) + sysv_candidates(owners), owners


def merge(first, later):
    """Candidates or owners of two reads, each once (the early batch's and the plan's)."""
    have = {_key(r) for r in first}
    return first + [r for r in later if _key(r) not in have]


def _key(row):
    if "kind" in row:
        return row["kind"], row.get("dev"), row.get("ino"), row.get("shmid")
    return row["pid"], row["start_time"]


def _file_row(path, fdev, ino, uid, since, dev):
    """The file as a candidate, or None: not on the tmpfs, a link on its way, another uid's,
    or not changed since the target started (staged before it)."""
    if fdev != dev or os.path.realpath(path) != path:
        return None
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != (fdev, ino) or st.st_uid != uid \
            or _born(path, ino, st.st_ctime) < since:
        return None
    return {"kind": "file", "path": path, "dev": fdev, "ino": ino, "uid": uid, "bytes": st.st_blocks * 512}


def _born(path, ino, ctime):
    """When the file was made (statx's birth time, which tmpfs keeps); its change time where
    none is read: a file staged before the target and written since by another process reads
    as new by its change time alone."""
    import ctypes  # here: only a file that may be a leftover pays for it

    libc = ctypes.CDLL(None, use_errno=True)
    buf = ctypes.create_string_buffer(256)
    if getattr(libc, "statx", None) is None or libc.statx(
            AT_FDCWD, os.fsencode(path), AT_SYMLINK_NOFOLLOW, STATX_BTIME | STATX_INO, buf) != 0:
        return ctime
    mask, = struct.unpack_from("I", buf.raw, 0)
    got_ino, = struct.unpack_from("Q", buf.raw, 32)
    sec, nsec = struct.unpack_from("qI", buf.raw, 80)
    return sec + nsec / 1e9 if mask & STATX_BTIME and got_ino == ino else ctime


def sysv_segments():
    """/proc/sysvipc/shm as dicts of ints (its header names the keys), [] where unreadable."""
    try:
        with open("/proc/sysvipc/shm") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    names = lines[0].split() if lines else []
    out = []
    for line in lines[1:]:
        try:
            out.append(dict(zip(names, map(int, line.split()))))
        except ValueError:
            continue
    return out


def sysv_candidates(targets, segments=None):
    """The System V segments a target (pid, start_time, uid) created, or attached or detached
    last, since it started, owned by its uid: [{kind, shmid, key, bytes, uid, pid, nattch}]."""
    out: list = []
    segments = sysv_segments() if segments is None and targets else segments or []
    for t in targets:
        since = _start_wall(t["start_time"])
        for seg in segments:
            ours = (seg.get("cpid") == t["pid"] and seg.get("ctime", 0) >= int(since)) or (
                seg.get("lpid") == t["pid"] and max(seg.get("atime", 0), seg.get("dtime", 0)) >= int(since))
            if ours and seg.get("uid") == t.get("uid") and all(s["shmid"] != seg["shmid"] for s in out):
                out.append({"kind": "sysv", "shmid": seg["shmid"], "key": seg.get("key"), "uid": seg["uid"],
                            "bytes": seg.get("rss", seg.get("size", 0)), "pid": t["pid"],
                            "nattch": seg.get("nattch")})
    return out


def _live_holds():
    """(dev, inode) of every /dev/shm file any process has open or mapped now."""
    held = set()
    for name in os.listdir("/proc"):
        if name.isdigit():
            held.update(_held_by(int(name)))
    return held


def _unlink(path, dev, ino, uid):
    """Unlink the regular file `path` under /dev/shm, opening each directory on its way
    without following a link, only while it is still that file of that uid. Returns None, or
    why not."""
    parts = os.path.relpath(path, SHM).split("/")
    if parts[0] in ("..", ".") or not path.startswith(SHM + "/"):
        return "not under %s" % SHM
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
    fd = os.open(SHM, flags)
    try:
        for part in parts[:-1]:
            sub = os.open(part, flags, dir_fd=fd)
            os.close(fd)
            fd = sub
        st = os.stat(parts[-1], dir_fd=fd, follow_symlinks=False)
        if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != (dev, ino) or st.st_uid != uid:
            return "no longer the file the target held"
        os.unlink(parts[-1], dir_fd=fd)
        return None
    finally:
        os.close(fd)


def _shmctl_rmid(shmid):
    import ctypes  # here: only a teardown that found a segment pays for it

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.shmctl(ctypes.c_int(shmid), IPC_RMID, None) != 0:
        return os.strerror(ctypes.get_errno())
    return None


def remove(files, targets, audit):
    """After FREED: remove each leftover that is still one (no live process holds it, nattch
    0), each logged in the audit log. `files`: candidates(); `targets`: (pid, start_time, uid)
    rows of every stopped target. Returns [{kind, path or shmid, bytes, pid, removed, why}]."""
    out = []
    held = _live_holds() if files else set()
    for c in files:
        why = "held by a live process" if (c["dev"], c["ino"]) in held else None
        if why is None:
            try:
                why = _unlink(c["path"], c["dev"], c["ino"], c["uid"])
            except OSError as exc:
                why = exc.strerror or str(exc)
        out.append(dict(c, removed=why is None, why=why or "left by the stopped target"))
    for seg in sysv_candidates(targets):
        why = "attached %d time(s)" % seg["nattch"] if seg["nattch"] else _shmctl_rmid(seg["shmid"])
        out.append(dict(seg, removed=why is None, why=why or "left by the stopped target"))
    for r in out:
        what = r["path"] if r["kind"] == "file" else "System V segment %d" % r["shmid"]
        audit.log({"pid": r["pid"], "start_time": r.get("start_time")}, "remove %s (%d bytes)" % (what, r["bytes"]),
                  "removed" if r["removed"] else "kept: " + r["why"], shm=r["kind"])
    return out
