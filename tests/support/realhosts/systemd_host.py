"""A real systemd host with sshd inside, booted in its own namespaces, for tests.

Why real: gpu-pivot stops a unit's processes with `systemctl stop`, asks whether it is
enabled, runs phases with `systemd-run` and reads `journalctl -u`. A fake would agree with
what we assume; this image's systemd 252 boots as PID 1 of new PID, mount, cgroup, UTS and
IPC namespaces in about 1.5 s (the project notes, REALHOSTS.md, have the measurements).

What keeps it from damaging the machine (seen happen without it): private tmpfs on /run,
/tmp, /var/tmp, /root, /dev (minimal nodes, fake GPU files) and the journal; a unit dir
holding only the test's units, with every unit that writes the shared kernel or
filesystem masked; read-only /sys and /proc/sys; its own cgroups below the test's
(cgroups.py), mounted fresh inside a cgroup namespace. It shares the machine's root
filesystem and network: not a security boundary. sshd listens on 127.0.0.1 on a free port.
"""
from __future__ import annotations

import os
import shlex
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from tests.support.loopback_sshd import _keygen, free_port
from tests.support.realhosts import cgroups

# Units that write the machine's kernel or shared files, or are not wanted in a test host.
MASKED = (
    "systemd-tmpfiles-setup.service", "systemd-tmpfiles-setup-dev.service", "systemd-tmpfiles-clean.service",
    "systemd-tmpfiles-clean.timer", "systemd-sysctl.service", "systemd-binfmt.service",
    "systemd-modules-load.service", "modprobe@.service", "kmod-static-nodes.service", "systemd-udevd.service",
    "systemd-udevd-control.socket", "systemd-udevd-kernel.socket", "systemd-udev-trigger.service",
    "systemd-remount-fs.service", "systemd-random-seed.service", "systemd-update-utmp.service",
    "systemd-update-utmp-runlevel.service", "getty@.service", "console-getty.service", "getty.target",
    "systemd-machine-id-commit.service", "systemd-firstboot.service", "systemd-sysusers.service",
    "systemd-update-done.service", "ldconfig.service", "systemd-hwdb-update.service",
    "systemd-journal-catalog-update.service", "systemd-timesyncd.service", "systemd-journald-audit.socket",
    "systemd-journal-flush.service", "systemd-pcrphase.service", "systemd-pcrphase-sysinit.service",
    "systemd-repart.service", "proc-sys-fs-binfmt_misc.automount", "dev-hugepages.mount", "dev-mqueue.mount",
    "sys-kernel-debug.mount", "sys-kernel-tracing.mount", "sys-kernel-config.mount",
    "sys-fs-fuse-connections.mount", "systemd-ask-password-wall.path", "systemd-ask-password-console.path",
    "e2scrub_reap.service", "e2scrub_all.timer", "apt-daily.timer", "apt-daily-upgrade.timer",
    "man-db.timer", "fstrim.timer", "logrotate.timer", "dpkg-db-backup.timer", "systemd-logind.service",
    "postgresql.service", "postgresql@.service", "cron.service", "munge.service", "slurmd.service",
    "slurmctld.service", "lxc-net.service", "lxc.service", "lxc-monitord.service", "docker.service",
    "docker.socket", "containerd.service", "rsyslog.service", "networking.service",
)

DEV_NODES = (("null", 1, 3), ("zero", 1, 5), ("full", 1, 7), ("random", 1, 8), ("urandom", 1, 9), ("tty", 5, 0))
GPUS = 2
SSHD_CONFIG = """Port {port}
ListenAddress 127.0.0.1
HostKey {d}/host_key
PidFile /run/sshd.pid
AuthorizedKeysFile {d}/authorized_keys
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
StrictModes no
UsePAM no
PrintMotd no
MaxSessions 50
MaxStartups 50
SetEnv PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
"""
HOLDER = Path(__file__).resolve().parent / "gpu_holder.py"
INNER = "/run/realhost"  # where the host sees its own state dir (the test's /tmp is hidden in there)


class HostDown(RuntimeError):
    """The host would not boot, or left something behind when it went down."""


class SystemdHost:
    """`up()` boots it, `down()` ends it and checks nothing is left. `name` names its cgroups.

    `tmpfs`: more directories to hide behind a private tmpfs (dockerd's, LXC's state);
    `units`: {file name: text} written to its /etc/systemd/system; `enable`: units wanted
    by multi-user.target; `setup`: shell lines run inside before systemd starts."""

    def __init__(self, workdir: Path, name: str, tmpfs=(), units=None, enable=(), setup="", binds=()):
        self.dir = Path(workdir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.port = free_port()
        self.tmpfs, self.units, self.enable, self.setup, self.binds = tmpfs, dict(units or {}), enable, setup, binds
        self.proc: subprocess.Popen | None = None
        self.cgroups: list[Path] = []
        self.pid1 = 0

    # -- files ------------------------------------------------------------------------------
    def _prepare(self) -> None:
        d = self.dir
        _keygen(d / "client_key")
        _keygen(d / "host_key")
        (d / "authorized_keys").write_text((d / "client_key.pub").read_text())
        pub = (d / "host_key.pub").read_text().split()
        self.known_hosts = d / "known_hosts"
        self.known_hosts.write_text(f"[127.0.0.1]:{self.port} {pub[0]} {pub[1]}\n")
        (d / "sshd_config").write_text(SSHD_CONFIG.format(port=self.port, d=INNER))
        units = d / "units"
        (units / "multi-user.target.wants").mkdir(parents=True)
        for unit in MASKED:
            (units / unit).symlink_to("/dev/null")
        (units / "ssh.service.d").mkdir()
        (units / "ssh.service.d" / "test.conf").write_text(
            f"[Service]\nExecStartPre=\nExecStartPre=/usr/sbin/sshd -t -f {INNER}/sshd_config\n"
            f"ExecStart=\nExecStart=/usr/sbin/sshd -D -f {INNER}/sshd_config\n")
        for fname, text in self.units.items():
            path = units / fname
            path.parent.mkdir(parents=True, exist_ok=True)
            if path.is_symlink():
                path.unlink()
            path.write_text(text)
        for unit in self.enable:  # a unit this host runs is not masked
            if (units / unit).is_symlink():
                (units / unit).unlink()
        for unit in ("ssh.service", *self.enable):
            src = units / unit if (units / unit).exists() else Path("/lib/systemd/system") / unit
            if not src.exists() and "@" in unit:  # an instance of a template: lxc@129.service
                src = src.with_name(unit.split("@")[0] + "@" + src.suffix)
            wants = units / ("sockets.target.wants" if unit.endswith(".socket") else "multi-user.target.wants")
            wants.mkdir(exist_ok=True)
            (wants / unit).symlink_to(f"../{unit}" if src.parent == units else src)
        (d / "bin").mkdir()
        for prog in ("vllm", "gpu-holder"):
            shutil.copy(HOLDER, d / "bin" / prog)
        (d / "hostname").write_text(self.name + "\n")  # systemd sets the hostname from this file
        (d / "machine-id").write_text(os.urandom(16).hex() + "\n")
        (d / "journald.conf").write_text("[Journal]\nStorage=volatile\n")

    def _inner_script(self) -> str:
        """Runs as PID 1 of the new namespaces, then execs systemd."""
        q = shlex.quote
        lines = [
            "set -eu",
            "mount -t proc proc /proc",
            "mount --bind /proc/sys /proc/sys && mount -o remount,bind,ro /proc/sys",
            "mount -t tmpfs -o mode=755 tmpfs /run",
            f"mkdir -p {INNER} && mount --bind {q(str(self.dir))} {INNER}",
            "mount -o remount,bind,ro /sys",
            # the machine's own cgroup mounts go (in this mount namespace only): left under ours,
            # LXC counts each hierarchy twice and cannot make its monitor cgroup ("File exists")
            "umount -R /sys/fs/cgroup",
            "mount -t tmpfs -o mode=755 cgroup /sys/fs/cgroup",
        ]
        for mnt, fstype, opts in cgroups.hierarchies():
            o = f" -o {opts}" if opts else ""
            lines.append(f"mkdir -p {mnt} && mount -t {fstype}{o} cgroup {mnt}")
            if "clone_children" in opts.split(","):  # the machine's cpuset has it: LXC sets up its own
                lines.append(f"echo 0 > {mnt}/cgroup.clone_children")  # (this host's own cgroup only)
        for path in ("/tmp", "/var/tmp", "/root", "/var/log/journal", *self.tmpfs):
            lines.append(f"mkdir -p {path} && mount -t tmpfs -o mode=755 tmpfs {path}")
        lines += [
            "chmod 1777 /tmp /var/tmp && chmod 700 /root",
            "mount -t tmpfs -o mode=755,nosuid tmpfs /dev",
            *(f"mknod -m 666 /dev/{n} c {a} {b}" for n, a, b in DEV_NODES),
            "mkdir /dev/pts /dev/shm && mount -t devpts -o newinstance,ptmxmode=0666,mode=620 devpts /dev/pts",
            "ln -s pts/ptmx /dev/ptmx && ln -s /proc/self/fd /dev/fd && chmod 1777 /dev/shm",
            *(f"ln -s /proc/self/fd/{i} /dev/{n}" for i, n in enumerate(("stdin", "stdout", "stderr"))),
            *(f": > /dev/nvidia{i}" for i in range(GPUS)),
            ": > /dev/nvidiactl && : > /dev/nvidia-uvm && chmod 666 /dev/nvidia*",
            f"mount --bind {INNER}/units /etc/systemd/system",
            f"mount --bind {INNER}/machine-id /etc/machine-id",
            f"mount --bind {INNER}/hostname /etc/hostname",
            f"mount --bind {INNER}/journald.conf /etc/systemd/journald.conf",
            *(f"mkdir -p {dst} && mount --bind {src} {dst}{' && mount -o remount,bind,ro ' + dst if ro else ''}"
              for src, dst, ro in self.binds),
            self.setup,
            "exec env -i container=gpu-pivot-test PATH=/usr/sbin:/usr/bin:/sbin:/bin "
            "/lib/systemd/systemd --system --unit=multi-user.target",
        ]
        return "\n".join(line for line in lines if line) + "\n"

    # -- life -------------------------------------------------------------------------------
    def up(self, timeout: float = 120.0) -> SystemdHost:
        self._prepare()
        (self.dir / "inner.sh").write_text(self._inner_script())
        self.cgroups = cgroups.make(self.name)
        join = "; ".join(f"echo $$ > {q}/cgroup.procs" for q in map(lambda p: shlex.quote(str(p)), self.cgroups))
        launcher = (f"{join}; exec unshare --pid --fork --kill-child --mount --cgroup --uts --ipc "
                    f"--propagation private -- /bin/sh {shlex.quote(str(self.dir / 'inner.sh'))}")
        with open(self.dir / "console.log", "wb") as log:
            self.proc = subprocess.Popen(["/bin/sh", "-c", launcher], stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise HostDown(f"{self.name}: exited {self.proc.returncode} while booting:\n{self.console()}")
            if not self.pid1:
                kids = _children(self.proc.pid)
                self.pid1 = kids[0] if kids else 0
            if self.pid1 and _listening(self.port) and self.state() in ("running", "degraded"):
                return self
            time.sleep(0.05)
        raise HostDown(f"{self.name}: not up in {timeout:.0f}s (state {self.state()!r}):\n{self.console()}")

    def console(self) -> str:
        try:
            return (self.dir / "console.log").read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    def state(self) -> str:
        if not self.pid1:
            return ""
        return self.sh("systemctl is-system-running 2>/dev/null || true").stdout.strip()

    def down(self) -> None:
        """SIGKILL its PID 1 (the kernel ends the rest of the PID namespace), then check that no
        process, cgroup or mount of it is left, and fail loudly if one is."""
        problems = []
        if self.proc is not None and self.proc.poll() is None:
            if self.pid1:
                try:
                    os.kill(self.pid1, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                problems.append(f"launcher {self.proc.pid} did not end")
        problems += leftovers(self.cgroups, self.dir)
        if problems:
            raise HostDown(f"{self.name} left things behind: " + "; ".join(problems))

    # -- reaching it --------------------------------------------------------------------------
    def sh(self, script: str, check: bool = False, timeout: float = 30.0) -> subprocess.CompletedProcess:
        """Run a shell line inside, as root, by entering its namespaces (test setup only: the
        product goes over ssh). Anything that must outlive the call goes through systemd."""
        proc = subprocess.run(["nsenter", "-t", str(self.pid1), "-m", "-p", "-C", "-u", "-i", "--", "/bin/sh", "-c",
                               script], capture_output=True, text=True, timeout=timeout,
                              env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"})
        if check and proc.returncode:
            raise AssertionError(f"{self.name}: {script!r} exited {proc.returncode}: {proc.stderr}{proc.stdout}")
        return proc

    @property
    def ssh_opts(self) -> str:
        return (f"-p {self.port} -i {self.dir / 'client_key'} -o UserKnownHostsFile={self.known_hosts} "
                "-o StrictHostKeyChecking=yes -o IdentitiesOnly=yes")

    def ssh_argv(self, *argv: str) -> list[str]:
        """`ssh` to this host, for tests that go around gpu-pivot (the routes users type)."""
        return ["ssh", "-o", "BatchMode=yes", *shlex.split(self.ssh_opts), "root@127.0.0.1", *argv]

    def hosts_env(self, alias: str, ctid: str | None = None, extra: dict | None = None) -> str:
        up = alias.upper()
        lines = [f"{up}_SSH=root@127.0.0.1", f"{up}_SSH_OPTS='{self.ssh_opts}'", f"{up}_FAKE_DEVICES=yes"]
        if ctid:
            lines.append(f"{up}_CTID={ctid}")
        lines += [f"{up}_{k}='{v}'" for k, v in (extra or {}).items()]
        return "\n".join(lines) + "\n"


def leftovers(dirs: list[Path], workdir: Path) -> list[str]:
    """Processes in the host's cgroups (killed, then reported), the cgroups themselves, and any
    mount of the machine's own namespace under the host's dir."""
    problems = []
    left = sorted({p for d in dirs if d.exists() for p in cgroups.procs_in(d)})
    if left:
        problems.append(f"processes {left} outlived PID 1")
    problems += cgroups.kill_and_remove(dirs)
    with open("/proc/self/mountinfo") as f:
        mounts = [line.split()[4] for line in f if str(workdir) in line.split()[4]]
    if mounts:
        problems.append(f"mounts left: {mounts}")
    return problems


def sweep() -> list[str]:
    """End what a crashed earlier run left (its cgroups name a dead owner). Returns what was swept."""
    stale = cgroups.stale()
    if stale:
        cgroups.kill_and_remove(stale)
    return [str(d) for d in stale]


def _children(pid: int) -> list[int]:
    try:
        return [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
        return True
    except OSError:
        return False
