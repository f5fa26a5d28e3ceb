"""Run one function over a list in forked workers, one per core the agent may use.

Why: the holder scan reads a few /proc files of EVERY process (stat, cmdline, its fd table,
its maps), before the first signal and again to confirm FREED. On a host of 20,000 processes
(DataLoader workers, Ray, many containers) that was 1.6 s a scan on one core, twice `fuser`,
and seconds before the first SIGTERM. The reads are independent system calls, so the list is
split across forked workers (the standard library only: the agent runs on any Python >= 3.8,
and multiprocessing's start-up would cost more than it saves).

The whole account: docs/design-notes.md (scripts/agent/procs/fanout.py)."""
import fcntl
import marshal
import os
import select
import struct

from . import procfs

MIN_PER_WORKER = 250  # items: below this a fork (and its copied page tables) costs more than it saves
PIECE = 250           # items a frame carries: small enough that loading overlaps the reading
_HEAD = struct.Struct("<II")  # piece index, payload length


def cores():
    """The cores this process may run on (its affinity: a container's cpuset), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def workers_for(count):
    """How many workers a list of `count` items is worth on this host."""
    return max(1, min(cores(), count // MIN_PER_WORKER))


FIRST = 0xFFFFFFFF  # the piece index of a frame carrying a share's first-stage answer
BLOCK = 64  # items map_stream hands a worker at a time while the listing goes on


def map_stream(func, listing, size=None, piece=PIECE, first=None, on_first=None, per_worker=MIN_PER_WORKER,
               block=BLOCK):
    """[func(p) for every piece p of the items `listing` yields (ints, marshal-able)], in no set
    order, each piece run in one of the forked workers, with the listing overlapped with the
    work: (results, workers). On a host of 20,000 processes, listing /proc
    takes ~25 ms and 16 forks ~13 ms; done one after the other before any worker read a record,
    they were 40% of the time to the first signal.

    A worker is started as soon as the listing has `per_worker` items for each (two at once,
    then one more each `per_worker` items: as many as `size(count)` says and never more,
    workers_for by default, found as the count grows), and the items are handed out in
    blocks of `block`, each to the worker that has the fewest so far, through a pipe, while
    the listing goes on.

    The whole account: docs/design-notes.md (scripts/agent/procs/fanout.py: `map_stream`)."""
    listed: list = []
    workers: list = []  # [_Streamed]
    here: list = []  # items no worker could take: run here
    pending: list = []  # items listed since the last block was handed out
    size = size or workers_for
    can_grow = True
    for item in listing:
        listed.append(item)
        pending.append(item)
        if can_grow and len(listed) % per_worker == 0 and len(listed) >= 2 * per_worker:
            want = size(len(listed))
            if len(workers) < want:
                can_grow = _grow(workers, func, first, min(want - len(workers), 1 if workers else 2), piece)
        if workers and len(pending) >= block:
            cut = len(pending) - len(pending) % block
            for j in range(0, cut, block):
                _hand(workers, pending[j:j + block], here)
            del pending[:cut]
    want = size(len(listed))  # what the whole count is worth, if the listing's growth fell short of it
    if can_grow and want >= 2 and len(workers) < want:
        _grow(workers, func, first, want - len(workers), piece)
    for j in range(0, len(pending), block) if workers else ():
        _hand(workers, pending[j:j + block], here)
    for w in workers:
        w.end_input()
    if not workers:
        if first is not None:
            on_first([first(listed)])
        return [func(listed)], 1
    shares = [w.share for w in workers] + [here]
    running = {w.out: (w.pid, n, bytearray()) for n, w in enumerate(workers)}
    firsts = _Firsts(first and (lambda share: [first(share)] if share else []),
                     on_first and (lambda answers: on_first([a for blocks in answers for a in blocks])),
                     shares, running)
    done: dict = {}
    _gather(running, done, firsts)
    firsts.finish()
    pieces = [[share[j:j + piece] for j in range(0, len(share), piece)] for share in shares]
    return [done[(w, j)] if (w, j) in done else func(p) for w, mine in enumerate(pieces) for j, p in enumerate(mine)], \
        len(workers)


_TOKEN = struct.Struct("<H")  # a shard's number, as map_shards' queue carries it
MAX_SHARDS = 1 << 14  # tokens the queue holds (two bytes each, within a pipe's 64 KiB)


def map_shards(func, shard, shards, workers, piece=PIECE, first=None, on_first=None, block=BLOCK):
    """map_stream's answer where the workers list the items themselves: the items are
    shard(s, shards) for s in range(shards) (each an iterable of marshal-able items; together
    every item once), and each of `workers` forked workers takes shard numbers from a queue (a
    pipe filled before the forks) until none is left, lists and reads them, then sends what it
    took and read. Nothing is listed or handed out here: this process forks and loads. Why a
    queue of more shards than workers: the workers are forked one after another (~1.2 ms each
    on a 16-core host), and one that starts late, or runs slow, takes fewer.

    `first` is run on each `block` of what a worker listed, and on_first gets every block's
    answer once every shard's are in, as in map_stream. A worker that fails or cannot be started
    costs only speed: the shards no worker reported are listed and read here, and the pieces a
    worker did not send are run here. Returns (results, workers)."""
    shards = max(1, min(shards, MAX_SHARDS))
    started: list = []
    try:
        queue_r, queue_w = os.pipe()
    except OSError:
        queue_r = queue_w = -1
    if queue_r >= 0:
        _fill_queue(queue_w, shards)
        os.close(queue_w)  # the queue ends when it is empty
        for _ in range(workers):
            w = _fork_shard(func, first, shard, shards, queue_r, piece, block, started)
            if w is None:
                break
            started.append(w)
        os.close(queue_r)
    running = {out: (pid, n, bytearray()) for n, (pid, out) in enumerate(started)}
    firsts = _ShardFirsts(first, on_first, shards, lambda s: list(shard(s, shards)), block, piece)
    done: dict = {}
    _gather(running, done, firsts)
    firsts.finish()
    return [done[(n, j)] if (n, j) in done else func(p) for n, mine in sorted(firsts.pieces.items())
            for j, p in enumerate(mine)], len(started)


F_GETPIPE_SZ = 1032  # fcntl: a pipe's capacity in bytes (Linux)


def _fill_queue(queue_w, shards):
    """Every shard's token into the queue, never blocking: no worker reads it yet, and a pipe
    can be as small as one page (a user past fs.pipe-user-pages-soft gets 2; older kernels 1),
    so it is filled without waiting, as far as it goes. A token that does not fit is no
    worker's, and map_shards runs its shard here (never lost: it is `missing` to the end)."""
    os.set_blocking(queue_w, False)
    try:
        room = fcntl.fcntl(queue_w, F_GETPIPE_SZ)
    except OSError:
        room = 4096
    data = b"".join(_TOKEN.pack(s) for s in range(shards))[:room - room % _TOKEN.size]
    try:
        while data:
            data = data[os.write(queue_w, data):]
    except OSError:  # full after all (BlockingIOError): the rest is run here
        pass


def _fork_shard(func, first, shard, shards, queue, piece, block, started):
    """(pid, read end of its output) of a new map_shards worker, or None when none could be
    started (no fds or processes left)."""
    try:
        out_r, out_w = os.pipe()
    except OSError:
        return None
    try:
        pid = os.fork()
    except OSError:
        os.close(out_r)
        os.close(out_w)
        return None
    if pid == 0:  # the worker
        code = 1
        try:
            os.close(out_r)
            for _, fd in started:  # another worker's output held open here would never end
                os.close(fd)
            _shard_worker(func, first, lambda s: shard(s, shards), queue, out_w, piece, block)
            code = 0
        finally:
            os._exit(code)
    os.close(out_w)
    procfs.OWN_WORKERS.add(pid)
    return pid, out_r


def list_blocks(items, block):
    """The items in lists of `block`, as they come."""
    chunk: list = []
    for item in items:
        chunk.append(item)
        if len(chunk) == block:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _shard_worker(func, first, listed, queue, out, piece, block):
    """A map_shards worker: takes shard numbers from the queue while there are any and lists
    each (`listed(s)`).

    With a first stage: first() on each block as it is listed; once the queue is empty, (the
    shards it took, its items, the answers) in one frame, then func on each piece of its items
    (the first stage of every shard ends before any second: on_first is what waits on it).
    Without one: func on each piece of a shard as soon as it is listed, then (the shards it
    took, its pieces, None) in one last frame: the queue then shares out all of the work, not
    only the listing (a worker forked first would list most shards while the others are forked,
    and then read all of them alone)."""
    took: list = []
    share: list = []
    answers: list = []
    pieces: list = []
    while True:
        token = os.read(queue, _TOKEN.size)  # a pipe read this small takes a whole token or nothing
        if len(token) < _TOKEN.size:
            break
        took.append(_TOKEN.unpack(token)[0])
        if first is None:
            items = list(listed(took[-1]))
            for j in range(0, len(items), piece):
                pieces.append(items[j:j + piece])
                data = marshal.dumps(func(pieces[-1]))
                _write_all(out, _HEAD.pack(len(pieces) - 1, len(data)) + data)
            continue
        for items in list_blocks(listed(took[-1]), block):
            share.extend(items)
            answers.append(first(items))
    os.close(queue)
    data = marshal.dumps([took, pieces, None] if first is None else [took, share, answers])
    _write_all(out, _HEAD.pack(FIRST, len(data)) + data)
    for j in range(0, len(share), piece):
        data = marshal.dumps(func(share[j:j + piece]))
        _write_all(out, _HEAD.pack(j // piece, len(data)) + data)


class _ShardFirsts:
    """map_shards' first frames as they come: what each worker took, the pieces of its items
    (its items cut in `piece`s, or the pieces it sent) and its first-stage answers; on_first
    once every shard is in. `finish` lists here the shards no worker reported (its worker died,
    or none could be started), under worker number -1."""

    def __init__(self, first, on_first, shards, list_here, block, piece):
        self.first, self.on_first, self.list_here, self.block, self.piece = first, on_first, list_here, block, piece
        self.missing = set(range(shards))
        self.pieces: dict = {}  # worker number -> its items, in the pieces func runs on
        self.answers: dict = {}
        self.called = False

    def got(self, n, answer):
        if n in self.pieces or not (isinstance(answer, list) and len(answer) == 3):
            return  # a frame that did not load: its shards are listed here at the end
        took, items, answers = answer
        if answers is None:  # no first stage: the pieces as the worker sent them
            self.pieces[n] = items
        else:
            self.pieces[n] = [items[j:j + self.piece] for j in range(0, len(items), self.piece)]
            self.answers[n] = answers
        self.missing -= set(took)
        if not self.missing and not self.called:
            self.called = True
            if self.first is not None and self.on_first is not None:
                self.on_first([a for k in sorted(self.answers) for a in self.answers[k]])

    def ended(self, n):
        """A worker ended: which shards it took without reporting is known only at the end."""

    def finish(self):
        if not self.missing:
            return
        share = [item for s in sorted(self.missing) for item in self.list_here(s)]
        answers = [self.first(b) for b in list_blocks(share, self.block)] if self.first is not None else []
        self.got(-1, [sorted(self.missing), share, answers])


class _Streamed:
    """A worker of map_stream: its pid, the write end of its input, the read end of its output,
    and its share (the items handed to it, in order)."""

    def __init__(self, pid, inp, out):
        self.pid, self.inp, self.out = pid, inp, out
        self.share: list = []

    def take(self, items):
        """Hand the worker `items`; False when it cannot take them (gone: its input is closed)."""
        if self.inp is None:
            return False
        data = marshal.dumps(items)
        try:
            _write_all(self.inp, _HEAD.pack(0, len(data)) + data)
        except OSError:  # it died (EPIPE): what it was handed before is run here if it never sends it
            self.end_input()
            return False
        self.share.extend(items)
        return True

    def end_input(self):
        if self.inp is not None:
            os.close(self.inp)
            self.inp = None


def _hand(workers, items, here):
    """`items` to the worker with the fewest so far that takes them, else to `here`."""
    for w in sorted((w for w in workers if w.inp is not None), key=lambda w: len(w.share)):
        if w.take(items):
            return
    here.extend(items)


def _grow(workers, func, first, count, piece):
    """Start `count` more workers; False when one could not be (no fds or processes left: no
    more are tried)."""
    for _ in range(count):
        try:
            inp_r, inp_w = os.pipe()
        except OSError:
            return False
        try:
            out_r, out_w = os.pipe()
        except OSError:
            os.close(inp_r)
            os.close(inp_w)
            return False
        parents = [fd for w in workers for fd in (w.inp, w.out) if fd is not None]
        try:
            pid = os.fork()
        except OSError:
            for fd in (inp_r, inp_w, out_r, out_w):
                os.close(fd)
            return False
        if pid == 0:  # the worker
            code = 1
            try:
                for fd in parents + [inp_w, out_r]:  # another worker's input held open here would never end
                    os.close(fd)
                _stream_worker(func, first, inp_r, out_w, piece)
                code = 0
            finally:
                os._exit(code)
        os.close(inp_r)
        os.close(out_w)
        procfs.OWN_WORKERS.add(pid)
        workers.append(_Streamed(pid, inp_w, out_r))
    return True


def _stream_worker(func, first, inp, out, piece):
    """A map_stream worker: first() on each block as it comes, the answers once its input ends,
    then func on each piece of its share."""
    share: list = []
    answers: list = []
    buf = bytearray()
    while True:
        chunk = os.read(inp, 1 << 16)
        if not chunk:
            break
        buf += chunk
        at = 0
        while len(buf) - at >= _HEAD.size:
            _, size = _HEAD.unpack_from(buf, at)
            if len(buf) < at + _HEAD.size + size:
                break
            items = marshal.loads(bytes(buf[at + _HEAD.size:at + _HEAD.size + size]))
            at += _HEAD.size + size
            share.extend(items)
            if first is not None:
                answers.append(first(items))
        del buf[:at]
    os.close(inp)
    if first is not None:
        data = marshal.dumps(answers)
        _write_all(out, _HEAD.pack(FIRST, len(data)) + data)
    for j in range(0, len(share), piece):
        data = marshal.dumps(func(share[j:j + piece]))
        _write_all(out, _HEAD.pack(j // piece, len(data)) + data)


class _Firsts:
    """The first-stage answers of the shares as they come; on_first once all are in."""

    def __init__(self, first, on_first, shares, running):
        self.first, self.on_first, self.shares = first, on_first, shares
        self.answers: dict = {}
        self.waiting = set(range(len(shares))) if first is not None else set()
        self.called = first is None
        started = {w for _, w, _ in running.values()}
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
