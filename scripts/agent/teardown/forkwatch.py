"""Learn, while a teardown runs, every process its targets fork, double forks included.

Why: a teardown SIGTERMs its targets and then waits. A server may fork while it handles
SIGTERM, and a holder may double-fork (a child forks a grandchild and exits at once) so
that the grandchild is re-parented to PID 1 or a subreaper before any /proc poll sees the
middle link. A /proc ppid walk can then never connect the grandchild to the target, and a
teardown that only walks /proc never signals it. The kernel's process-events connector
reports every fork as it happens, with the forking process, so the chain is kept even when
the middle link lives for a microsecond.

The whole account: docs/design-notes.md (scripts/agent/teardown/forkwatch.py)."""
import errno
import os
import select
import socket
import struct
import sys
import threading
import time

from ..procs import procfs

NETLINK_CONNECTOR = 11
CN_IDX_PROC = 1
CN_VAL_PROC = 1
PROC_CN_MCAST_LISTEN = 1
PROC_CN_MCAST_IGNORE = 2
PROC_EVENT_FORK = 0x00000001
PROC_EVENT_EXIT = 0x80000000
NLMSG_DONE = 3
SO_RCVBUFFORCE = 33  # root may exceed net.core.rmem_max; not in Python's socket module
PROC_PID_INIT_INO = 0xEFFFFFFC  # include/linux/proc_ns.h

RCVBUF = 8 << 20          # ~10k events: a burst of thread exits in a big server fits
SELF_TEST_S = 0.2
FULL_EVERY_S = 1.0
MAX_EVENTS_PER_POLL = 200000

_NLMSG = struct.Struct("=IHHII")      # len, type, flags, seq, pid
_CNMSG = struct.Struct("=IIIIHH")     # cb_id.idx, cb_id.val, seq, ack, len, flags
_EVHDR = struct.Struct("=IIQ")        # what, cpu, timestamp_ns
_EVDATA = struct.Struct("=IIII")      # fork: parent_pid, parent_tgid, child_pid, child_tgid
_EV_OFF = _NLMSG.size + _CNMSG.size   # 36: struct proc_event inside one netlink message
_DATA_OFF = _EV_OFF + _EVHDR.size     # 52: its event_data union

# The socket filter (classic BPF, SO_ATTACH_FILTER) that keeps process forks and exits only
# (ForkWatch._filter). Its loads read big-endian; the event's fields are the host's order, so
# the constants are compared as those bytes read big-endian, and the pid == tgid tests compare
# two fields read the same way.
SO_ATTACH_FILTER = 26
_LD_ABS, _JEQ_K, _JEQ_X, _TAX, _RET_K = 0x20, 0x15, 0x1D, 0x07, 0x06


def _as_loaded(value):
    return struct.unpack(">I", struct.pack("=I", value))[0]


_PROCESS_EVENTS = (
    (_LD_ABS, 0, 0, _EV_OFF),                              # 0: what
    (_JEQ_K, 1, 0, _as_loaded(PROC_EVENT_FORK)),           # 1: fork -> 3
    (_JEQ_K, 4, 9, _as_loaded(PROC_EVENT_EXIT)),           # 2: exit -> 7, else drop
    (_LD_ABS, 0, 0, _DATA_OFF + 8),                        # 3: child pid
    (_TAX, 0, 0, 0),                                       # 4
    (_LD_ABS, 0, 0, _DATA_OFF + 12),                       # 5: child tgid
    (_JEQ_X, 4, 5, 0),                                     # 6: a process (pid == tgid) -> keep, else drop
    (_LD_ABS, 0, 0, _DATA_OFF),                            # 7: exiting pid
    (_TAX, 0, 0, 0),                                       # 8
    (_LD_ABS, 0, 0, _DATA_OFF + 4),                        # 9: its tgid
    (_JEQ_X, 0, 1, 0),                                     # 10: the process itself -> keep, else drop
    (_RET_K, 0, 0, 0xFFFFFFFF),                            # 11: keep
    (_RET_K, 0, 0, 0),                                     # 12: drop
)


def _fprog(program):
    """struct sock_fprog for setsockopt: its length and a pointer to the instructions, which
    stay alive in the returned object until the call has copied them."""
    import ctypes  # here: only a connector watch needs it (procscan has loaded it already)

    code = b"".join(struct.pack("=HBBI", *insn) for insn in program)

    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    buf = ctypes.create_string_buffer(code, len(code))
    prog = Prog(len(program), ctypes.addressof(buf))
    return _Pinned(bytes(prog), buf)


class _Pinned(bytes):
    """The bytes of a sock_fprog, holding the buffer its pointer names."""

    keep = None

    def __new__(cls, data, keep):
        obj = super().__new__(cls, data)
        obj.keep = keep
        return obj


def _control(op):
    """A netlink message carrying a PROC_CN_MCAST_* op to the connector."""
    body = _CNMSG.pack(CN_IDX_PROC, CN_VAL_PROC, 0, 0, 4, 0) + struct.pack("=I", op)
    return _NLMSG.pack(_NLMSG.size + len(body), NLMSG_DONE, 0, 0, 0) + body


def _in_child_pid_namespace():
    """True when our PID namespace is not the initial one (whose nsfs inode is the fixed
    PROC_PID_INIT_INO): the connector's PIDs would be the host's, so fail at once instead
    of waiting out the self-test (which stays the authority either way)."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino != PROC_PID_INIT_INO
    except OSError:
        return False


def read_stat(pid, proc=procfs.PROC):
    """procfs.read_stat's fields, read with one os.open/os.read: a full walk reads every
    /proc/PID/stat of the host, and this is about three times cheaper than open().read().
    None when the process is gone or the file does not parse."""
    try:
        fd = os.open("%s/%d/stat" % (proc, pid), os.O_RDONLY)
    except OSError:
        return None
    try:
        raw = os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        rest = raw[raw.rindex(b")") + 2:].split()
        return {"pid": pid, "state": rest[0].decode(), "ppid": int(rest[1]), "pgid": int(rest[2]),
                "sid": int(rest[3]), "start_time": int(rest[19])}
    except (ValueError, IndexError):
        return None


class ForkWatch:
    """Processes forked by the roots or their descendants; see the module docstring."""

    def __init__(self, proc=procfs.PROC):
        self.mode = "proc"
        self.lost = False
        self.note = ""
        self._proc = proc
        self._sock = None
        self._buf = bytearray(8192)
        self._roots = set()
        self._tracked = {}    # pid -> start time (None: fork seen, stat not read yet)
        self._dead = set()    # tracked pids seen exiting: their pid may now be reused
        self._exited = set()  # tracked pids whose EXIT event was read: no fork of theirs can follow it
        self._lineage = {}    # pid -> [parent, grandparent, ..., root] when it was learned
        self._leaders = set()  # tracked pids seen leading their own session
        self._groups = {}     # tracked pid -> (pgid, sid) when its stat was read
        self._pending = {}    # connector: forks seen whose start time is not read yet
        self._fresh = {}      # pid -> (start, parent): learned, not yet returned by poll()
        self._reported = set()  # (pid, start) returned by poll(), roots included
        self._listed = set()  # names in /proc at the last walk
        self._last_seen = None  # last pid handed out, at the last walk
        self._next_full = 0.0
        self._gap = False     # events were dropped: a full /proc walk is owed
        self._listening = False
        self._selftest: tuple = (0, 0.0)  # (thread id, deadline) of the self-test's fork, once subscribed

    # ---------------------------------------------------------------- start / close

    @classmethod
    def start(cls, roots, connector=True, rcvbuf=RCVBUF, proc=procfs.PROC, listed=None, walk=True):
        """Watch the descendants of `roots` ((pid, start_time) pairs). Never raises: a root
        whose start time no longer matches is left out (its pid names someone else now) and
        any failure of the connector leaves mode "proc" with the reason in `note`.
        `connector=False` forces the /proc view; `rcvbuf` sizes the event buffer. `listed`:
        the pids of a scan just made, whose descendants of the roots ARE the roots (a plan
        takes a target's whole tree): the first walk then reads only pids new since, not
        every process's stat again (20,000 reads, 0.3 s before the first signal on a big host).
        `walk` False: subscribe only; begin() adds the roots and makes the first walk later (the
        teardown subscribes before its scan, so every fork from then on is queued, and learns
        its roots from the plan)."""
        w = cls(proc)
        notes: list = []
        try:
            w._add_roots(roots, notes)
        except Exception as e:  # a bad roots iterable: watch nothing rather than raise
            notes.append("roots not usable: %s" % e)
        backlog = None
        if not connector:
            notes.append("connector not requested")
        else:
            try:
                if walk:
                    backlog = w._open(rcvbuf)
                else:
                    w._subscribe(rcvbuf)  # confirmed in begin(), after the scan
            except Exception as e:
                w._close_socket()
                notes.append("connector not used: %s" % e)
        w.note = "; ".join(notes)
        if walk:
            w._first_walk(listed, backlog)
        return w

    def begin(self, roots, listed=None):
        """The roots and the first walk of a watch started with walk=False (see start)."""
        notes = [self.note] if self.note else []
        try:
            self._add_roots(roots, notes)
        except Exception as e:
            notes.append("roots not usable: %s" % e)
        backlog = None
        if self._sock is not None:
            try:
                backlog = self._confirm()
            except Exception as e:
                self._close_socket()
                notes.append("connector not used: %s" % e)
        self.note = "; ".join(notes)
        self._first_walk(listed, backlog)

    def _first_walk(self, listed, backlog):
        if listed is not None:
            self._listed = {str(pid) for pid in listed}
        try:
            self._walk(full=listed is None)
        except OSError as e:
            self.note = (self.note + "; " if self.note else "") + "/proc not readable: %s" % e
        if backlog is not None:
            self._replay(backlog)
        self._next_full = time.monotonic() + FULL_EVERY_S

    def _add_roots(self, roots, notes):
        for item in roots:
            pid, start = int(item[0]), int(item[1])
            if pid <= 0:
                notes.append("root pid %d ignored" % pid)
                continue
            st = read_stat(pid, self._proc)
            if st is not None and st["start_time"] != start:
                notes.append("root %d ignored: its pid names another process now" % pid)
                continue
            self._roots.add(pid)
            self._tracked[pid] = start
            self._lineage[pid] = []
            self._reported.add((pid, start))
            if st is None or st["state"] in ("Z", "X"):
                self._dead.add(pid)
            else:
                self._note_stat(pid, st)

    def _open(self, rcvbuf):
        """Subscribe and self-test; returns the events read meanwhile (replayed after the
        first walk, so nothing forked between the two is lost). Raises when unusable."""
        self._subscribe(rcvbuf)
        return self._confirm()

    def _subscribe(self, rcvbuf):
        """Join the connector's group and fork the self-test's thread; its event is looked
        for by _confirm, which may come later (a watch started with walk=False: the scan runs
        meanwhile, and a loaded host's event has had that long to arrive). Raises when unusable."""
        if not sys.platform.startswith("linux"):
            raise OSError("not Linux")
        if _in_child_pid_namespace():
            raise OSError("in a PID namespace (the connector reports the host's PIDs)")
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_CONNECTOR)
        self._sock = sock
        try:
            sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, rcvbuf)
        except OSError:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.bind((0, CN_IDX_PROC))
        sock.setblocking(False)
        sock.send(_control(PROC_CN_MCAST_LISTEN))
        self._listening = True
        tid: list = []
        t = threading.Thread(target=lambda: tid.append(threading.get_native_id()), name="forkwatch-selftest")
        t.start()
        t.join()
        self._selftest = (tid[0], time.monotonic() + SELF_TEST_S)

    def _confirm(self):
        """Wait (up to SELF_TEST_S from the subscription) for the self-test's fork event;
        returns every event read meanwhile. Raises when it does not come."""
        tid, deadline = self._selftest
        sock, me = self._sock, os.getpid()
        assert sock is not None  # subscribed
        backlog = []
        while True:
            batch = self._read_events()
            backlog.extend(batch)
            if any(ev[0] == PROC_EVENT_FORK and ev[3] == tid and ev[4] == me for ev in batch):
                self.mode = "connector"
                self._filter()
                return backlog
            left = deadline - time.monotonic()
            if left <= 0:
                raise OSError("self-test: no fork event with our pid %d within %d ms (PID namespace, "
                              "no CAP_NET_ADMIN, or another network namespace)" % (me, SELF_TEST_S * 1000))
            select.select([sock], [], [], left)

    def _filter(self):
        """Have the kernel queue only what _event reads: a process's fork (not a new thread) and
        a process's exit (not a thread's); every other event (exec, uid, comm, a thread made or
        ended) is dropped before it takes room in the socket's buffer. Why: a host's GPU servers
        make and end threads by the thousand; their events filled the buffer while the agent was
        busy (ENOBUFS), and a holder double-forked with setsid in that gap could no longer be tied
        to its target from /proc. After the self-test, which needs a thread's event.
        A kernel that refuses the filter (no SO_ATTACH_FILTER) keeps every event: noted."""
        sock = self._sock
        if sock is None:
            return
        try:
            sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, _fprog(_PROCESS_EVENTS))
        except (OSError, ValueError, TypeError) as exc:
            self.note = (self.note + "; " if self.note else "") + "event filter not attached: %s" % exc

    def close(self):
        """Unsubscribe (older kernels keep a global listener count that makes every fork on
        the host pay for the connector until it drops to zero) and close the socket."""
        self._close_socket()

    def _close_socket(self):
        sock, self._sock = self._sock, None
        if sock is None:
            return
        try:
            if self._listening:
                sock.send(_control(PROC_CN_MCAST_IGNORE))
        except OSError:
            pass
        sock.close()
        if self.mode == "connector":
            self.mode = "proc"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self._close_socket()
        except Exception:
            pass

    # ---------------------------------------------------------------- public views

    def poll(self):
        """[(pid, start_time, parent_pid)] of descendants learned since the last poll and
        alive when their /proc/PID/stat was read; ones already gone are skipped. parent_pid
        is the process that forked it as the watch saw it, or for a process tied only by its
        session (proc view, after a double fork) the session's leader."""
        if self._sock is not None:
            self._poll_connector()
        else:
            now = time.monotonic()
            full = now >= self._next_full
            if full:
                self._next_full = now + FULL_EVERY_S
            self._walk(full)
        if self._gap:
            self._gap = False
            self._walk(full=True)
        return self._flush()

    def fileno(self):
        """The connector socket's fd, to wait on beside the targets' pidfds (a fork wakes
        the waiter at once); None in the /proc view, which has nothing to wait on."""
        return None if self._sock is None else self._sock.fileno()

    def lineage(self, pid):
        """Ancestors of pid as the watch saw them, nearest first, ending at a root:
        [812, 800] reads "forked by 812, which root 800 forked". [] for a root or a pid the
        watch does not know."""
        return list(self._lineage.get(pid, []))

    def kin(self, pid):
        """How a process the watch does not count as a descendant is tied to the tracked
        ones through /proc, strongest first, as words; None when it is not.
        "in the session led by N": proof of descent from N (see the module docstring).
        "in the process group led by N": N or its descendants made the group; a shell can
          still move a process of the same session into it (a pipeline's `| tee`).
        "shares process group G with N" / "shares session S with N": the group or session
          of the tracked N was made by someone untracked (a launching script, a login shell),
          so this only says the two were started from the same place."""
        st = read_stat(pid, self._proc)
        if st is None:
            return None
        pgid, sid = st["pgid"], st["sid"]
        if sid != pid and sid in self._leaders:
            return "in the session led by %d" % sid
        if pgid != pid and self._groups.get(pgid, (None, None))[0] == pgid:
            return "in the process group led by %d" % pgid
        groups = sorted(self._groups.items())
        for tracked, (tpgid, _) in groups:
            if tracked != pid and pgid == tpgid:
                return "shares process group %d with %d" % (pgid, tracked)
        for tracked, (_, tsid) in groups:
            if tracked != pid and sid == tsid:
                return "shares session %d with %d" % (sid, tracked)
        return None

    # ---------------------------------------------------------------- connector

    def _read_events(self):
        """Every event queued on the socket now, as (what, a, b, c, d) tuples. An overflow
        sets `lost` and owes a /proc walk; another socket error drops to the proc view."""
        out: list = []
        sock, buf = self._sock, self._buf
        while sock is not None and len(out) < MAX_EVENTS_PER_POLL:
            try:
                n = sock.recv_into(buf)
            except BlockingIOError:
                break
            except OSError as e:
                if e.errno == errno.ENOBUFS:
                    self.lost = True
                    self._gap = True
                    continue
                self.note = (self.note + "; " if self.note else "") + "connector failed: %s" % e
                self.lost = True
                self._gap = True
                self._close_socket()
                break
            off = 0
            while off + _NLMSG.size <= n:
                length, kind = _NLMSG.unpack_from(buf, off)[:2]
                if length < _NLMSG.size or off + length > n:
                    break
                if kind == NLMSG_DONE and length >= _DATA_OFF + _EVDATA.size:
                    idx, val = _CNMSG.unpack_from(buf, off + _NLMSG.size)[:2]
                    if idx == CN_IDX_PROC and val == CN_VAL_PROC:
                        what = _EVHDR.unpack_from(buf, off + _EV_OFF)[0]
                        if what in (PROC_EVENT_FORK, PROC_EVENT_EXIT):
                            out.append((what,) + _EVDATA.unpack_from(buf, off + _DATA_OFF))
                off += (length + 3) & ~3
        return out

    def _event(self, ev):
        what, a, b, c, d = ev
        if what == PROC_EVENT_FORK:
            # a, b = parent pid, parent tgid; c, d = child pid, child tgid. A new thread
            # (c != d) names its process's parent as parent: not a fork, skip it.
            if c != d:
                return
            # A tracked parent whose EXIT event came before this fork cannot have made it: its
            # pid names a stranger now (whose own creation event we may have lost), so nothing
            # is chained through it. Events come in the order they happened, so a parent that
            # is merely known dead (its stat read found it gone) still chains the forks queued
            # before its exit: a middle link that forks the holder and exits before we read
            # its stat (a busy machine). The price: a process whose main thread
            # exited while other threads live and fork.
            if b in self._tracked and b not in self._exited:
                self._learn(d, b, None)
                self._fresh.pop(d, None)
                self._pending[d] = b
            elif d in self._tracked and (d in self._dead or d in self._exited):
                self._forget(d)  # a dead descendant's pid, reused by a stranger
        elif what == PROC_EVENT_EXIT and a == b and a in self._tracked:
            self._dead.add(a)
            self._exited.add(a)
            self._pending.pop(a, None)
            self._fresh.pop(a, None)

    def _replay(self, backlog):
        """Events read during the self-test, after the first walk: the walk saw a newer
        state than they describe, so they may add what it missed, never undo what it saw."""
        seen = set(p for p, s in self._tracked.items() if s is not None and p not in self._dead)
        for ev in backlog:
            what, a, b, c, d = ev
            if what == PROC_EVENT_FORK and (d in seen or b not in self._tracked):
                continue
            if what == PROC_EVENT_EXIT and a in seen:
                continue
            self._event(ev)

    def _poll_connector(self):
        for ev in self._read_events():
            self._event(ev)
        for _ in range(3):
            if not self._pending:
                break
            for pid in list(self._pending):
                parent = self._pending.pop(pid)
                st = read_stat(pid, self._proc)
                if st is None or st["state"] in ("Z", "X"):
                    self._dead.add(pid)
                    continue
                self._tracked[pid] = st["start_time"]
                self._note_stat(pid, st)
                self._fresh[pid] = (st["start_time"], parent)
            # An exit (or an exit and a reuse) between the fork event and our read shows up
            # here, after the read: drop those rather than report a stranger's start time.
            for ev in self._read_events():
                self._event(ev)

    # ---------------------------------------------------------------- /proc

    def _walk(self, full):
        """Learn descendants from /proc. Incremental: only pids that are new since the last
        listing are read (an old pid cannot become a descendant: ppid changes only to a
        subreaper above it, sid only by setsid); full: every stat is re-read, which also
        notices a tracked pid reused between two listings. An incremental walk first reads
        the last pid handed out (/proc/loadavg, our PID namespace): unchanged means nothing
        was created, so the listdir of /proc (about 0.5 ms with 1000 processes) is skipped."""
        last = self._last_pid()
        if not full and last is not None and last == self._last_seen:
            return
        self._last_seen = last
        names = set(os.listdir(self._proc))
        fresh = names if full else names - self._listed
        self._listed = names
        for pid in self._tracked:
            if pid not in self._dead and str(pid) not in names and pid not in self._pending:
                self._dead.add(pid)
        stats = {}
        for name in fresh:
            if not name.isdigit():
                continue
            pid = int(name)
            st = read_stat(pid, self._proc)
            if st is None:
                continue
            known = self._tracked.get(pid, -1)
            if pid in self._tracked and pid not in self._pending and known != st["start_time"]:
                self._forget(pid)  # the pid names another process now
            if pid in self._tracked:
                if st["state"] in ("Z", "X"):
                    self._dead.add(pid)
                else:
                    self._dead.discard(pid)
                    self._note_stat(pid, st)
            else:
                stats[pid] = st
        verdict: dict = {}
        for pid in stats:
            self._classify(pid, stats, verdict)
        for pid, parent in sorted(verdict.items()):
            if parent is None:
                continue
            st = stats[pid]
            if st["state"] in ("Z", "X"):
                continue
            self._learn(pid, parent, st["start_time"])
            self._note_stat(pid, st)
            self._fresh[pid] = (st["start_time"], parent)

    def _last_pid(self):
        try:
            with open("%s/loadavg" % self._proc, "rb") as f:
                return f.read().split()[4]
        except (OSError, IndexError):
            return None

    def _classify(self, pid, stats, verdict):
        """Set verdict[pid] (and for every untracked pid above it read in this walk) to the
        parent through which it descends from a tracked process, or None. Follows ppid
        through other new pids (a new child of a new child); a link with no such parent
        still descends from the leader of its session when that leader is tracked."""
        chain = []
        cur = pid
        while cur not in verdict:
            chain.append(cur)
            ppid = stats[cur]["ppid"]
            if ppid in self._tracked and ppid not in self._dead:
                verdict[cur] = ppid
                chain.pop()
                break
            if ppid not in stats or ppid in chain:
                break
            cur = ppid
        for link in reversed(chain):  # top first: each link's ppid is decided before it
            ppid = stats[link]["ppid"]
            if verdict.get(ppid) is not None:
                verdict[link] = ppid
                continue
            sid = stats[link]["sid"]
            verdict[link] = sid if sid != link and sid in self._leaders else None

    # ---------------------------------------------------------------- bookkeeping

    def _learn(self, pid, parent, start):
        self._tracked[pid] = start
        self._dead.discard(pid)
        self._exited.discard(pid)
        self._lineage[pid] = [parent] + self._lineage.get(parent, [])

    def _note_stat(self, pid, st):
        self._groups[pid] = (st["pgid"], st["sid"])
        if st["sid"] == pid:
            self._leaders.add(pid)

    def _forget(self, pid):
        for table in (self._tracked, self._lineage, self._groups, self._pending, self._fresh):
            table.pop(pid, None)
        self._dead.discard(pid)
        self._exited.discard(pid)
        self._leaders.discard(pid)

    def _flush(self):
        out = []
        for pid, (start, parent) in sorted(self._fresh.items()):
            if (pid, start) in self._reported or pid in self._dead:
                continue
            self._reported.add((pid, start))
            out.append((pid, start, parent))
        self._fresh.clear()
        return out
