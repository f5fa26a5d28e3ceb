"""Run one function over a list in forked workers, one per core the agent may use.

Why: the holder scan reads a few /proc files of EVERY process (stat, cmdline, its fd table,
its maps), before the first signal and again to confirm FREED. On a host of 20,000 processes
(DataLoader workers, Ray, many containers) that was 1.6 s a scan on one core, twice `fuser`,
and seconds before the first SIGTERM. The reads are independent system calls, so the list is
split across forked workers (the standard library only: the agent runs on any Python >= 3.8,
and multiprocessing's start-up would cost more than it saves). Each worker sends its part
back through a pipe as marshal data (dicts, lists, tuples, sets, str, int, None: what a scan
record is made of). A worker that fails, or cannot be started, costs only speed: its chunk is
run here instead, so the answer is the same as a one-core scan's.

A worker runs nothing but `func` and leaves through os._exit: no atexit handler, no buffered
output of the agent's is flushed twice, and nothing of the GPU source (NVML, opened on a
thread of the agent) is touched in it.
"""
import marshal
import os

MIN_PER_WORKER = 250  # items: below this a fork (and its copied page tables) costs more than it saves


def cores():
    """The cores this process may run on (its affinity: a container's cpuset), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def workers_for(count):
    """How many workers a list of `count` items is worth on this host."""
    return max(1, min(cores(), count // MIN_PER_WORKER))


def map_chunks(func, items, workers):
    """[func(chunk) for each of `workers` interleaved chunks of items], the first chunk run
    here while the others run in forked workers. Interleaved (items[i::n]): neighbouring pids
    are often alike (a server's workers, a container's processes), so chunks cost about the
    same."""
    if workers <= 1 or len(items) < 2:
        return [func(items)]
    chunks = [items[i::workers] for i in range(workers)]
    started = [_start(func, chunk) for chunk in chunks[1:]]
    out = [func(chunks[0])]
    for pid, fd, chunk in started:
        out.append(_collect(pid, fd, chunk, func))
    return out


def _start(func, chunk):
    """(pid, read fd, chunk) of a worker running func(chunk); (None, None, chunk) when none
    could be started (no fds or processes left: the chunk is run here)."""
    try:
        r, w = os.pipe()
    except OSError:
        return None, None, chunk
    try:
        pid = os.fork()
    except OSError:
        os.close(r)
        os.close(w)
        return None, None, chunk
    if pid == 0:  # the worker
        code = 1
        try:
            os.close(r)
            _write_all(w, marshal.dumps(func(chunk)))
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    return pid, r, chunk


def _collect(pid, fd, chunk, func):
    if pid is None:
        return func(chunk)
    try:
        data = _read_all(fd)
    finally:
        os.close(fd)
    _, status = os.waitpid(pid, 0)
    if status == 0 and data:
        try:
            return marshal.loads(data)
        except (EOFError, ValueError, TypeError):
            pass
    return func(chunk)  # the worker failed: the same answer, one core slower


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _read_all(fd):
    parts: list = []
    while True:
        part = os.read(fd, 1 << 20)
        if not part:
            return b"".join(parts)
        parts.append(part)
