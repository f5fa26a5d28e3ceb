"""Is each GPU usable, not only empty? A CUDA driver-API probe: context, allocation, touch.

Why: NVML can read 0 MiB on a GPU where CUDA cannot start (error 802 while an NVSwitch
fabric is not ready, an ECC state, a wedged driver). The probe does what the next job does
first, on every GPU: cuInit, the CUDA device whose UUID is NVML's (CUDA's order is not
NVML's; CUDA_VISIBLE_DEVICES may hide some, which is said), cuCtxCreate, cuMemAlloc of
the host's size, cuMemsetD8 + cuCtxSynchronize, free, destroy, timed per GPU (in parallel).
It runs in a forked child with every other fd closed (the host lock never outlives the
agent in it) under a deadline: a call that never returns is SIGKILLed and answered
"hung". libcuda is loaded by its soname through the loader's own paths (as every CUDA
program loads it); LIBCUDA is set to another path only by tests, in-process.
"""
import json
import os
import select
import signal
import threading
import time

from ..procs import procfs
from ..wire import defaults

LIBCUDA = "libcuda.so.1"
DEADLINE_S = defaults.PROBE_DEADLINE_S  # cuInit on 8 GPUs takes seconds; past this a call is stuck
RELEASE_S = 2.0    # how long NVML may still list the child after it exited (driver cleanup)
OK, FAILED, HUNG, HIDDEN, NOT_RUN, STAND_IN = "ok", "failed", "hung", "hidden", "not run", "stand-in"
SANDBOX_WORDS = "SANDBOX stand-in, no CUDA here: a real host gets a context + %d MiB on each GPU"


def uuid_text(raw):
    """NVML's form of CUDA's 16 UUID bytes: GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx."""
    h = bytes(bytearray(raw)).hex()
    return "GPU-%s-%s-%s-%s-%s" % (h[:8], h[8:12], h[12:16], h[16:20], h[20:32])


class _Cuda:
    """The few driver-API calls, by ctypes. Each failing call raises CudaError naming it."""

    def __init__(self, path):
        import ctypes

        self.c = ctypes
        self.lib = ctypes.CDLL(path)

    def name(self, code):
        c, out = self.c, []
        for fn in ("cuGetErrorName", "cuGetErrorString"):
            text = c.c_char_p()
            try:
                ok = getattr(self.lib, fn)(int(code), c.byref(text)) == 0 and text.value
            except AttributeError:
                ok = False
            out.append(text.value.decode("ascii", "replace") if ok else None)
        return "%s (%d): %s" % (out[0] or "CUDA error", code, out[1] or "no description")

    def call(self, fn, *args):
        code = getattr(self.lib, fn)(*args)
        if code:
            raise CudaError(fn, code, self.name(code))

    def uuid_fn(self):
        return "cuDeviceGetUuid_v2" if hasattr(self.lib, "cuDeviceGetUuid_v2") else "cuDeviceGetUuid"


class CudaError(Exception):
    def __init__(self, call, code, words):
        super().__init__("%s: %s" % (call, words))
        self.call, self.code = call, code


def _devices(cuda):
    """[(ordinal, NVML-form UUID)] in CUDA's order."""
    c = cuda.c
    count = c.c_int()
    cuda.call("cuDeviceGetCount", c.byref(count))
    out = []
    for ordinal in range(count.value):
        dev = c.c_int()
        cuda.call("cuDeviceGet", c.byref(dev), ordinal)
        raw = (c.c_ubyte * 16)()
        cuda.call(cuda.uuid_fn(), c.byref(raw), dev)
        out.append((ordinal, uuid_text(raw)))
    return out


def _one(cuda, ordinal, size):
    """Context, allocate, touch, free, destroy on one device; raises CudaError."""
    c = cuda.c
    dev, ctx, ptr = c.c_int(), c.c_void_p(), c.c_uint64()
    cuda.call("cuDeviceGet", c.byref(dev), ordinal)
    cuda.call("cuCtxCreate_v2", c.byref(ctx), 0, dev)
    try:
        cuda.call("cuMemAlloc_v2", c.byref(ptr), c.c_size_t(size))
        try:
            cuda.call("cuMemsetD8_v2", ptr, c.c_ubyte(0xA5), c.c_size_t(size))
            cuda.call("cuCtxSynchronize")
        finally:
            cuda.call("cuMemFree_v2", ptr)
    finally:
        cuda.call("cuCtxDestroy_v2", ctx)


def _child(wfd, path, uuids, size):
    """The forked child: report each step as one JSON line (< PIPE_BUF, so atomic) on wfd."""
    def say(**fields):
        os.write(wfd, (json.dumps(fields) + "\n").encode())

    try:
        cuda = _Cuda(path)
        t0 = time.monotonic()
        cuda.call("cuInit", 0)
        devices = _devices(cuda)
        say(init_s=round(time.monotonic() - t0, 4), devices=devices)
    except OSError as exc:
        say(load_error="%s: %s" % (path, exc))
        return
    except CudaError as exc:
        say(init_error=str(exc), code=exc.code, call=exc.call)
        return
    found = dict((u, o) for o, u in devices)

    def probe(uuid):
        t = time.monotonic()
        try:
            _one(cuda, found[uuid], size)
            say(uuid=uuid, state=OK, seconds=round(time.monotonic() - t, 4))
        except CudaError as exc:
            say(uuid=uuid, state=FAILED, error=str(exc), code=exc.code, call=exc.call,
                seconds=round(time.monotonic() - t, 4))

    threads = [threading.Thread(target=probe, args=(u,)) for u in uuids if u in found]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def _fork(path, uuids, size):
    """(pid, read fd) of the child running _child. Every fd but the pipe's is closed in it:
    the host lock's, NVML's device fds; it holds only what its own cuInit opens."""
    import warnings

    rfd, wfd = os.pipe()
    with warnings.catch_warnings():  # 3.12 warns on fork with threads: the child only runs _child, then _exit
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        code = 0
        try:
            os.closerange(0, wfd)
            os.closerange(wfd + 1, 65536)
            _child(wfd, path, uuids, size)
        except BaseException:
            code = 1
        os._exit(code)
    os.close(wfd)
    procfs.OWN_PROBES.add(pid)
    return pid, rfd


def _read(pid, rfd, deadline_s):
    """Every line the child wrote, until it closed the pipe or the deadline passed; (lines, hung)."""
    end = time.monotonic() + deadline_s
    buf, lines = b"", []  # type: bytes, list
    try:
        while True:
            left = end - time.monotonic()
            if left <= 0 or not select.select([rfd], [], [], left)[0]:
                return lines, True
            chunk = os.read(rfd, 65536)
            if not chunk:
                return lines, False
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                lines.append(json.loads(line.decode()))
    finally:
        os.close(rfd)


def _end(pid, hung):
    """Reap the child; SIGKILL it first when hung (our own child, by pid). A child stuck in the
    driver (state D) outlives SIGKILL: it is left, and stays out of OWN_PROBES, so a later scan
    counts it as what it is: a process holding the GPU."""
    if hung:
        os.kill(pid, signal.SIGKILL)
    for _ in range(200 if hung else 1):
        done, _ = os.waitpid(pid, os.WNOHANG if hung else 0)
        if done:
            break
        time.sleep(0.005)
    procfs.OWN_PROBES.discard(pid)


def _released(source, pid):
    """Wait (up to RELEASE_S) until NVML lists the child on no GPU: a scan right after the
    probe (verify, the pivot's intruder watch) must not find its context still listed."""
    nv = getattr(source, "nvml", None)
    if nv is None:
        return None
    t0, end = time.monotonic(), time.monotonic() + RELEASE_S
    while time.monotonic() < end:
        try:
            listed = [nv.compute_processes(h) for h in source.handles]
        except Exception:
            return None
        if not all(isinstance(procs, list) for procs in listed):  # nvml.NA: not read, so not seen released
            return None
        if not any(p == pid for procs in listed for p, _ in procs):
            return round(time.monotonic() - t0, 4)
        time.sleep(0.005)
    return None


def run(gpus, size_mib, source=None, deadline_s=None):
    """{"gpus": {index: {state, seconds, error, call, code, cuda_ordinal}}, and the run's facts}
    for NVML's GPU rows; the rows' own order and indices are NVML's."""
    size = int(size_mib) * 1024 * 1024
    if getattr(source, "name", None) == "sandbox (fake GPUs)":
        return {"stand_in": SANDBOX_WORDS % size_mib, "size_mib": size_mib, "seconds": 0.0,
                "gpus": {str(g["index"]): {"state": STAND_IN} for g in gpus}}
    deadline_s = DEADLINE_S if deadline_s is None else deadline_s
    uuids = [g.get("uuid") for g in gpus if g.get("uuid")]
    t0 = time.monotonic()
    pid, rfd = _fork(LIBCUDA, uuids, size)
    lines, hung = _read(pid, rfd, deadline_s)
    _end(pid, hung)
    out = {"size_mib": size_mib, "pid": pid, "seconds": round(time.monotonic() - t0, 4),
           "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"), "deadline_s": deadline_s}
    out["gpus"] = _per_gpu(gpus, lines, hung, out)
    if not hung:
        out["released_s"] = _released(source, pid)
    return out


def _per_gpu(gpus, lines, hung, out):
    head = lines[0] if lines else {}
    done = dict((x["uuid"], x) for x in lines[1:] if "uuid" in x)
    cuda = dict((u, o) for o, u in head.get("devices") or [])
    out.update((k, head[k]) for k in ("init_s", "load_error", "init_error") if k in head)
    res = {}
    for g in gpus:
        uuid = g.get("uuid")
        r: dict
        if "load_error" in head:
            r = {"state": NOT_RUN, "error": "libcuda not loadable: %s" % head["load_error"]}
        elif "init_error" in head:
            r = {"state": FAILED, "error": head["init_error"], "code": head.get("code"), "call": "cuInit"}
        elif not head:
            r = {"state": HUNG if hung else FAILED, "call": "cuInit",
                 "error": "cuInit did not return within %g s" % out["deadline_s"] if hung else "the probe ended early"}
        elif not uuid:
            r = {"state": NOT_RUN, "error": "NVML gave no UUID to find this GPU among CUDA's devices by"}
        elif uuid not in cuda:
            r = {"state": HIDDEN, "error": "CUDA does not list this GPU's UUID %s%s" % (uuid, (
                " (CUDA_VISIBLE_DEVICES=%s)" % out["cuda_visible_devices"]) if out["cuda_visible_devices"] is not None
                else "")}
        elif uuid in done:
            r = dict((k, v) for k, v in done[uuid].items() if k != "uuid")
        else:
            r = {"state": HUNG if hung else FAILED, "error": "no answer within %g s: a driver call did not return"
                 % out["deadline_s"] if hung else "the probe ended without an answer for this GPU"}
        if uuid in cuda:
            r["cuda_ordinal"] = cuda[uuid]
        res[str(g["index"])] = r
    return res
