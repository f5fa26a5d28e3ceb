"""A real docker daemon inside a real systemd host (systemd_host.py), for tests.

Why inside: dockerd run on the machine writes /etc/docker, /opt/containerd, /run/containerd
and leaves /docker cgroups behind; in the systemd host those are private tmpfs and its own
cgroup namespace. No bridge, no iptables, no ip forwarding (containers use --network none);
containerd's CRI plugin (it creates /etc/cni/net.d) and `opt` plugin are off; the overlay
module is not loaded by it (containerd's `modprobe overlay` is dropped). No registry is
reachable: the image is a busybox-static rootfs tarball, `docker import`ed (under a second).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
from pathlib import Path

from tests.support.realhosts.systemd_host import INNER, SystemdHost

IMAGE = "gpu-pivot-test/busybox"
DOCKERD = ("/usr/sbin/dockerd -H fd:// --containerd=/run/containerd/containerd.sock --iptables=false "
           "--bridge=none --ip-masq=false --ip-forward=false --storage-driver=overlay2")
UNITS = {
    "docker.service.d/test.conf": f"[Service]\nExecStart=\nExecStart={DOCKERD}\n",
    "containerd.service.d/test.conf": "[Service]\nExecStartPre=\n",
}
CONTAINERD_TOML = 'version = 2\ndisabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.internal.v1.opt"]\n'
BUSYBOX = shutil.which("busybox") or "/bin/busybox"


def busybox_tarball(path: Path) -> None:
    """/bin/busybox and one link per applet: a working image with no registry."""
    applets = subprocess.run([BUSYBOX, "--list"], capture_output=True, text=True, check=True).stdout.split()
    with tarfile.open(path, "w") as tar:
        tar.add(os.path.realpath(BUSYBOX), "bin/busybox")
        for name in applets:
            if name != "busybox":
                info = tarfile.TarInfo(f"bin/{name}")
                info.type, info.linkname = tarfile.SYMTYPE, "busybox"
                tar.addfile(info)
        for d in ("dev", "proc", "sys", "tmp", "etc"):
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)


def docker_host(workdir: Path, name: str = "docker-host") -> SystemdHost:
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "containerd.toml").write_text(CONTAINERD_TOML)
    return SystemdHost(workdir, name, units=UNITS, enable=("containerd.service", "docker.socket", "docker.service"),
                       tmpfs=("/var/lib/docker", "/var/lib/containerd", "/etc/docker", "/etc/containerd", "/opt",
                              "/etc/cni", "/var/lib/cni"),
                       setup=f"cp {INNER}/containerd.toml /etc/containerd/config.toml")


def import_image(host: SystemdHost) -> None:
    busybox_tarball(host.dir / "busybox.tar")
    host.sh(f"docker import {INNER}/busybox.tar {IMAGE} >/dev/null", check=True)
