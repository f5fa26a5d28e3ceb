"""A Proxmox-like node: a real systemd host running a real LXC container, with a `pct`.

Why real: from the node, a container's process has two pids (NSpid) and a cgroup under
/lxc/CTID/; `pct exec CTID -- ARGV` is `lxc-attach` and passes argv without a shell; a unit
inside the container is its own systemd's to stop. Proxmox itself cannot run here; LXC
can, the way Proxmox drives it: each CT started by `lxc@CTID.service`, Proxmox's cgroup
layout (`lxc.cgroup.dir.container = lxc/CTID`, inner `ns`), the node's /dev/nvidia* bound
in as GPU passthrough does, the node's /usr read-only (so python3 runs inside).

The container boots the image's systemd as its init, runs its own sshd (the route straight
into the container) and shares the node's network namespace (`lxc.net.0.type = none`) so
that sshd is reachable on a loopback port: the container runs no network unit (they are
masked). Its capabilities to load modules, set the clock or touch raw I/O are dropped,
no AppArmor profile is loaded, and its rootfs is a directory in the test's temp dir.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from tests.support.loopback_sshd import _keygen, free_port
from tests.support.realhosts.systemd_host import GPUS, HOLDER, INNER, MASKED, SSHD_CONFIG, SystemdHost

CTID = "129"
PCT = r"""#!/bin/sh
# pct for the test node: `pct exec CTID [--keep-env 0|1] -- ARGV` execs
# `lxc-attach -n CTID --keep-env|--clear-env -- ARGV`, as Proxmox's pct does (PVE 8 keeps
# the environment by default). No shell re-parses ARGV. Unknown or stopped CT: exit 255.
if [ "$1" != exec ]; then echo "pct (test node): only 'pct exec CTID -- ARGV' is provided" >&2; exit 255; fi
ctid=$2
case $ctid in ''|*[!0-9]*) echo "pct: invalid CT id '$ctid'" >&2; exit 255 ;; esac
shift 2
env=--keep-env
if [ "$1" = --keep-env ]; then
    [ "$2" = 0 ] && env=--clear-env
    shift 2
fi
[ "$1" = -- ] && shift
if [ "$(lxc-info -n "$ctid" -s -H 2>/dev/null)" != RUNNING ]; then
    echo "CT $ctid not running (or does not exist)" >&2
    exit 255
fi
exec lxc-attach -n "$ctid" "$env" -- "$@"
"""
CT_CONFIG = """lxc.uts.name = ct{ctid}
lxc.rootfs.path = dir:{rootfs}
lxc.net.0.type = none
lxc.apparmor.profile = unconfined
lxc.cap.drop = sys_module sys_time sys_rawio mac_admin mac_override
lxc.init.cmd = /lib/systemd/systemd
lxc.mount.auto = proc:mixed sys:ro cgroup:mixed
lxc.autodev = 1
lxc.tty.max = 0
lxc.pty.max = 16
lxc.console.path = none
lxc.cgroup.relative = 0
lxc.cgroup.dir.monitor = lxc.monitor/{ctid}
lxc.cgroup.dir.container = lxc/{ctid}
lxc.cgroup.dir.container.inner = ns
lxc.mount.entry = /usr usr none ro,bind 0 0
{gpus}
"""
ETC_FILES = ("passwd", "group", "shadow", "gshadow", "nsswitch.conf", "ld.so.cache", "ld.so.conf", "localtime",
             "hosts", "host.conf")
CT_MASKED = MASKED + ("ssh.socket", "systemd-networkd.service", "systemd-resolved.service",
                      "systemd-networkd-wait-online.service", "systemd-user-sessions.service", "dbus.socket",
                      "dbus.service")


def _ct_rootfs(root: Path, port: int, units: dict) -> None:
    """A container root: the node's /usr (bound read-only at start), links for /bin, /lib...,
    a few files of /etc, its own units, sshd config and keys, and the GPU stand-in."""
    for d in ("usr", "dev", "proc", "sys", "run", "tmp", "var/tmp", "var/log/journal", "root", "srv/bin",
              "etc/systemd/system/multi-user.target.wants", "etc/ssh"):
        (root / d).mkdir(parents=True, exist_ok=True)
    for link in ("bin", "sbin", "lib", "lib64"):
        if os.path.lexists(f"/{link}"):
            (root / link).symlink_to(f"usr/{link}")
    for f in ETC_FILES:
        if os.path.exists(f"/etc/{f}"):
            shutil.copy2(f"/etc/{f}", root / "etc" / f)
    for d in ("ld.so.conf.d", "alternatives"):
        if os.path.isdir(f"/etc/{d}"):
            shutil.copytree(f"/etc/{d}", root / "etc" / d, symlinks=True)
    (root / "etc/os-release").symlink_to("../usr/lib/os-release")
    (root / "etc/machine-id").write_text(os.urandom(16).hex() + "\n")
    (root / "etc/systemd/journald.conf").write_text("[Journal]\nStorage=volatile\n")
    unit_dir = root / "etc/systemd/system"
    for unit in CT_MASKED:
        (unit_dir / unit).symlink_to("/dev/null")
    (unit_dir / "ssh.service.d").mkdir()
    (unit_dir / "ssh.service.d/test.conf").write_text(
        "[Service]\nExecStartPre=\nExecStartPre=/usr/sbin/sshd -t -f /etc/ssh/test_sshd_config\n"
        "ExecStart=\nExecStart=/usr/sbin/sshd -D -f /etc/ssh/test_sshd_config\n")
    (unit_dir / "multi-user.target.wants/ssh.service").symlink_to("/lib/systemd/system/ssh.service")
    for name, text in units.items():
        (unit_dir / name).write_text(text)
    (root / "etc/ssh/test_sshd_config").write_text(SSHD_CONFIG.format(port=port, d="/etc/ssh"))
    _keygen(root / "etc/ssh/host_key")
    shutil.copy(HOLDER, root / "srv/bin/vllm")
    shutil.copy(HOLDER, root / "srv/bin/gpu-holder")
    os.chmod(root, 0o755)


class PveNode(SystemdHost):
    """A SystemdHost that is a Proxmox-like node with CT `CTID` running (see the module doc)."""

    def __init__(self, workdir: Path, ct_units: dict | None = None, name: str = "pve-node"):
        workdir = Path(workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        self.ct_port = free_port()
        self.ct_root = workdir / "ct" / "rootfs"
        _ct_rootfs(self.ct_root, self.ct_port, ct_units or {})
        gpus = "\n".join(f"lxc.mount.entry = /dev/{d} dev/{d} none bind,create=file 0 0"
                         for d in [f"nvidia{i}" for i in range(GPUS)] + ["nvidiactl", "nvidia-uvm"])
        (workdir / "ct" / "config").write_text(CT_CONFIG.format(ctid=CTID, rootfs=f"{INNER}/ct/rootfs", gpus=gpus))
        (workdir / "pct").write_text(PCT)
        setup = "\n".join([
            f"mkdir -p /var/lib/lxc/{CTID} && cp {INNER}/ct/config /var/lib/lxc/{CTID}/config",
            f"install -m 755 {INNER}/pct /usr/local/sbin/pct",
        ])
        super().__init__(workdir, name, tmpfs=("/var/lib/lxc", "/var/cache/lxc", "/usr/local/sbin", "/var/log/lxc"),
                         setup=setup, enable=(f"lxc@{CTID}.service",))

    def _prepare(self) -> None:
        super()._prepare()
        ct_ssh = self.ct_root / "root/.ssh"
        ct_ssh.mkdir(mode=0o700, exist_ok=True)
        shutil.copy(self.dir / "client_key.pub", self.ct_root / "etc/ssh/authorized_keys")
        pub = (self.ct_root / "etc/ssh/host_key.pub").read_text().split()
        with open(self.known_hosts, "a") as f:
            f.write(f"[127.0.0.1]:{self.ct_port} {pub[0]} {pub[1]}\n")

    def ct_ready(self) -> bool:
        """The container's systemd is up and its sshd answers."""
        out = self.sh(f"lxc-attach -n {CTID} -- systemctl is-system-running 2>/dev/null").stdout.strip()
        return out in ("running", "degraded")

    def ct_sh(self, script: str, check: bool = False):
        """A shell line inside the container (test setup; the product goes over ssh and pct)."""
        return self.sh(f"lxc-attach -n {CTID} --clear-env -- /bin/sh -c {_q(script)}", check=check)

    @property
    def ct_ssh_opts(self) -> str:
        return self.ssh_opts.replace(f"-p {self.port} ", f"-p {self.ct_port} ")


def _q(text: str) -> str:
    import shlex

    return shlex.quote(text)
