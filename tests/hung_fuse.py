"""A FUSE filesystem that stops answering: what a dead NFS server or a hung FUSE daemon looks
like to a process scan. Speaks the raw /dev/fuse protocol (no libfuse needed): it serves one
file, `f`, until that file is opened, and from then on answers nothing, so any stat() of it
waits until this process exits (which aborts the connection and frees every waiter).

  python3 tests/hung_fuse.py MOUNTPOINT READYFILE   (root, /dev/fuse)
READYFILE gets "mounted", then "opened" once `f` is opened.
"""
import ctypes
import errno
import os
import stat
import struct
import sys

FUSE_LOOKUP, FUSE_GETATTR, FUSE_OPEN, FUSE_INIT = 1, 3, 14, 26


def attr(ino):
    mode = (stat.S_IFDIR | 0o755) if ino == 1 else (stat.S_IFREG | 0o644)
    # ino, size, blocks, atime, mtime, ctime, atimensec, mtimensec, ctimensec, mode, nlink, uid, gid, rdev,
    # blksize, padding
    return struct.pack("<QQQQQQIIIIIIIIII", ino, 0, 0, 0, 0, 0, 0, 0, 0, mode, 1, 0, 0, 0, 4096, 0)


def main():
    mountpoint, ready = sys.argv[1], sys.argv[2]
    fd = os.open("/dev/fuse", os.O_RDWR)
    libc = ctypes.CDLL(None, use_errno=True)
    opts = ("fd=%d,rootmode=40000,user_id=0,group_id=0,allow_other" % fd).encode()
    if libc.mount(b"gp-hung-fuse", mountpoint.encode(), b"fuse", 0, opts) != 0:
        sys.exit("mount failed: %s" % os.strerror(ctypes.get_errno()))

    def reply(unique, err=0, body=b""):
        os.write(fd, struct.pack("<IiQ", 16 + len(body), -err, unique) + body)

    with open(ready, "w") as f:
        f.write("mounted")
    hung = False
    while True:
        try:
            req = os.read(fd, 1 << 20)
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.EINTR):
                continue
            return
        _, op, unique, node = struct.unpack_from("<IIQQ", req)
        if hung:
            continue  # the server is gone as far as anyone waiting can tell
        if op == FUSE_INIT:
            _, minor = struct.unpack_from("<II", req, 40)
            reply(unique, 0, struct.pack("<IIIIHHIIHHI", 7, min(minor, 31), 0, 0, 0, 0, 4096, 1, 0, 0, 0) + bytes(28))
        elif op == FUSE_LOOKUP:
            if req[40:].split(b"\0")[0] == b"f":
                reply(unique, 0, struct.pack("<QQQQII", 2, 0, 0, 0, 0, 0) + attr(2))
            else:
                reply(unique, errno.ENOENT)
        elif op == FUSE_GETATTR:
            reply(unique, 0, struct.pack("<QII", 0, 0, 0) + attr(node))
        elif op == FUSE_OPEN:
            reply(unique, 0, struct.pack("<QII", 0, 0, 0))
            hung = True
            with open(ready, "w") as f:
                f.write("opened")
        else:
            reply(unique, errno.ENOSYS)


if __name__ == "__main__":
    main()
