"""Directories and files for gpu-pivot's state that no other local user controls.

Why: a fixed path in /tmp or /run/lock is one any local user can create first. A planted
symlink there makes root truncate or append to a file of the attacker's choosing, and a
squatted directory feeds root a state file to act on. So every directory is created 0700 by us, or, when it
already exists, checked before use: not a symlink, a directory, owned by us, not
writable by group or others. A directory that fails is refused, never chmod-ed or
reused (it may be someone else's). Files in it are opened O_NOFOLLOW, created 0600,
checked to be regular files we own; whole-file writes go to an O_EXCL temp file and
os.replace, so a reader never sees half a file.

Standard library only, Python 3.8: this module ships inside the agent.
"""
import binascii
import errno
import json
import os
import stat

from ..procs import textsafe

RUN_DIR_ENV = "GPU_PIVOT_RUN_DIR"
ROOT_RUN_DIR = "/run/gpu-pivot"        # tmpfs: cleared at reboot, like the GPUs' state
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


class StateDirError(OSError):
    """A state directory (or file in it) gpu-pivot must not, or cannot, use. str() is one line."""

    what = "state directory"

    def __init__(self, path, problem):
        self.path = path
        self.problem = problem
        super().__init__("%s %s: %s" % (self.what, path, problem))

    def __str__(self):
        return self.args[0]


class StateFileError(StateDirError):
    """A file inside a state directory that is a symlink, or not a regular file of ours."""

    what = "state file"


# -- directories --------------------------------------------------------------------


def _problem_with_dir(st, euid, env=RUN_DIR_ENV):
    """Why a directory's lstat makes it unusable to us, or None."""
    if stat.S_ISLNK(st.st_mode):
        return "is a symlink; refusing to follow it"
    if not stat.S_ISDIR(st.st_mode):
        return "exists and is not a directory"
    if st.st_uid != euid:
        return "owned by uid %d, not by us (uid %d); refusing to use it (remove it or choose another " \
               "directory with %s)" % (st.st_uid, euid, env)
    if st.st_mode & 0o022:
        return "writable by group or others (mode %04o); refusing to use it (chmod 700 it or remove it)" \
               % stat.S_IMODE(st.st_mode)
    return None


def is_private(path):
    """True when `path` exists and passes the checks private_dir() makes (no creation)."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return _problem_with_dir(st, os.geteuid()) is None


def _ancestor_problem(path, euid):
    """Why a directory above a state directory lets another user move it away, or None.

    Every directory that holds it, up to /, must be ours or root's, and a directory others may
    write in must be sticky (like /tmp): its owner, or anyone who may write in it, could rename
    our directory aside and make a new one (a second holder of the host's lock, a state file
    read from theirs). Checked on the path as given (each component with lstat, so a symlink
    in it counts where it sits) and on where it resolves.
    """
    seen = set()
    for start in (os.path.dirname(path), os.path.dirname(os.path.realpath(path))):
        d = start
        while True:
            if d not in seen:
                seen.add(d)
                try:
                    st = os.lstat(d)
                except OSError:
                    st = None  # not there yet: made by us below, so ours
                if st is not None and not stat.S_ISLNK(st.st_mode):
                    if st.st_uid not in (0, euid):
                        return "%s, a directory above it, is owned by uid %d, not by us or root: its owner could " \
                               "move it away" % (d, st.st_uid)
                    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
                        return "%s, a directory above it, is writable by others and not sticky (mode %04o)" \
                               % (d, stat.S_IMODE(st.st_mode))
            parent = os.path.dirname(d)
            if parent == d:
                break
            d = parent
    return None


def private_dir(path, parents=False, env=RUN_DIR_ENV):
    """Create `path` 0700, or check the existing one; return it. Raises StateDirError.

    Only the last component is created (mkdir, not makedirs): a missing parent is an
    error, unless `parents` (our own XDG directories under $HOME), where each missing
    ancestor is created 0700 in turn. Every directory above it must be one no other user can
    move it out of (_ancestor_problem).
    """
    path = os.path.abspath(path)
    euid = os.geteuid()
    problem = _ancestor_problem(path, euid)
    if problem:
        raise StateDirError(path, problem + "; choose another directory with %s" % env)
    if parents:
        _make_parents(os.path.dirname(path))
    _mkdir_private(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | _CLOEXEC)
    except OSError:
        fd = None  # a symlink (ELOOP) or not a directory (ENOTDIR): lstat says which
    try:
        st = os.fstat(fd) if fd is not None else os.lstat(path)
    except OSError as exc:
        raise StateDirError(path, "cannot inspect it: %s" % (exc.strerror or exc)) from None
    finally:
        if fd is not None:
            os.close(fd)
    problem = _problem_with_dir(st, euid, env)
    if problem:
        raise StateDirError(path, problem)
    return path


def _make_parents(path):
    missing = []
    while path and not os.path.lexists(path):
        missing.append(path)
        path = os.path.dirname(path)
    for p in reversed(missing):
        _mkdir_private(p)


def _mkdir_private(path):
    """mkdir 0700; an existing entry is left for the caller to check (never chmod-ed)."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise StateDirError(path, "cannot create it: %s" % (exc.strerror or exc)) from None


def state_home():
    """$XDG_STATE_HOME, or ~/.local/state (an XDG value that is not absolute is ignored)."""
    base = os.environ.get("XDG_STATE_HOME")
    if not base or not os.path.isabs(base):
        base = os.path.join(os.path.expanduser("~"), ".local", "state")
    return base


def run_dir():
    """Where the agent keeps its lock, last.json, audit log and phase state on this host.

    $GPU_PIVOT_RUN_DIR (checked like any other) overrides; root: /run/gpu-pivot;
    others: $XDG_RUNTIME_DIR/gpu-pivot when that runtime dir is itself private, else
    $XDG_STATE_HOME/gpu-pivot/run (~/.local/state/gpu-pivot/run).
    """
    override = os.environ.get(RUN_DIR_ENV)
    if override:
        return private_dir(override)
    if os.geteuid() == 0:
        return private_dir(ROOT_RUN_DIR)
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isabs(runtime) and is_private(runtime):
        return private_dir(os.path.join(runtime, "gpu-pivot"))
    return private_dir(os.path.join(state_home(), "gpu-pivot", "run"), parents=True)


def probe_writable(path):
    """Create, fill, fsync and remove a temp file in `path`: raise StateDirError if any fails.

    4 KiB and an fsync, so a full disk shows here and not halfway through a teardown.
    """
    name = os.path.join(path, ".probe.%d.%s" % (os.getpid(), _token()))
    try:
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _CLOEXEC, 0o600)
    except OSError as exc:
        raise StateDirError(path, "not writable: %s" % (exc.strerror or exc)) from None
    try:
        _write_all(fd, b"\0" * 4096)
        os.fsync(fd)
    except OSError as exc:
        raise StateDirError(path, "not writable: %s" % (exc.strerror or exc)) from None
    finally:
        os.close(fd)
        try:
            os.unlink(name)
        except OSError:
            pass
    return path


# -- files --------------------------------------------------------------------------


def _token():
    return binascii.hexlify(os.urandom(6)).decode()


def _check_file(fd, path):
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise StateFileError(path, "is not a regular file; refusing to use it")
    if st.st_uid != os.geteuid():
        raise StateFileError(path, "owned by uid %d, not by us (uid %d); refusing to use it"
                             % (st.st_uid, os.geteuid()))
    return st


def open_private(path, flags):
    """os.open with O_NOFOLLOW (and 0600 when created); the result must be a regular file we own.

    O_NONBLOCK keeps a planted FIFO from hanging the open; it does nothing to a regular file.
    Never pass O_TRUNC for a lock: truncating is only done by whoever holds it.
    """
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | _CLOEXEC, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise StateFileError(path, "is a symlink; refusing to follow it") from None
        try:
            planted = not stat.S_ISREG(os.lstat(path).st_mode)  # e.g. a FIFO with no reader: ENXIO
        except OSError:
            planted = False
        if planted:
            raise StateFileError(path, "is not a regular file; refusing to use it") from None
        raise
    try:
        _check_file(fd, path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def write_atomic(path, data):
    """Replace `path` with `data` (bytes) in one step: O_EXCL temp file, fsync, os.replace.

    An existing `path` that is a symlink or not a regular file of ours is refused, not
    replaced: something planted it, and the operator should know.
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None:
        if stat.S_ISLNK(st.st_mode):
            raise StateFileError(path, "is a symlink; refusing to write through or over it")
        if not stat.S_ISREG(st.st_mode):
            raise StateFileError(path, "is not a regular file; refusing to replace it")
        if st.st_uid != os.geteuid():
            raise StateFileError(path, "owned by uid %d, not by us (uid %d); refusing to replace it"
                                 % (st.st_uid, os.geteuid()))
    d, base = os.path.split(path)
    tmp = os.path.join(d, ".%s.%d.%s.tmp" % (base, os.getpid(), _token()))
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _CLOEXEC, 0o600)
    try:
        try:
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_json_atomic(path, doc):
    write_atomic(path, textsafe.dumps(doc, sort_keys=True).encode())


def read_bytes(path, limit=64 * 1024 * 1024):
    """The file's bytes, read through open_private. FileNotFoundError when absent."""
    fd = open_private(path, os.O_RDONLY)
    try:
        chunks, size = [], 0
        while size < limit:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_json(path):
    return json.loads(read_bytes(path).decode("utf-8", "replace"))


def append_line(path, line):
    """Append one line in one write() (O_APPEND: lines of concurrent writers never mix). It
    always starts a line of its own: a file whose last line was torn (a writer killed, or the
    disk full, mid-write) gets that line closed first, or the new record would be glued to
    the torn one and both lost to every reader. Two writers that both see the torn
    tail leave an empty line between them, which readers skip."""
    if not line.endswith("\n"):
        line += "\n"
    fd = open_private(path, os.O_RDWR | os.O_APPEND | os.O_CREAT)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            line = "\n" + line
        _write_all(fd, line.encode())
    finally:
        os.close(fd)


def append_json(path, rec):
    append_line(path, textsafe.dumps(rec, sort_keys=True))
