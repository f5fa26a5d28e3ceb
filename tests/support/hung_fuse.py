"""A FUSE filesystem that stops answering: what a dead NFS server or a hung FUSE daemon looks
like to a process scan. Speaks the raw /dev/fuse protocol (no libfuse needed): it serves one
file, `f`, until that file is opened, and from then on answers nothing, so any stat() of it
waits until this process exits (which aborts the connection and frees every waiter).

  python3 tests/support/hung_fuse.py MOUNTPOINT READYFILE [--answer] [--owner UID]   (root, /dev/fuse)
READYFILE gets "mounted", then "opened" once `f` is opened (written before the open is
answered, so whoever sees the open return sees "opened"). --answer: keep answering (a live
server). --owner UID: mounted for that user without allow_other, as sshfs or gcsfuse mount
for a user: the kernel then refuses every other user, root included, at its getattr.
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


def say(ready, text):
    with open(ready + ".tmp", "w") as f:
        f.write(text)
    os.replace(ready + ".tmp", ready)


def main():
    mountpoint, ready = sys.argv[1], sys.argv[2]
    answer = "--answer" in sys.argv[3:]
    owner = int(sys.argv[sys.argv.index("--owner") + 1]) if "--owner" in sys.argv[3:] else None
    fd = os.open("/dev/fuse", os.O_RDWR)
    libc = ctypes.CDLL(None, use_errno=True)
    who = "user_id=0,group_id=0,allow_other" if owner is None else "user_id=%d,group_id=%d" % (owner, owner)
    opts = ("fd=%d,rootmode=40000,%s" % (fd, who)).encode()
    if libc.mount(b"gp-hung-fuse", mountpoint.encode(), b"fuse", 0, opts) != 0:
        sys.exit("mount failed: %s" % os.strerror(ctypes.get_errno()))

    def reply(unique, err=0, body=b""):
        os.write(fd, struct.pack("<IiQ", 16 + len(body), -err, unique) + body)

    say(ready, "mounted")
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
            say(ready, "opened")
            hung = not answer
            reply(unique, 0, struct.pack("<QII", 0, 0, 0))
        else:
            reply(unique, errno.ENOSYS)


if __name__ == "__main__":
    main()
