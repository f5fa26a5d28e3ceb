"""/proc's pids listed from any pid on, so that every worker of a scan lists its own share.

Why: on a host of 20,000 processes, listing /proc is 28 ms of one core (os.scandir), and
when the agent's main thread listed it and handed the pids out to the scan's workers, that
was ~70 ms of the ~85 ms to the first SIGTERM, and again a third of each scan that confirms
FREED (bench/listing_probe.py, bench/presignal_probe.py --steps on a 16-core H200 host). The
kernel lists /proc's root in pid order from where the directory was seeked to (fs/proc/base.c,
proc_pid_readdir: position = pid + an offset), so the pids can be split in ranges that W
processes list at once: 16 workers list 20,000 pids in 5.6 ms (bench/listing_probe.py).

The whole account: docs/design-notes.md (scripts/agent/procs/pidrange.py)."""
import ctypes
import os
import struct

from . import libcall

CHUNK = 64  # pids a chunk spans: a 20,000-pid band is ~300 chunks, ~2-3 for each of 128 shards
MAX_ENTRY = 32  # bytes of a /proc pid entry: the 19-byte header and a name of up to 7 digits, 8-aligned
MAX_BATCH = 1024  # entries one read asks for
_SYSCALL_NR = {"x86_64": 217, "aarch64": 61}
_HEADER = struct.Struct("<QqH")  # d_ino, d_off, d_reclen (d_type and the name follow)


class Lister:
    """One open /proc directory: pids from a given pid on, in batches."""

    def __init__(self, proc, getdents, offset):
        self.fd = os.open(proc, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self.proc, self.getdents, self.offset = proc, getdents, offset
        self.buf = ctypes.create_string_buffer(MAX_BATCH * MAX_ENTRY)

    def fresh(self):
        """Another Lister of the same directory and offset, with a file position of its own (a
        forked worker must not share this one's: a seek there would move it here)."""
        return Lister(self.proc, self.getdents, self.offset)

    def close(self):
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def entries(self, count):
        """[(name, d_off)] of up to `count` entries from where the directory stands; [] at its end.
        Raises OSError when the read fails."""
        n = self.getdents(self.fd, self.buf, min(count, MAX_BATCH) * MAX_ENTRY)
        if n < 0:
            raise OSError(ctypes.get_errno(), "getdents64 on /proc")
        data, at, out = self.buf.raw[:n], 0, []
        while at < n:
            _, off, reclen = _HEADER.unpack_from(data, at)
            out.append((data[at + 19:data.index(b"\0", at + 19)], off))
            at += reclen
        return out

    def seek(self, pid):
        os.lseek(self.fd, self.offset + pid, os.SEEK_SET)

    def pids(self, count):
        """Up to `count` pids from where the directory stands (in order); [] at its end."""
        return [int(name) for name, _ in self.entries(count) if name.isdigit()]


_OFFSETS: dict = {}  # proc path -> the offset learnt (None: this kernel seeks otherwise), once per agent


def open_lister(proc="/proc"):
    """A Lister whose seek to a pid was seen to start the listing at that pid, or None (no
    getdents64 here, /proc not readable, PID 1 not shown to us, or a kernel that does not seek
    as fs/proc/base.c does now)."""
    getdents = libcall.find("getdents64", _SYSCALL_NR)
    if getdents is None or _OFFSETS.get(proc, 0) is None:
        return None
    try:
        lister = Lister(proc, getdents, _OFFSETS.get(proc, 0))
    except OSError:
        return None
    try:
        if proc not in _OFFSETS:
            _OFFSETS[proc] = _learn_offset(lister)
        lister.offset = _OFFSETS[proc]
    except (OSError, ValueError):
        lister.offset = None
    if lister.offset is None:
        lister.close()
        return None
    return lister


def _learn_offset(lister):
    """The position of pid 0 in /proc's root, from the first two pids one read lists (a pid's
    d_off is the next pid's position), then checked on PID 1, which lives as long as its PID
    namespace (any other pid may come or go meanwhile): a seek to pid 0 and to pid 1 each list
    PID 1 first. An offset one too large would skip the first pid of every chunk, and fails
    that check; one too small would list one pid more, which its chunk's owner alone keeps.
    None where the check fails (or PID 1 is hidden from us: hidepid)."""
    named: list = []
    for _ in range(4):  # /proc's own files come first (~70), then the pids
        got = lister.entries(128)
        if not got:
            break
        named = [(int(name), off) for name, off in got if name.isdigit()]
        if len(named) >= 2:
            break
    if len(named) < 2:
        return None
    offset = named[0][1] - named[1][0]
    if offset <= 0:
        return None
    lister.offset = offset
    for pid in (0, 1):
        lister.seek(pid)
        if lister.pids(1)[:1] != [1]:
            return None
    return offset


def threads_on_host(proc="/proc"):
    """The kernel's count of tasks (threads included: at least the processes), or None."""
    try:
        with open("%s/loadavg" % proc) as f:
            return int(f.read().split()[3].split("/")[1])
    except (OSError, IndexError, ValueError):
        return None


def shard(lister, k, shards, chunk=CHUNK):
    """Shard k's pids (of `shards`): those in chunks j with j mod shards == k, ascending.
    Each chunk is read from a seek to its first pid (_want: how much a read asks for), and a
    read that lands past the chunk jumps to this shard's next chunk from there."""
    density = 1.0
    j = k
    while True:
        start = j * chunk
        lister.seek(start)
        batch = lister.pids(_want(chunk, density))
        if not batch:
            return
        while True:
            for pid in batch:
                if (pid // chunk) % shards == k:
                    yield pid
            last = batch[-1]
            density = min(1.0, max(len(batch) / float(last - start + 1), 1.0 / chunk))
            end = (last // chunk + 1) * chunk
            if (last // chunk) % shards != k or last + 1 >= end:
                break
            batch = lister.pids(_want(end - last - 1, density))  # the rest of this chunk, read on
            if not batch:
                return
            start = last + 1
        after = last // chunk + 1
        j = after + (k - after) % shards


def shard_list(lister, k, shards, listing):
    """shard()'s pids as a list, from a Lister of its own; where the seeked listing fails, the
    same pids taken from `listing` (every pid, as procscan.listing lists them: never fewer)."""
    own = None
    try:
        own = lister.fresh()
        return list(shard(own, k, shards))
    except OSError:
        return sorted(p for p in listing() if (p // CHUNK) % shards == k)
    finally:
        if own is not None:
            own.close()


def _want(span, density):
    """Entries to ask for: a little less than what `span` pids hold at `density` (4 to
    MAX_BATCH): a read that falls short is read on from where it stopped, for one more system
    call; one past the chunk's end lists pids another worker lists again (asking for all of it,
    a 20,000-pid band was listed 1.25 to 1.55 times over; 0.8 of it, 1.13 times)."""
    return max(4, min(MAX_BATCH, int(span * density * 0.8) + 2))


def estimate(lister, samples=64, width=8):
    """About how many pids /proc lists: the highest pid found by halving, then the density at
    `samples` points spread up to it (the span `width` pids take there). Costs 1-3 ms; an
    estimate only (it picks how many workers a scan is worth)."""
    lister.seek(0)
    low = lister.pids(1)
    if not low:
        return 0
    lo, hi = low[0], 1 << 22  # PID_MAX_LIMIT
    top = lo
    while lo <= hi:  # the highest pid: the largest x from which something is listed
        mid = (lo + hi) // 2
        lister.seek(mid)
        got = lister.pids(1)
        if got:
            top = max(top, got[0])
            lo = got[0] + 1
        else:
            hi = mid - 1
    base = low[0]
    span = top - base + 1
    step = max(1, span // samples)
    total = 0.0
    for x in range(base, top + 1, step):
        lister.seek(x)
        got = lister.pids(width)
        if not got:
            continue
        if len(got) < width or got[-1] >= x + step:  # the whole step read
            total += sum(1 for p in got if p < x + step)
        else:
            total += len(got) * step / float(got[-1] - x + 1)
    return int(total)
