"""A real sshd on 127.0.0.1 with keys made for it, for tests and benchmarks.

Why real: the ssh path is where quoting breaks, where ControlMaster sockets live, and
where exit 255 means "not reached". A fake would agree with whatever we assume.
The server's PATH (sshd `SetEnv`) starts with tests/support/standin so `pct` is the stand-in.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

from tests.support.paths import STANDIN as STANDIN_DIR

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


def free_port() -> int:
    """A port nothing listens on now. sshd cannot be told to pick its own (`Port 0` is refused),
    so a server started on it confirms it got it (LoopbackSshd.start reads sshd's own "Server
    listening" line, and picks another port when the bind failed). In `make test` each worker
    has a network namespace of its own (tests/support/pidns.py): only its own tests take ports there."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# The key exchange the tests' servers offer. OpenSSH 9.2's default (sntrup761x25519) costs the
# client ~0.12 s of CPU per cold connection, curve25519 ~0.02 s (0.141 against 0.017 s on the
# 2-core CI machine); the suite makes hundreds of them on two cores. What gpu-pivot does is the
# same either way: it names no key exchange. The noisy_sshd fixture and the benches keep
# OpenSSH's defaults, as hosts come.
TEST_KEX = "curve25519-sha256,curve25519-sha256@libssh.org"


class LoopbackSshd:
    """Start with `.start()`, stop with `.stop()`. `ssh_opts` are what a client needs."""

    def __init__(self, workdir: Path, noise: str | None = None, keys_from: LoopbackSshd | None = None,
                 env: dict | None = None, home_keys: bool = False, kex: str | None = TEST_KEX):
        """home_keys: each user's own ~/.ssh/authorized_keys is read too (after the test's file,
        which sshd reads as the user logging in: another user cannot read it in a test's 0700 dir).
        kex: the key exchanges this server offers (TEST_KEX); None: OpenSSH's defaults, as a real
        host offers them (the benches, which time a cold connection as operators meet it)."""
        self.kex = kex
        self.dir = Path(workdir)
        self.home_keys = home_keys
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.noise = noise
        self.keys_from = keys_from
        # the far side's agent keeps its lock, last.json and audit log here unless told otherwise:
        # never in the machine's /run/gpu-pivot
        self.env = {"GPU_PIVOT_RUN_DIR": str(self.dir / "remote-run"), **(env or {})}
        self.proc = None
        self.log = self.dir / "sshd.log"
        self.pct_log = self.dir / "pct.log"

    # -- keys -------------------------------------------------------------------------
    def _keys(self) -> None:
        src = self.keys_from
        if src is not None:  # a fleet shares one client key; each server its own host key
            self.client_key = src.client_key
        else:
            self.client_key = self.dir / "client_key"
            _keygen(self.client_key)
        self.host_key = self.dir / "host_key"
        _keygen(self.host_key)
        shutil.copy(f"{self.client_key}.pub", self.dir / "authorized_keys")
        os.chmod(self.dir / "authorized_keys", 0o600)
        self._known_hosts()

    def _known_hosts(self) -> None:
        pub = Path(f"{self.host_key}.pub").read_text().split()
        self.known_hosts = self.dir / "known_hosts"
        self.known_hosts.write_text(f"[127.0.0.1]:{self.port} {pub[0]} {pub[1]}\n")

    def _config(self) -> Path:
        env_path = f"{STANDIN_DIR}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        setenv = [f"PATH={env_path}", f"PCT_STANDIN_LOG={self.pct_log}", *(f"{k}={v}" for k, v in self.env.items())]
        force = []
        if self.noise:  # like an rc file that echoes: noise, then the command as sshd would run it
            wrapper = self.dir / "noisy-shell"
            wrapper.write_text("#!/bin/sh\n" + self.noise + 'exec /bin/sh -c "$SSH_ORIGINAL_COMMAND"\n')
            wrapper.chmod(0o755)
            force = [f"ForceCommand {wrapper}"]
        conf = self.dir / "sshd_config"
        conf.write_text("\n".join([
            f"Port {self.port}",
            "ListenAddress 127.0.0.1",
            f"HostKey {self.host_key}",
            f"PidFile {self.dir / 'sshd.pid'}",
            f"AuthorizedKeysFile {self.dir / 'authorized_keys'}" + (" .ssh/authorized_keys" if self.home_keys else ""),
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "PermitRootLogin prohibit-password",
            "StrictModes no",
            "UsePAM no",
            "PrintMotd no",
            "PrintLastLog no",
            "LogLevel VERBOSE",
            "MaxSessions 100",
            "MaxStartups 200",
            *([f"KexAlgorithms {self.kex}"] if self.kex else []),
            "SetEnv " + " ".join(setenv),
            *force,
        ]) + "\n")
        return conf

    # -- life -------------------------------------------------------------------------
    def start(self, timeout: float = 60.0) -> LoopbackSshd:
        """Start sshd and wait until it says it listens on its port (its own log line), for up
        to `timeout` s (a loaded machine); a port taken meanwhile is swapped for another."""
        self._keys()
        Path("/run/sshd").mkdir(exist_ok=True)  # privilege separation dir sshd insists on
        for _attempt in range(5):
            conf = self._config()
            if self.log.exists():
                self.log.unlink()
            self.proc = subprocess.Popen([SSHD, "-D", "-f", str(conf), "-E", str(self.log)], stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            listening = f"Server listening on 127.0.0.1 port {self.port}."
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                log = self.log.read_text() if self.log.exists() else ""
                if listening in log:
                    return self
                if self.proc.poll() is not None:
                    break
                time.sleep(0.02)
            else:
                self.stop()
                raise RuntimeError(f"sshd did not say {listening!r} within {timeout:.0f} s; its log: {log}")
            log = self.log.read_text() if self.log.exists() else ""
            if "Address already in use" not in log:
                raise RuntimeError(f"sshd exited {self.proc.returncode}: {self.proc.stderr.read().decode()} {log}")
            self.port = free_port()  # someone took the port between free_port() and sshd's bind
            self._known_hosts()
        raise RuntimeError(f"sshd found no free port in 5 tries; its last log: {log}")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    @property
    def ssh_opts(self) -> str:
        """GPU1_SSH_OPTS for this server: port, key, and its known_hosts (checking stays on)."""
        return (f"-p {self.port} -i {self.client_key} -o UserKnownHostsFile={self.known_hosts} "
                "-o StrictHostKeyChecking=yes -o IdentitiesOnly=yes")

    def dest(self, user: str | None = None) -> str:
        return f"{user or os.environ.get('USER') or _whoami()}@127.0.0.1"

    def connections(self) -> int:
        """How many ssh connections sshd accepted (one 'Accepted publickey' line each)."""
        if not self.log.exists():
            return 0
        return self.log.read_text().count("Accepted publickey")

    def hosts_env(self, alias: str, ctid: str | None = None, extra: dict | None = None, user: str | None = None,
                  more_opts: str = "") -> str:
        """hosts.env lines for this sshd as `alias`; more_opts: ssh options after ours (a bench's
        KexAlgorithms, say)."""
        up = alias.upper()
        lines = [f"{up}_SSH={self.dest(user)}", f"{up}_SSH_OPTS='{' '.join(filter(None, [self.ssh_opts, more_opts]))}'"]
        if ctid:
            lines.append(f"{up}_CTID={ctid}")
        for k, v in (extra or {}).items():
            lines.append(f"{up}_{k}='{v}'")
        return "\n".join(lines) + "\n"


def _whoami() -> str:
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


def _keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True,
                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
