"""Which open files are GPU devices: by device identity, never by the text of a path.

Why: an fd's link text is only a name. A hard link or bind mount of /dev/nvidia0, or a
node deleted and recreated (`/dev/nvidia0 (deleted)`), is the same device under another
name, and a holder found by comparing link text with "/dev/nvidia0" goes unseen while
"FREED" is printed. So an open file is a GPU device when `stat()` says it is a character
device whose major number belongs to the NVIDIA driver (`/proc/devices`: nvidia,
nvidia-frontend, nvidia-uvm, nvidia-caps, nvidia-nvlink, ...), or, when the host's device
glob narrows the set (e.g. `/dev/nvidia[01]`), one of the (major, minor) pairs of the
files it names.

Fake devices (the sandbox, tests) are plain files, recognised by (st_dev, st_ino) and
allowed only where the caller says so (`--fake-devices`); elsewhere a glob that names
anything but NVIDIA character devices (`/dev/*` reaching `/dev/loop0`) is refused.
"""
from __future__ import annotations

import glob
import os
import stat

from ..wire import defaults

PROC = "/proc"


class DeviceError(ValueError):
    """The device glob names something that is not a GPU device: one line for the user."""


class GpuSource:
    """Where one run reads its GPUs: the device glob (`devices`; plain files allowed with
    `fake_devices`) and, in the sandbox, the fake GPU memory's directory (`fake_gpus`). Frozen,
    with the DeviceSet found once per run (device_set)."""

    __slots__ = ("devices", "fake_devices", "fake_gpus", "_found")

    devices: str
    fake_devices: bool
    fake_gpus: str | None
    _found: list

    def __init__(self, devices=defaults.DEVICE_GLOB, fake_devices=False, fake_gpus=None):
        for name, value in (("devices", devices), ("fake_devices", bool(fake_devices)), ("fake_gpus", fake_gpus),
                            ("_found", [])):
            object.__setattr__(self, name, value)

    def __setattr__(self, name, value):
        raise AttributeError("GpuSource is frozen: %s" % name)

    def device_set(self):
        """The host's GPU devices (DeviceSet), found on first use. Raises DeviceError for a
        glob that names anything but GPU devices."""
        if not self._found:
            self._found.append(DeviceSet(self.devices, fake=self.fake_devices))
        return self._found[0]


def nvidia_majors(proc=PROC):
    """Major numbers of the NVIDIA driver's character devices, from /proc/devices."""
    majors = set()
    try:
        with open("%s/devices" % proc) as f:
            in_char = False
            for line in f:
                line = line.strip()
                if line.endswith("devices:"):
                    in_char = line.startswith("Character")
                    continue
                parts = line.split(None, 1)
                if in_char and len(parts) == 2 and parts[1].startswith("nvidia"):
                    majors.add(int(parts[0]))
    except (OSError, ValueError):
        pass
    return majors


def _expand(pattern):
    """The glob's matches; a directory (/dev/nvidia-caps) stands for the files in it."""
    out = []
    for path in sorted(glob.glob(pattern)):
        if os.path.isdir(path) and not os.path.islink(path):
            out.extend(sorted(os.path.join(path, n) for n in os.listdir(path)))
        else:
            out.append(path)
    return out


class DeviceSet:
    """The GPU devices a scan looks for, and how to recognise an open one."""

    def __init__(self, pattern=defaults.DEVICE_GLOB, fake=False, proc=PROC):
        self.pattern = pattern
        self.fake = fake
        self.paths = []          # the files the glob names (for reports and NVML-less hosts)
        self.rdevs = {}          # (major, minor) -> path
        self.inodes = {}         # (st_dev, st_ino) -> path, fake devices only
        self.majors = set()      # any device of these majors (the default glob: every GPU)
        majors = nvidia_majors(proc)
        for path in _expand(pattern):
            try:
                st = os.stat(path)
            except OSError:
                continue
            if stat.S_ISCHR(st.st_mode) and (fake or os.major(st.st_rdev) in majors):
                self.rdevs[(os.major(st.st_rdev), os.minor(st.st_rdev))] = path
            elif fake and stat.S_ISREG(st.st_mode):
                self.inodes[(st.st_dev, st.st_ino)] = path
            elif fake:
                raise DeviceError("device glob %r: %s is neither a plain file nor a character device" % (pattern, path))
            else:
                raise DeviceError("device glob %r: %s is not an NVIDIA character device (%s); only hosts with "
                                  "FAKE_DEVICES=yes may name other files" % (pattern, path, _kind(st, majors)))
            self.paths.append(path)
        if pattern == defaults.DEVICE_GLOB and not fake:
            self.majors = majors

    def inode_keys(self):
        """{(st_dev, st_ino): path} of the device files themselves, for matching mappings."""
        keys = {}
        for path in self.paths:
            try:
                st = os.stat(path)
            except OSError:
                continue
            keys[(st.st_dev, st.st_ino)] = path
        return keys

    def identify(self, st):
        """The device path an open file IS (by identity), or None."""
        if stat.S_ISCHR(st.st_mode):
            key = (os.major(st.st_rdev), os.minor(st.st_rdev))
            if key in self.rdevs:
                return self.rdevs[key]
            if key[0] in self.majors:
                return "/dev/char/%d:%d (NVIDIA)" % key
            return None
        if self.inodes and stat.S_ISREG(st.st_mode):
            return self.inodes.get((st.st_dev, st.st_ino))
        return None

    def __bool__(self):
        return bool(self.paths or self.majors)


def _kind(st, majors):
    if stat.S_ISCHR(st.st_mode):
        return "character device %d:%d; NVIDIA majors here: %s" % (
            os.major(st.st_rdev), os.minor(st.st_rdev), ", ".join(map(str, sorted(majors))) or "none")
    if stat.S_ISBLK(st.st_mode):
        return "a block device"
    if stat.S_ISREG(st.st_mode):
        return "a plain file"
    return "mode %o" % stat.S_IFMT(st.st_mode)
