"""The sandbox's shared memory: a staged "weights" file in /dev/shm and NCCL-like segments.

Why: the main job on the sandbox should show what a real pivot does with shared memory:
a segment each worker made (like NCCL's /dev/shm/nccl-*) is a leftover the teardown
removes once FREED, while weights staged before the server started, and mapped by it,
stay (agent/teardown/shm.py). Every name carries this sandbox's tag (from its private
directory), so two sandboxes never share a file and `sandbox down` removes only its own:
regular files of this uid, unlinked through a directory fd, never through a link.
"""
from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

SHM = "/dev/shm"
STAGED_BYTES = 4 << 20  # the sandbox's "weights": small, so the demo never fills /dev/shm


def tag(base: Path) -> str:
    """gpu-pivot-sandbox-<8 hex of the sandbox dir>: this sandbox's prefix in /dev/shm."""
    return "gpu-pivot-sandbox-" + hashlib.sha256(str(base).encode()).hexdigest()[:8]


def available() -> bool:
    return os.path.isdir(SHM) and not os.path.islink(SHM) and os.access(SHM, os.W_OK | os.X_OK)


def stage_weights(base: Path) -> str | None:
    """Create <tag>-weights (O_EXCL, 0600) before the server starts; its path, or None when
    there is no writable /dev/shm or another user holds the name (then none is staged)."""
    if not available():
        return None
    remove_ours(base)  # a file of an earlier run: ours, so replaced
    path = os.path.join(SHM, tag(base) + "-weights")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError:  # another user's file (or link) took the name: never used; the demo stages none
        return None
    try:
        os.write(fd, b"\x00SANDBOX-WEIGHTS" * (STAGED_BYTES // 16))  # written: real pages, as weights are
    finally:
        os.close(fd)
    return path


def remove_ours(base: Path) -> list:
    """Unlink this sandbox's files in /dev/shm (name has its tag, regular, this uid), through a
    directory fd without following a link; returns the names removed."""
    prefix, removed = tag(base) + "-", list[str]()
    try:
        dfd = os.open(SHM, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return removed
    try:
        for name in os.listdir(dfd):
            if not name.startswith(prefix):
                continue
            try:
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                if stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid():
                    os.unlink(name, dir_fd=dfd)
                    removed.append(name)
            except FileNotFoundError:
                pass
    finally:
        os.close(dfd)
    return removed
