"""Where the sandbox lives, and how it writes there: one private directory, no links followed.

Why: a path such as /tmp/gpu-pivot-sandbox-UID is one any local user can create first, and a
squatted directory makes root signal a PID from a planted state.json, write through a
planted symlink and execute a planted binary. So the directory is in
the user's private runtime dir (root: /run/gpu-pivot/sandbox; others:
$XDG_RUNTIME_DIR/gpu-pivot/sandbox, else $XDG_STATE_HOME/gpu-pivot/sandbox), created
0700 or checked like every gpu-pivot state directory (scripts/agent/state/statedir.py): not a
symlink, owned by us, not writable by group or others; a directory that fails is refused
with one line naming it, never reused. $GPU_PIVOT_SANDBOX_DIR overrides the location: it
must be absolute (a relative one is refused, exit 2: it would make the sandbox inside whatever
directory a task runs from) and is checked the same way, and so is the directory it sits in
(its owner could otherwise swap ours for theirs after the check). Every file is written O_NOFOLLOW (a link there is
refused); the one script the sandbox executes is created O_EXCL.
"""
from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from ..agent.state import statedir

StateDirError = statedir.StateDirError
StateFileError = statedir.StateFileError

SANDBOX_DIR_ENV = "GPU_PIVOT_SANDBOX_DIR"


class SandboxDirError(StateDirError):
    """The sandbox directory (or a directory in it) is not ours to use. str() is one line."""

    what = "sandbox directory"


def sandbox_dir() -> Path:
    """The sandbox's path (nothing is created or checked here: `invoke hosts` reads it too)."""
    override = os.environ.get(SANDBOX_DIR_ENV)
    if override:
        if not os.path.isabs(override):  # relative: a sandbox in whatever directory a task runs from
            from ..config.errors import ConfigError, show

            raise ConfigError(f"{SANDBOX_DIR_ENV}={show(override)}: must be an absolute path (relative, it would "
                              f"put the sandbox in the directory a task runs from: {os.path.abspath(override)})")
        return Path(os.path.normpath(override))
    if os.geteuid() == 0:
        return Path(statedir.ROOT_RUN_DIR) / "sandbox"
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isabs(runtime) and statedir.is_private(runtime):
        return Path(runtime) / "gpu-pivot" / "sandbox"
    return Path(statedir.state_home()) / "gpu-pivot" / "sandbox"


def _refuse(exc: StateDirError) -> SandboxDirError:
    problem = exc.problem.replace(statedir.RUN_DIR_ENV, SANDBOX_DIR_ENV)
    return SandboxDirError(exc.path, problem)


def private(path: Path, parents: bool = False) -> Path:
    """`path` created 0700 or checked (statedir.private_dir); SandboxDirError names it if not."""
    try:
        return Path(statedir.private_dir(str(path), parents=parents))
    except StateDirError as exc:
        raise _refuse(exc) from None


def _check_parent(path: Path) -> None:
    """The nearest existing ancestor of an override must be ours or root's, and if others
    may write in it, sticky (like /tmp): else its owner could rename our directory away."""
    while not os.path.lexists(path) and path != path.parent:
        path = path.parent
    try:
        st = os.stat(path)
    except OSError as exc:
        raise SandboxDirError(str(path), "cannot inspect it: %s" % (exc.strerror or exc)) from None
    if st.st_uid not in (0, os.geteuid()):
        raise SandboxDirError(str(path), "the directory holding the sandbox is owned by uid %d, not by us or "
                                         "root; choose another place with %s" % (st.st_uid, SANDBOX_DIR_ENV))
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        raise SandboxDirError(str(path), "the directory holding the sandbox is writable by others and not "
                                         "sticky (mode %04o); choose another place with %s"
                                         % (stat.S_IMODE(st.st_mode), SANDBOX_DIR_ENV))


def checked_dir() -> Path:
    """The sandbox directory, created 0700 or checked; SandboxDirError (one line) if not ours."""
    base = sandbox_dir()
    if os.environ.get(SANDBOX_DIR_ENV):
        _check_parent(base.parent)
        return private(base, parents=True)
    private(base.parent, parents=True)  # .../gpu-pivot: the same checks as the agent's run dir
    return private(base)


def existing_dir() -> Path | None:
    """The sandbox directory checked as in checked_dir(), or None when there is none yet."""
    return checked_dir() if os.path.lexists(sandbox_dir()) else None


def subdir(base: Path, *parts: str) -> Path:
    """base/parts..., each level created 0700 or checked (never a link)."""
    path = base
    for part in parts:
        path = private(path / part)
    return path


def write(path: Path, data: str | bytes) -> None:
    """Create or overwrite a regular file of ours, 0600; a link or a foreign file there is refused."""
    raw = data.encode() if isinstance(data, str) else data
    fd = statedir.open_private(str(path), os.O_WRONLY | os.O_CREAT)
    try:
        os.ftruncate(fd, 0)
        view = memoryview(raw)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def read_json(path: Path):
    """The JSON in path, read through no link; None when there is no file."""
    try:
        return statedir.read_json(str(path))
    except FileNotFoundError:
        return None


def write_json(path: Path, doc) -> None:
    statedir.write_json_atomic(str(path), doc)


def write_script(path: Path, text: str) -> None:
    """An executable file made fresh (O_EXCL, 0700): never one that was already there."""
    try:
        os.unlink(path)  # a link or an old copy: removed, never followed
    except FileNotFoundError:
        pass
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o700)
    except OSError as exc:
        if exc.errno in (errno.EEXIST, errno.ELOOP):
            raise StateFileError(str(path), "appeared while it was being created; refusing to use it") from None
        raise
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def touch(path: Path) -> None:
    """Create path if absent (like `touch`, mode per umask) without following a link there."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o666)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise StateFileError(str(path), "is a symlink; refusing to follow it") from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise StateFileError(str(path), "is not a regular file; refusing to use it")
    finally:
        os.close(fd)
