"""Who could start a target again: found from how processes relate to it and what the kernel
shows, never from the text of the code they run.

Why not code text: reading a script for loops and spawn calls named an unrelated job's script
a supervisor (and, with the flag its hint named, stopped it), and missed every restarter in
another shape (a compiled watchdog, `python3 -m pkg.watchdog`, a node timer). What the kernel
shows does not depend on the shape: who is whose parent, who leads a target's session and
group, and what a process's executable is.

The whole account: docs/design-notes.md (scripts/agent/policy/relation.py)."""
import os
import stat
import termios
import time

from ..procs import fdstat, procfs
from . import managers, rules, shellcode
from .builtin import HELPERS, INFRA, LAUNCHERS, SHELLS

FATES = ("stop", "freeze", "watch")
IDLE_SAMPLE_GAP_S = 0.02  # two looks at a terminal this far apart: a dying job's group lingers a few ms


def executable(pid):
    """(basename, trusted) of the program a process runs: trusted when the file is root's and
    only root may write it (rules.root_owned_exe, as for protected names). ("", False) when
    /proc hides it (no ptrace rights)."""
    path = rules.root_owned_exe(pid)
    trusted = path is not None
    if path is None:
        try:
            path = os.readlink("/proc/%d/exe" % pid)
        except OSError:
            return "", False
    # a program replaced on disk since it started (a package upgrade) is still what it was
    return os.path.basename(path[:-len(" (deleted)")] if path.endswith(" (deleted)") else path), trusted


PF_FORKNOEXEC = 0x40  # a task flag (stat field 9): forked and has not exec'd since
PF_KTHREAD = 0x00200000  # a kernel thread


def _runs_daemon(info, base):
    """Is this a manager's daemon (managers.is_manager_daemon) by its executable too: the daemon's
    own program (runsv, conmon, a containerd shim...), or Python for supervisord, which is a
    Python program? A name alone is anyone's to take: a watchdog script called `runsv` is none.
    The name is enough for a manager the teardown never stops (Ray, a kubelet: its targets are
    named and left, NOT FREE), where a false one gains nothing."""
    name = managers.is_manager_daemon(info) and managers.daemon_name(info)
    if not name:
        return False
    if managers.DAEMONS.get(name) in managers.NOT_BY_DEFAULT:
        return True
    return base == name or (base.startswith(name) and name == managers.SHIM_PREFIX) or (
        name == "supervisord" and base.startswith("python"))


def _shell_name(base):
    return base in SHELLS or base.rstrip("0123456789.") in SHELLS


def _interactive(info, base, argv):
    """A shell in the form of someone's prompt, and not a subshell an interactive shell forked
    for a background loop (`while ...; done &`: its argv, but it never exec'd, PF_FORKNOEXEC:
    it runs code, it is no one's prompt)."""
    how, _ = shellcode.shell_form(dict(info, comm=base, argv=[base] + argv[1:]))
    return how == "terminal" and not info.get("flags", 0) & PF_FORKNOEXEC


_BY_EXE = dict([(name, "launcher") for name in LAUNCHERS] + [(name, "infra") for name in INFRA]
               + [(name, "helper") for name in HELPERS])


def role(info):
    """What a related process is (the module's docstring): launcher, shell, terminal, infra,
    helper, manager or starter; "gone" once it has exited, "unknown" when its executable
    cannot be read."""
    if procfs.finished(info):
        return "gone"
    base, trusted = executable(info["pid"])
    argv = info.get("argv") or []
    if base == "busybox" and argv:  # busybox is the applet its argv[0] names, or argv[1] after `busybox`
        if os.path.basename(argv[0]) == "busybox":
            argv = argv[1:]
        base = os.path.basename(argv[0]).lstrip("-") if argv else "busybox"
    if _runs_daemon(info, base):
        return "manager"
    if base and not trusted and _shell_name(base) and _interactive(info, base, argv):
        # someone's own zsh or bash (linuxbrew, nix, ~/.local) at a prompt: never signalled, and
        # inert only where the kernel shows it idle at its prompt (terminal_state), as any shell
        return "terminal"
    if not base or not trusted:
        return "unknown" if not base else "starter"
    if _shell_name(base):
        return "terminal" if _interactive(info, base, argv) else "shell"
    if base.startswith("containerd-shim"):
        return "infra"
    return _BY_EXE.get(base, "starter")


class Relation:
    """The processes related to the targets (links), each {pid, start_time, cmdline, uid,
    role, relation (words), fate, of (target pids)}, from the plan's scan `procs` before any
    signal. `chain`: the agent and its ancestors, never related. `mine`: the targets' pids,
    `tree`: every pid a target started (its descendants: targets or helpers of theirs)."""

    def __init__(self, targets, procs, chain, tree=frozenset(), pipes=None):
        self.procs, self.chain = procs, set(chain) | {os.getpid()}
        self.pipes = pipes or {}  # pid -> its pipe ends, read before the early SIGTERM (early.Batch)
        self._piped = None  # the targets' (input, output) pipes, read once when first asked
        self.mine = {t["pid"] for t in targets}
        self.tree = set(tree) | self.mine
        self.links: dict = {}
        self.unseen: dict = {}  # target pid -> why what started it cannot be seen (_ancestors)
        self._roles: dict = {}
        kids: dict = {}
        for pid, info in procs.items():
            kids.setdefault(info["ppid"], []).append(pid)
        self._kids = kids
        chains = [(t, self._ancestors(t)) for t in targets]
        self.job = {pid for _, chain in chains for pid, _ in chain}
        for t, chain in chains:
            below = t["pid"]
            for pid, what in chain:
                if pid == 1:
                    self._add(pid, "PID 1, its parent (%s)" % ("a shell running code" if what == "shell" else
                                                               "a program running code"), "watch", t["pid"])
                    break
                if what == "terminal":
                    self._add(pid, "its terminal's shell (ancestor)", "watch", t["pid"])
                    if self.procs[pid].get("tpgid") == self.procs.get(t["pid"], t).get("pgid"):
                        self.links[(pid, self.procs[pid]["start_time"])]["foreground"] = True
                    break
                shared = self._shared(pid, below)
                own = what in ("launcher", "shell") and not shared
                self._add(pid, "ancestor (%s%s)" % (what, ", runs other work too" if shared else ""),
                          "stop" if own else "freeze", t["pid"])
                if shared:
                    break  # the first shared link ends the job: what is above it started more than the job
                below = pid
        for t in targets:
            self._leaders_and_group(t)

    def role_of(self, pid):
        if pid not in self._roles:
            self._roles[pid] = role(self.procs[pid])
        return self._roles[pid]

    def _skip(self, pid):
        return pid in (0, 1) or pid in self.chain or pid in self.mine or pid not in self.procs

    def _add(self, pid, relation, fate, target):
        """Relate pid to a target. Related twice, the more careful fate wins: what one target's
        walk may stop, another's (past a starter) only freezes."""
        info = self.procs[pid]
        k = (pid, info["start_time"])
        link = self.links.get(k)
        if link is None:
            link = self.links[k] = {"pid": pid, "start_time": info["start_time"], "cmdline": info.get("cmdline", ""),
                                    "uid": info.get("uid"), "role": self.role_of(pid), "relation": relation,
                                    "fate": fate, "of": []}
        elif FATES.index(fate) > FATES.index(link["fate"]):
            link["fate"] = fate
        if target not in link["of"]:
            link["of"].append(target)

    def _ancestors(self, t):
        """[(pid, role)] from a target's parent up to the first inert one, a terminal's shell
        included as the last (module docstring)."""
        out: list = []
        below, pid = t["pid"], t["ppid"]
        sid = self.procs.get(t["pid"], t).get("sid")
        if pid == 1 and not sid and t["pid"] != 1:
            # its session reads 0: it was started from outside this PID namespace and left to PID 1
            # (`pct exec CT -- bash -c 'SERVER &'`), or PID 1 started it and its session is outside
            # too (`unshare --fork`): what started it cannot be told, so it is unseen either way
            self.unseen[t["pid"]] = ("PID %d's session is outside this PID namespace (it was started from there, "
                                     "or by PID 1 whose session is there too)" % t["pid"])
        if pid == 1 and 1 in self.procs and sid == self.procs[1]["sid"] \
                and self.role_of(1) in ("shell", "launcher", "starter", "unknown"):
            # a container's or namespace's PID 1 that runs code (a shell loop, a Python entrypoint)
            # and started it (its session still PID 1's: an orphan left to PID 1 by a double fork or
            # setsid has its own): related, never signalled
            return [(1, self.role_of(1))]
        while not self._skip(pid) and pid not in {p for p, _ in out} and pid not in self.tree:
            info = self.procs[pid]
            if info["start_time"] > self.procs.get(below, info)["start_time"]:
                break  # a "parent" younger than its child: the pid was reused
            what = self.role_of(pid)
            if what in ("infra", "manager", "helper", "gone"):
                break
            out.append((pid, what))
            if what == "terminal":
                break
            below, pid = pid, info["ppid"]
        else:
            self._unseen(t["pid"], below, pid)
        return out

    def _unseen(self, target, below, pid):
        """Note a target whose chain leaves what this agent can see: a parent that reads as pid 0
        (outside this PID namespace: `pct exec`, `docker exec`, nsenter started it) or one /proc
        does not list (hidepid, gone in the scan's instant). Whatever started it may start it
        again, unseen: never FREED (the verdict is the middle one)."""
        kernel = self.procs.get(below, {}).get("flags", 0) & PF_KTHREAD  # kthreadd's children read ppid 0 too
        if pid == 0 and below != 1 and not kernel and below not in self.chain:
            self.unseen[target] = ("PID %d's parent is outside this PID namespace (reads as pid 0: `pct exec`, "
                                   "`docker exec` or nsenter started it)" % below)
        elif pid not in (0, 1) and pid not in self.procs and pid not in self.chain:
            self.unseen[target] = "PID %d's parent, PID %d, cannot be read here" % (below, pid)

    def _shared(self, pid, below):
        """Does this link run anything but the job: a live child that is not the link below,
        a target, a process a target started or another link of a walk, a helper (sleep, tee),
        nor the other end of a target's pipeline (`SRV | grep -v DEBUG > log`: it ends on EOF)?"""
        for child in self._kids.get(pid, ()):
            if child == below or child in self.tree or child in self.job or procfs.finished(self.procs[child]) \
                    or not procfs.same_process(child, self.procs[child]["start_time"]):
                continue  # gone since the scan (a pipeline's grep that read the early SIGTERM's EOF)
            if self.role_of(child) not in ("helper", "gone") and not self._in_pipeline(child):
                return True
        return False

    def _in_pipeline(self, pid):
        """Is this process the other end of a target's pipeline (a target's output pipe on its
        stdin, or its stdout on a target's input pipe)?"""
        if self._piped is None:
            self._piped = _pipes_of(sorted(self.mine), self.pipes)
        return bool(pipe_ends(pid, (0,)) & self._piped[1] or pipe_ends(pid, (1,)) & self._piped[0])

    def _leaders_and_group(self, t):
        """The session and group leaders a target did not leave, and its group's other live
        members it did not start: older ones (a watchdog that ran `nohup server &`) and younger
        ones (`server & watchdog &` from a script that has since exited: both left in its group).
        Not a member of the target's own pipeline (a pipe of a target's stdin, stdout or stderr
        on its stdin or stdout: `server | sh -c 'cat > log'`): it ends on the server's EOF."""
        info = self.procs.get(t["pid"], t)
        for pid, words in ((info.get("sid"), "leader of its session"), (info.get("pgid"), "leader of its group")):
            if pid is not None and pid != t["pid"] and not self._skip(pid) and pid not in self.tree:
                self._relate(pid, words, t["pid"])
        pgid = info.get("pgid")
        if pgid in (None, 0, 1):
            return
        first = min((self.procs[p]["start_time"] for p in self.mine if self.procs.get(p, {}).get("pgid") == pgid),
                    default=info["start_time"])
        for pid, other in self.procs.items():
            if other.get("pgid") == pgid and not self._skip(pid) and pid not in self.tree:
                if self._in_pipeline(pid):
                    continue  # the other end of a target's pipeline (`server | tee`, `producer | server`)
                self._relate(pid, "in its process group, %s it" % (
                    "older than" if other["start_time"] < first else
                    "started with" if other["start_time"] == first else "started after"), t["pid"])

    def _relate(self, pid, words, target):
        """A leader or group member: related, but never the job's own to end (it was not walked
        through from the target)."""
        k = (pid, self.procs[pid]["start_time"])
        if k in self.links:
            if target not in self.links[k]["of"]:
                self.links[k]["of"].append(target)
            return
        what = self.role_of(pid)
        if what not in ("infra", "manager", "helper", "gone"):
            self._add(pid, "%s (%s)" % (words, what), "watch" if what == "terminal" else "freeze", target)


def pipe_ends(pid, fds):
    """The pipes (their "pipe:[inode]" names) on these fds of a process: readlink only, which no
    filesystem answers (a pipe lives in the kernel)."""
    out = set()
    for fd in fds:
        try:
            name = os.readlink("/proc/%d/fd/%d" % (pid, fd))
        except OSError:
            continue
        if name.startswith("pipe:"):
            out.add(name)
    return out


def _pipes_of(pids, known):
    """(pipes on the targets' stdin, pipes on their stdout or stderr); `known`: {pid: (in, out)}
    read before a target's SIGTERM, whose exit closes them. A pipeline's reader has a target's
    output pipe on its stdin, its writer a target's input pipe on its stdout (a pipe both
    merely inherited on stdout, as from a terminal's logger, joins nothing)."""
    ins, outs = set(), set()
    for pid in pids:
        i, o = known[pid] if pid in known else target_pipes(pid)
        ins |= i
        outs |= o
    return ins, outs


def target_pipes(pid):
    """(pipes on its stdin, pipes on its stdout or stderr)."""
    return pipe_ends(pid, (0,)), pipe_ends(pid, (1, 2))


def line_editing(pid):
    """True when the terminal on the shell's stdin is out of canonical mode (a line editor,
    readline or zle, is reading it: the shell is at its prompt), False when in canonical mode,
    None when it cannot be read (no terminal there, no rights). The terminal is opened by its
    own device node, /dev/pts/N or /dev/ttyN, and only when that node is the very file the
    shell's fd 0 is (fdstat: cached attributes, as the scan reads them): reopening fd 0 itself
    asks its filesystem, which may be a FUSE mount that never answers."""
    try:
        held = fdstat.stat_open_file("/proc/%d/fd/0" % pid)
    except OSError:
        return None
    major, minor = os.major(held.st_rdev), os.minor(held.st_rdev)
    if not stat.S_ISCHR(held.st_mode) or not (136 <= major <= 143 or (major == 4 and minor < 64)):
        return None
    path = "/dev/pts/%d" % ((major - 136) * 256 + minor) if major != 4 else "/dev/tty%d" % minor
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino, st.st_rdev) != (held.st_dev, held.st_ino, held.st_rdev):
            return None  # another devpts instance's terminal of that number (a container's)
        return not termios.tcgetattr(fd)[3] & termios.ICANON
    except (OSError, termios.error):
        return None
    finally:
        os.close(fd)


# the system calls a line editor waits in (read, select, poll and their p- forms), by machine
_INPUT_WAITS = {"x86_64": {0, 7, 23, 270, 271}, "aarch64": {63, 72, 73}}


def waiting_for_input(pid):
    """Is the shell blocked in a read, select or poll (its line editor waiting for a key), False
    when it is in another call or running (between two commands of a list typed at the prompt:
    bash puts back the terminal mode its editor had, so the mode alone read "at its prompt"),
    None when it cannot be told (no rights to /proc/PID/syscall, another machine's numbers)."""
    try:
        with open("/proc/%d/syscall" % pid) as f:
            first = f.read().split(" ", 1)[0].strip()
    except OSError:
        return None
    waits = _INPUT_WAITS.get(os.uname().machine)
    if waits is None or first in ("", "-1"):
        return None if waits is None else False
    if first == "running":
        return False
    try:
        return int(first) in waits
    except ValueError:
        return None


def terminal_state(link, since_ticks, procs_now):
    """"gone", "idle" (at its prompt: its terminal's foreground group is its own and a line
    editor reads it, seen twice IDLE_SAMPLE_GAP_S apart), "busy" (its foreground job is one
    that was there before the teardown began, at `since_ticks`, and no target: `tail -f
    server.log`), "running" (something else is in its foreground: a loop typed at its prompt,
    between turns) or "unknown" (unreadable)."""
    looks = []
    for i in range(2):
        if i:
            time.sleep(IDLE_SAMPLE_GAP_S)
        if not procfs.same_process(link["pid"], link["start_time"]):
            return "gone"
        stat = procfs.read_stat(link["pid"])
        if stat is None or stat["tty_nr"] == 0:
            return "unknown"
        tpgid = stat["tpgid"]
        if tpgid == stat["pgid"]:
            editing = line_editing(link["pid"]) and waiting_for_input(link["pid"]) is not False
            looks.append("idle" if editing else ("unknown" if editing is None else "running"))
        else:
            looks.append(_foreground(tpgid, since_ticks, procs_now))
    return looks[0] if looks[0] == looks[1] else "running"


def _foreground(tpgid, since_ticks, procs_now):
    """"busy" when every live member of the foreground group (in the scan `procs_now`) predates
    the teardown, else "running"."""
    members = [(pid, info["start_time"]) for pid, info in procs_now.items()
               if info.get("pgid") == tpgid and not procfs.finished(info)]
    return "busy" if members and all(start < since_ticks for _, start in members) else "running"


def interrupt_loop(link, since_ticks, send, wait_s=1.0):
    """Ctrl-C at the prompt of a terminal's shell whose foreground job was a target: while the
    shell is not back at its prompt and its foreground group is led by a child of it started
    since the teardown began (`since_ticks`) that is a helper (a loop's backoff `sleep`, its next
    turn's pause), `send` (leader record, its pgid) is called once per such group, as typing
    Ctrl-C there would. Another program (`SERVER; python3 next_step.py` typed as a list) is the
    person's next command, never interrupted: the shell is then busy with it, and named.
    Returns the shell's state at the end (terminal_state's words, without the second look)."""
    deadline, sent = time.monotonic() + wait_s, set()
    while True:
        st = procfs.read_stat(link["pid"])
        if st is None or st["start_time"] != link["start_time"] or procfs.finished(st):
            return "gone"
        if st["tpgid"] == st["pgid"] and line_editing(link["pid"]):
            return "idle"
        leader = procfs.read_stat(st["tpgid"]) if st["tpgid"] > 0 else None
        if leader is not None and st["tpgid"] != st["pgid"] and leader["ppid"] == link["pid"] \
                and leader["start_time"] >= since_ticks and st["tpgid"] not in sent \
                and role(dict(leader, pid=st["tpgid"], argv=[])) == "helper":
            sent.add(st["tpgid"])
            send(leader, st["tpgid"])
        if time.monotonic() >= deadline:
            return "running"
        time.sleep(IDLE_SAMPLE_GAP_S)


def pinned_kill(pid, start):
    """A shell line that ends exactly this process: it checks the start time first, so a pid
    reused since sends nothing (field 22 of stat, counted after comm's closing parenthesis)."""
    return ("test \"$(sed 's/.*) //' /proc/%d/stat | cut -d' ' -f20)\" = %d && kill %d"
            % (pid, start, pid))
