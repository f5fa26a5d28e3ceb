"""stat() an open file through /proc/PID/fd/N without waiting on its filesystem's server.

Why: the holder scan stat()s every fd on the host to tell a GPU device node by identity (and
the protection rules stat() /proc/PID/exe to see who owns a program), and a plain stat() of
a file on a dead NFS server or a FUSE daemon that stopped answering waits
for ever (on a hard mount, in state D: not even SIGKILL ends it). One process with such a
file open would hang `invoke teardown` before its first signal, with the host lock held
(tests/support/hung_fuse.py makes one; psmisc's fuser 23.6 does not hang there). statx() with
AT_STATX_DONT_SYNC answers from the kernel's cached attributes instead of asking the server
(FUSE does, as tests/agent/procs/test_hung_mounts.py shows; so do NFS, 9p and Ceph), and asking for the
type, mode, owner and inode only (not size or times) keeps NFS from first writing back
dirty pages. The device number and the
file system's own device come with every statx() answer. Python 3.8 to 3.13 have no
os.statx: glibc's statx() (2.28+) through ctypes, else the raw syscall; where neither
exists, os.stat() (which can hang there). A call costs about what os.stat() costs (~1.6 us).
"""
import collections
import ctypes
import os
import struct

from . import libcall

AT_FDCWD = -100
AT_STATX_DONT_SYNC = 0x4000
STATX_TYPE, STATX_MODE, STATX_UID, STATX_INO = 0x1, 0x2, 0x8, 0x100
_SYSCALL_NR = {"x86_64": 332, "aarch64": 291, "ppc64le": 383, "s390x": 379}
_LAYOUT = struct.Struct("<I4xQ4xI4xH2xQ88x4I")  # mask, attributes, uid, mode, ino, rdev and dev (major, minor)

Stat = collections.namedtuple("Stat", "st_mode st_ino st_dev st_rdev st_uid")
_BUF = ctypes.create_string_buffer(256)  # one answer at a time: scans run on the agent's main thread
_MASK = STATX_TYPE | STATX_MODE | STATX_UID | STATX_INO


def _clear(buf):
    ctypes.memset(buf, 0, ctypes.sizeof(buf))
    return buf


_FN = [libcall.find("statx", _SYSCALL_NR)]  # found once, at import; None after ENOSYS (a kernel older than 4.11)


def stat_open_file(path, refused_ok=False):
    """(st_mode, st_ino, st_dev, st_rdev, st_uid) of the file `path` (a /proc/PID/fd/N or
    /proc/PID/exe link) refers to, from cached attributes; raises OSError as os.stat() would.

    `refused_ok`: when the file's own filesystem refuses root (a user's FUSE mount without
    allow_other, as sshfs or gcsfuse make one), answer with what the kernel still gives for an
    empty request (the filesystem's device; mode 0: no file type) instead of EACCES, which
    would read as "this process cannot be inspected" (exit 6 for root).
    A process whose fds /proc itself will not show still raises EACCES: the retry fails the
    same way, before any filesystem is asked."""
    fn = _FN[0]
    if fn is None:
        return os.stat(path)
    buf = _BUF
    name = path if type(path) is bytes else os.fsencode(path)  # a str would go as wchar_t*
    if fn(AT_FDCWD, name, AT_STATX_DONT_SYNC, _MASK, buf) != 0:
        err = ctypes.get_errno()
        if err == 38:  # ENOSYS: a kernel older than statx (4.11)
            _FN[0] = None
            return os.stat(path)
        if not (refused_ok and err == 13 and fn(AT_FDCWD, name, AT_STATX_DONT_SYNC, 0, _clear(buf)) == 0):
            raise OSError(err, os.strerror(err), path)
    _, _, uid, mode, ino, rdev_major, rdev_minor, dev_major, dev_minor = _LAYOUT.unpack_from(buf)
    return Stat(mode, ino, os.makedev(dev_major, dev_minor), os.makedev(rdev_major, rdev_minor), uid)
