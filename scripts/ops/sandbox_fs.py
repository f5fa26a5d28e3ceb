"""How the sandbox writes in its directory: no link followed, no file trusted that was there.

Why: the sandbox directory (scripts/config/sandbox.py: private, created 0700 or checked) is
where root may write a state.json, the fake GPU files and the one script the sandbox
executes. Every file is written O_NOFOLLOW (a link there is refused); the one script the
sandbox executes is created O_EXCL.
"""
from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from ..agent.state import statedir
from ..config.sandbox import private

StateFileError = statedir.StateFileError


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
