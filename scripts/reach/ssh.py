"""The ssh command line gpu-pivot runs: its own options, its connection sockets, its log.

Why one module: every call to a host goes through one ssh, and what that ssh is told decides
whether a dead host hangs a fleet, whether two aliases share a connection they must not, and
whether ssh's own failure can be told from the remote command's. The options a hosts.env may
add are checked where the configuration is read (scripts/config/sshopts.py); everything ssh is
given beyond them is here.
"""
from __future__ import annotations

import contextlib
import os
import shlex
from dataclasses import dataclass
from pathlib import Path

from ..agent.state import statedir
from ..config.route import SshHop

SSH_UNREACHABLE = 255  # ssh's own exit code when it fails (and a remote command's that exits 255)
CONTROL_DIR_ENV = "GPU_PIVOT_CONTROL_DIR"
CONTROL_PERSIST_S = 120
# Why these: without them a host that drops packets kept `invoke ping` silent for 13 minutes
# (the kernel's TCP retries), and a host that froze mid-call held its fleet forever. A dead
# connection is now noticed after CONNECT_TIMEOUT_S, or ALIVE_INTERVAL_S * ALIVE_COUNT once
# connected. A host's ALIAS_SSH_OPTS overrides any of them (ssh keeps the first value it
# reads, and a host's own options come first), e.g. `-o ConnectTimeout=30` for a slow link.
CONNECT_TIMEOUT_S = 10
ALIVE_INTERVAL_S = 5
ALIVE_COUNT = 3
# ssh's own words when it gave up waiting (connect, banner, keep-alive): a time-out, not a refusal
_SSH_TIMEOUT_WORDS = ("timed out", "Timeout, server", "Connection timed out")
# 36 + "/" + 40 (%C) + 9 (control_name's "-" + 8) + 17 (ssh's ".XXXXXXXXXXXXXXXX") = 103: a
# socket path fits sun_path on Linux (107) and on macOS (103), where operators' laptops run ssh
CONTROL_DIR_MAX = 36


def command(hop: SshHop, argv: list, for_paste: bool, ssh_log: str | None = None) -> list:
    """The ssh command that runs `argv` behind `hop`: ssh joins its command words with spaces and
    the remote login shell re-parses them, so argv goes as ONE shlex.join string. `for_paste`: the
    line an operator pastes (the host's own options only); else gpu-pivot's options follow them."""
    opts = list(hop.opts) if for_paste else machine_opts(hop)
    # -E: ssh's own messages (refused, timed out, keep-alive lost) to a file of ours, so
    # a remote command cannot fake them on its stderr (route.ssh_failed reads only the file).
    log = ["-E", ssh_log] if ssh_log and not for_paste else []
    return ["ssh", *log, *opts, hop.dest, shlex.join(argv)]


def machine_opts(hop: SshHop) -> list:
    """The options of an ssh gpu-pivot runs itself: host key checking stays on; BatchMode so it
    never prompts; the time-outs above; a shared connection (control_opts)."""
    # User options come first: ssh keeps the first value it sees for an option, so a
    # host's GPU1_SSH_OPTS can override ours (e.g. ControlMaster=no).
    return [
        *hop.opts,
        "-o", "BatchMode=yes",
        "-o", f"ConnectTimeout={CONNECT_TIMEOUT_S}",
        "-o", f"ServerAliveInterval={ALIVE_INTERVAL_S}",
        "-o", f"ServerAliveCountMax={ALIVE_COUNT}",
        *control_opts(hop.dest, hop.opts),
    ]


def control_dir(base: str | None = None) -> Path:
    """Where ssh ControlMaster sockets live: private, and short enough for a socket name.

    A unix socket path holds about 104 bytes and a socket's name is ssh's 40-character %C
    hash, 9 characters of ours (control_name) and ssh's 17-character temporary suffix, so a
    directory longer than CONTROL_DIR_MAX is swapped for a short one derived from it (same
    directory every time for the same setting).
    Private and checked (statedir.private_dir: created 0700, or ours, not a link, not
    group/other writable): the default lives in /tmp, where another user could create
    it first and plant a socket that our ssh would take for its master connection.
    A refused directory raises StateDirError, one line naming it.
    """
    configured = base or os.environ.get(CONTROL_DIR_ENV)
    base = configured or _default_base()
    if len(base) > CONTROL_DIR_MAX:
        base, configured = f"/tmp/gpu-pivot-ssh-{os.getuid()}-{_digest(base, 10)}", None
    return Path(statedir.private_dir(base, parents=bool(configured), env=CONTROL_DIR_ENV))


def _default_base() -> str:
    """Root: /run/gpu-pivot/ssh, inside a directory no other user can create or enter. Others:
    their private runtime dir when its path is short enough for a socket, else /tmp."""
    if os.geteuid() == 0:
        return os.path.join(statedir.run_dir(), "ssh")
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    # not a dir another user can swap, and short enough for a socket
    if runtime and len(runtime) <= CONTROL_DIR_MAX - len("/gpu-pivot-ssh") and statedir.is_private(runtime):
        return os.path.join(runtime, "gpu-pivot-ssh")
    return f"/tmp/gpu-pivot-ssh-{os.getuid()}"


def control_name(dest: str, opts: tuple | list) -> str:
    """The master socket's name for one connection: ssh's %C (local host, remote host, port,
    user, ProxyJump as ssh resolves them) and a digest of the destination and every ssh option.

    Why the options too: %C alone let two aliases reaching the same user@host:port share one
    master, so an alias with its own UserKnownHostsFile (or key, or any other option) rode on
    the other's connection and its host-key check never ran."""
    return f"%C-{_digest(chr(0).join([dest, *opts]), 8)}"


def control_path(dest: str, opts: tuple | list, base: str | None = None) -> str:
    """The ControlPath of one connection (%C unexpanded), e.g. for `ssh -S PATH -O exit DEST`;
    `base`: a control directory setting other than this process's (control_dir)."""
    return f"{control_dir(base)}/{control_name(dest, opts)}"


def control_opts(dest: str = "", opts: tuple | list = ()) -> list:
    """ssh options for connection sharing, a master per destination + options (control_name).
    A default directory that another user squatted (possible only for the /tmp fallback)
    costs the sharing, never the teardown: ssh then runs without a master. A directory the
    operator configured is refused instead (exit 3)."""
    try:
        path = control_path(dest, opts)
    except statedir.StateDirError:
        if os.environ.get(CONTROL_DIR_ENV):
            raise
        return ["-o", "ControlMaster=no", "-o", "ControlPath=none"]
    return ["-o", "ControlMaster=auto", "-o", f"ControlPath={path}", "-o", f"ControlPersist={CONTROL_PERSIST_S}"]


SSH_LOG_MAX_BYTES = 256 * 1024


@dataclass
class SshLog:
    """ssh's own messages for one call (`ssh -E path`): the text written after `offset`."""

    path: str
    offset: int = 0
    temporary: bool = False

    def read(self) -> str:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""


@contextlib.contextmanager
def ssh_log(hop: SshHop | None):
    """Where ssh writes its own messages (-E) during one call; None with no ssh hop.

    One file per destination in the private ControlMaster directory, appended to and read
    from where this call began: the master connection (ControlPersist) was started by an
    earlier call and keeps writing to that call's -E file, and it is the master that says
    "Timeout, server ... not responding" when keep-alives go unanswered (a file per call,
    deleted after it, lost that line). Logs unused for days are pruned (ssh_logs.py). Without
    a usable private directory, a fresh mkstemp file (ssh then runs without a master)."""
    if hop is None:
        yield None
        return
    try:
        directory = control_dir()
    except statedir.StateDirError:
        import tempfile  # only when the private directory is refused: a call's imports stay small

        fd, path = tempfile.mkstemp(prefix="gpu-pivot-ssh-", suffix=".log")
        os.close(fd)
        try:
            yield SshLog(path, 0, temporary=True)
        finally:
            os.unlink(path)
        return
    name = _digest("\0".join([hop.dest, *hop.opts]), 16) + ".log"
    path = str(directory / name)
    flags = os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd, created = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o600), True
    except FileExistsError:
        fd, created = os.open(path, flags | os.O_CREAT, 0o600), False  # pruned meanwhile: made again
    try:
        size = os.fstat(fd).st_size
        if size > SSH_LOG_MAX_BYTES:
            os.ftruncate(fd, 0)  # a master appending (O_APPEND) goes on at the new end
            size = 0
        os.utime(fd)  # its age is the time since its last call (ssh_logs.prune)
    finally:
        os.close(fd)
    if created:  # one more log: drop those of destinations long unused
        from . import ssh_logs

        ssh_logs.prune(str(directory))
    yield SshLog(path, size)


def read_ssh_log(log: SshLog | None) -> str:
    """What ssh itself said during the call ("" with no ssh hop or an unreadable file)."""
    return log.read() if log is not None else ""


def ssh_timed_out(stderr: str) -> bool:
    """Did ssh give up waiting (connect, banner exchange, keep-alive), rather than being refused?"""
    return any(word in stderr for word in _SSH_TIMEOUT_WORDS)


def keepalive_lost(stderr: str) -> bool:
    """ssh's own line when ServerAliveCountMax keep-alives went unanswered."""
    return any(line.startswith("Timeout, server ") and "not responding" in line for line in stderr.splitlines())


def _digest(text: str, chars: int) -> str:
    """A short hex name for `text` (a file name that fits where the text would not). hashlib is
    imported here: only ssh routes need it, and a teardown of this machine should not pay for it."""
    import hashlib

    return hashlib.sha1(text.encode()).hexdigest()[:chars]
