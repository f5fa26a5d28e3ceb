"""Run one function over a list in forked workers, one per core the agent may use.

Why: the holder scan reads a few /proc files of EVERY process (stat, cmdline, its fd table,
its maps), before the first signal and again to confirm FREED. On a host of 20,000 processes
(DataLoader workers, Ray, many containers) that was 1.6 s a scan on one core, twice `fuser`,
and seconds before the first SIGTERM. The reads are independent system calls, so the list is
split across forked workers (the standard library only: the agent runs on any Python >= 3.8,
and multiprocessing's start-up would cost more than it saves).

Each worker sends its share back in pieces through a pipe, each piece a frame of marshal data
(dicts, lists, tuples, sets, str, int, None: what a scan record is made of), and this process
loads the pieces as they come, while the workers still read /proc: loading 20,000 records
takes this process about as long as a worker takes to read its share, so it must not wait
for the end to start. A worker that fails, or cannot be started, costs only speed: the pieces
it did not send are run here, so the answer is the same as a one-core scan's.

A worker runs nothing but `func` and leaves through os._exit: no atexit handler, no buffered
output of the agent's is flushed twice, and nothing of the GPU source (NVML, opened on a
thread of the agent) is touched in it.
"""
import marshal
import os
import select
import struct

MIN_PER_WORKER = 250  # items: below this a fork (and its copied page tables) costs more than it saves
PIECE = 250           # items a frame carries: small enough that loading overlaps the reading
_HEAD = struct.Struct("<II")  # piece index, payload length
HERE_MAX = 4  # with this many workers or fewer, loading their pieces is little: this process reads a share too


def cores():
    """The cores this process may run on (its affinity: a container's cpuset), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def workers_for(count):
    """How many workers a list of `count` items is worth on this host."""
    return max(1, min(cores(), count // MIN_PER_WORKER))


def map_pieces(func, items, workers, piece=PIECE, first=None, on_first=None):
    """[func(p) for every piece p of items], in no set order, each piece run in one of
    `workers` forked workers (interleaved shares, items[i::n]: neighbouring pids are often
    alike, a server's workers or a container's processes, so shares cost about the same).

    `first(share)`, when given, runs in each worker before its pieces and is sent ahead of
    them (a worker may keep what it read there for func: it runs in the same process);
    `on_first([first(share), ...])` is called here once, as soon as every share's answer is
    in (a share whose worker failed gets first(share) run here), while the workers go on
    with the pieces: what needs only the first stage is not kept waiting for the rest."""
    if workers <= 1 or len(items) < 2:
        if first is not None:
            on_first([first(items)])
        return [func(items)]
    shares = [items[i::workers] for i in range(workers)]
    pieces = [[share[j:j + piece] for j in range(0, len(share), piece)] for share in shares]
    here = workers <= HERE_MAX  # few workers: this process reads a share too, loading the rest after
    running = {}
    for w, mine in enumerate(pieces):
        fd, pid = _start(func, mine, first and (lambda s=shares[w]: first(s))) if w or not here else (None, None)
        if fd is not None:
            running[fd] = (pid, w, bytearray())
    firsts = _Firsts(first, on_first, shares, running, here)
    done: dict = {}
    if here:
        firsts.got(0, first(shares[0]) if first is not None else None)
        done.update({(0, j): func(p) for j, p in enumerate(pieces[0])})
    _gather(running, done, firsts)
    firsts.finish()
    return [done[(w, j)] if (w, j) in done else func(p) for w, mine in enumerate(pieces) for j, p in enumerate(mine)]


FIRST = 0xFFFFFFFF  # the piece index of a frame carrying a share's first-stage answer


class _Firsts:
    """The first-stage answers of the shares as they come; on_first once all are in."""

    def __init__(self, first, on_first, shares, running, here):
        self.first, self.on_first, self.shares = first, on_first, shares
        self.answers: dict = {}
        self.waiting = set(range(len(shares))) if first is not None else set()
        self.called = first is None
        started = {w for _, w, _ in running.values()} | ({0} if here else set())
        for w in self.waiting - started:  # no worker could be started for it: run here
            self.got(w, first(shares[w]))

    def got(self, w, answer):
        if self.called or w not in self.waiting:
            return
        self.answers[w] = answer
        self.waiting.discard(w)
        if not self.waiting:
            self.called = True
            self.on_first([self.answers[k] for k in sorted(self.answers)])

    def ended(self, w):
        """A worker ended: a first answer it never sent is made here."""
        if w in self.waiting:
            self.got(w, self.first(self.shares[w]))

    def finish(self):
        for w in sorted(self.waiting):
            self.got(w, self.first(self.shares[w]))


def _start(func, pieces, first=None):
    """(read fd, pid) of a worker sending first() (when given) and then func(piece) for each
    piece, (None, None) when none could be started (no fds or processes left: its pieces are
    run here)."""
    try:
        r, w = os.pipe()
    except OSError:
        return None, None
    try:
        pid = os.fork()
    except OSError:
        os.close(r)
        os.close(w)
        return None, None
    if pid == 0:  # the worker
        code = 1
        try:
            os.close(r)
            if first is not None:
                data = marshal.dumps(first())
                _write_all(w, _HEAD.pack(FIRST, len(data)) + data)
            for j, piece in enumerate(pieces):
                data = marshal.dumps(func(piece))
                _write_all(w, _HEAD.pack(j, len(data)) + data)
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    return r, pid


def _gather(running, done, firsts):
    """Read every worker's frames as they come and load each; {(worker, piece): result}; a
    first-stage frame goes to `firsts` (a _Firsts)."""
    poller = select.poll()
    for fd in running:
        poller.register(fd, select.POLLIN)
    while running:
        for fd, _ in poller.poll():
            pid, w, buf = running[fd]
            chunk = os.read(fd, 1 << 20)
            if chunk:
                buf += chunk
                _frames(buf, w, done, firsts)
                continue
            poller.unregister(fd)
            os.close(fd)
            del running[fd]
            try:
                os.waitpid(pid, 0)  # a worker that died sent fewer frames: the rest is run here
            except ChildProcessError:  # SIGCHLD ignored (inherited from a service manager): reaped already
                pass
            firsts.ended(w)


def _frames(buf, w, done, firsts):
    """Load the complete frames at the start of buf, and drop them from it: once per read, not
    once per frame (dropping a frame from the front of a bytearray moves all that follows it,
    and a read brings many frames)."""
    view, at = memoryview(buf), 0
    try:
        while len(buf) - at >= _HEAD.size:
            j, size = _HEAD.unpack_from(buf, at)
            end = at + _HEAD.size + size
            if len(buf) < end:
                break
            try:
                answer = marshal.loads(view[at + _HEAD.size:end])
            except (EOFError, ValueError, TypeError):
                answer = None  # run here instead
            else:
                if j == FIRST:
                    firsts.got(w, answer)
                else:
                    done[(w, j)] = answer
            at = end
    finally:
        view.release()
    del buf[:at]


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
