"""Xid events: read them (NVML events, else the kernel log) and say what each one asks for.

Why: an Xid is the driver's own report that a GPU hit an error. Some mean only that an
application crashed (the GPU is fine), others that the GPU must be reset or the node
rebooted before it can be trusted again; freeing memory fixes none of those. So the Xids
logged while a teardown ran are mapped to NVIDIA's documented resolution and become part of
the GPU's health verdict (health.py).

The kernel-log line, as NVIDIA's Xid documentation shows it ("Working with Xid Errors",
https://docs.nvidia.com/deploy/xid-errors/ : `NVRM: Xid (PCI:0000:03:00): 14, Channel
00000001`; older drivers print `NVRM: Xid (0000:03:00): ...`; current ones add
`pid=..., name=...` before the message, e.g.

The whole account: docs/design-notes.md (scripts/agent/gpu/xid.py)."""
import os
import re
import subprocess
import time

OK, RESET, REBOOT, DRAIN, UNKNOWN = "ok", "reset needed", "reboot needed", "drain", "unknown"

# xid -> (verdict, what the catalog says, in a few words)
RESOLUTION = {
    8: (OK, "GPU stopped processing (channel idle timeout): restart the application"),
    13: (OK, "graphics engine exception: an application error; restart the application"),
    31: (OK, "GPU memory page fault: an application error (illegal address); restart the application"),
    43: (OK, "GPU stopped processing: the application's channel was reset; restart the application"),
    45: (OK, "preemptive cleanup after an earlier error (the application was ended): informational"),
    48: (RESET, "double-bit ECC error: reset the GPU (the catalog's Xid 48 workflow)"),
    61: (RESET, "internal micro-controller breakpoint/warning: reset the GPU"),
    62: (RESET, "internal micro-controller halt: reset the GPU"),
    63: (RESET, "row remapping / page retirement recorded: reset the GPU to activate the remap"),
    64: (RESET, "row remapping / page retirement failed: reset the GPU; if it repeats, contact support"),
    68: (OK, "video processor exception: restart the application"),
    69: (OK, "graphics engine class error: restart the application"),
    74: (DRAIN, "NVLink error: drain peer-to-peer traffic and reset the GPU (the catalog's NVLink workflow)"),
    79: (REBOOT, "GPU has fallen off the bus: reboot the node (RESTART_BM)"),
    92: (OK, "high single-bit ECC error rate: informational; watch the ECC counters"),
    94: (OK, "contained ECC error: the affected application was ended; restart it"),
    95: (RESET, "uncontained ECC error: reset the GPU"),
    109: (OK, "context switch timeout: restart the application"),
    119: (RESET, "GSP RPC timeout: reset the GPU"),
    120: (RESET, "GSP error: reset the GPU"),
    140: (RESET, "unrecovered ECC error: reset the GPU"),
}

# nvmlDeviceGpuRecoveryAction_t (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION's values; Xid 154 names them
# too) -> (verdict, words); health.py reads the field itself.
RECOVERY_ACTIONS = {
    0: (OK, "none"),
    1: (RESET, "GPU reset required"),
    2: (REBOOT, "node reboot required"),
    3: (DRAIN, "drain peer-to-peer traffic, then read the recovery action again"),
    4: (DRAIN, "drain peer-to-peer traffic and reset the GPU"),
    5: (DRAIN, "recover the IMEX domain (multi-node NVLink)"),
    6: (REBOOT, "reset the GPU's PCIe bus"),
    7: (REBOOT, "reboot the system"),
}

# Xid 154's message: "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)"
_ACTION_154 = re.compile(r"to\s+0x([0-9a-fA-F]+)")

LINE = re.compile(
    r"^NVRM: Xid \((?:PCI:)?(?P<bus>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})(?:\.[0-7])?\): "
    r"(?P<xid>[0-9]+),\s*(?:pid=(?P<pid>'?[^,]*'?),\s*)?(?:name=(?P<name>[^,]*),\s*)?(?P<msg>.*)$")
DMESG = ["dmesg", "--kernel"]  # facility kern only: what users write to the log is left out
_DMESG_TIME = re.compile(r"^\[\s*([0-9]+\.[0-9]+)\]\s*(?:\[\s*[TC][0-9]+\]\s*)?")  # [time] [caller id]


def parse_line(line):
    """One Xid from the text of one kernel-log record ({bus, xid, pid, name, message}), or None.
    Anchored: `NVRM: Xid` must open the text; quoted further in (another message carrying
    a user's words) it is not the driver's."""
    m = LINE.match(line)
    if not m:
        return None
    pid = (m.group("pid") or "").strip("'")
    return {"bus": normalize_bus(m.group("bus")), "xid": int(m.group("xid")),
            "pid": int(pid) if pid.isdigit() else None, "name": (m.group("name") or "").strip() or None,
            "message": m.group("msg").strip()}


def normalize_bus(bus):
    """'0000:3B:00.0', '00000000:3b:00.0', '0000:3b:00' -> '0000:3b:00' (domain:bus:device, lower case):
    the kernel log drops the function, NVML pads the domain to 8 digits."""
    parts = bus.lower().split(".")[0].split(":")
    if len(parts) != 3:
        return bus.lower()
    return "%04x:%s:%s" % (int(parts[0], 16), parts[1], parts[2])


def resolve(event):
    """(verdict, why) for one Xid event: the catalog's resolution, in this tool's verdicts."""
    xid = event["xid"]
    if xid == 154:
        m = _ACTION_154.search(event.get("message") or "")
        action = RECOVERY_ACTIONS.get(int(m.group(1), 16)) if m else None
        if action:
            return action[0], "GPU recovery action changed: %s" % action[1]
        return UNKNOWN, "GPU recovery action changed, to an action not read from the message"
    if xid in RESOLUTION:
        return RESOLUTION[xid]
    return UNKNOWN, "not in this tool's table: look it up in NVIDIA's Xid catalog"


KERNEL_FACILITY = 0  # LOG_KERN; the kernel logs writes to /dev/kmsg from user space as LOG_USER


def parse_kmsg_record(record):
    """(usec since boot, text) of one /dev/kmsg record 'PRI,SEQ,USEC,FLAGS;TEXT', or None.
    PRI is facility * 8 + level: a record of any facility but the kernel's is None (what a
    user writes to /dev/kmsg is forced to the user facility, so it can never pass for the driver)."""
    head, sep, text = record.partition(";")
    fields = head.split(",")
    if not sep or len(fields) < 3 or not _digits(fields[0]) or not _digits(fields[2]):
        return None
    if int(fields[0]) >> 3 != KERNEL_FACILITY:
        return None
    return int(fields[2]), text.split("\n", 1)[0]


def _digits(text):
    return bool(re.fullmatch(r"[0-9]+", text))


def parse_dmesg_line(line):
    """(usec since boot, text) of a `dmesg` line '[ 1234.567890] TEXT', or None without a time."""
    m = _DMESG_TIME.match(line)
    if not m:
        return None
    return int(round(float(m.group(1)) * 1e6)), line[m.end():]


def kernel_log(since_us, kmsg="/dev/kmsg", timeout_s=3.0):
    """(Xid events logged at or after since_us microseconds since boot, source, error or None).

    /dev/kmsg first (root, or kernel.dmesg_restrict=0); else `dmesg --kernel` (the kernel's
    own records only) with a timeout."""
    lines, source, error = [], None, None
    try:
        lines = list(_read_kmsg(kmsg, timeout_s))
        source = kmsg
    except OSError as exc:
        error = "%s: %s" % (kmsg, exc.strerror or exc)
        try:
            out = subprocess.run(DMESG, capture_output=True, text=True, timeout=timeout_s, check=True).stdout
            lines = [r for r in map(parse_dmesg_line, out.splitlines()) if r]
            source, error = "dmesg", None
        except (OSError, subprocess.SubprocessError) as exc2:
            error = "%s; dmesg: %s" % (error, exc2)
    events = []
    for usec, text in lines:
        if usec < since_us:
            continue
        event = parse_line(text)
        if event:
            event["at_us"] = usec
            events.append(event)
    return events, source, error


def _read_kmsg(path, timeout_s):
    """Every record in the kernel ring buffer, without blocking (O_NONBLOCK: EAGAIN at the end)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            try:
                raw = os.read(fd, 8192)
            except BlockingIOError:
                return
            except BrokenPipeError:  # EPIPE: the ring buffer overwrote records we had not read yet
                continue
            if not raw:
                return
            rec = parse_kmsg_record(raw.decode("utf-8", "replace"))
            if rec:
                yield rec
    finally:
        os.close(fd)


def now_us():
    """Now, in the kernel log's clock (CLOCK_MONOTONIC, microseconds since boot)."""
    return int(time.monotonic() * 1e6)


class NvmlWatch:
    """NVML Xid events from the moment it starts (nvmlDeviceRegisterEvents): where the driver
    offers them, no log parsing and no root needed. Events before start() are not seen.
    nv: an nvml.Nvml."""

    def __init__(self, nv, handles):
        self.nv = nv
        self.handles = list(handles)
        self.events = []
        self.error = None
        self.bus_of = {}
        self.evset = None

    @classmethod
    def start(cls, nv, handles):
        watch = cls(nv, handles)
        try:
            watch.bus_of = {index: _bus_id(nv, h) for index, h in enumerate(watch.handles)}
            watch.evset = nv.xid_events(watch.handles)
        except Exception as exc:  # NVML_ERROR_NOT_SUPPORTED on some GPUs, or an old pynvml
            watch.error = "NVML Xid events: %s" % exc
        return watch

    def drain(self):
        """Every Xid event waiting now (never blocks)."""
        if self.evset is None:
            return self.events
        while True:
            try:
                event = self.nv.next_event(self.evset)
            except Exception:
                break
            if not event:  # nvml.NA: nothing waiting
                break
            device, xid = event
            index = next((i for i, h in enumerate(self.handles) if _same(self.nv, h, device)), None)
            self.events.append({"xid": xid, "bus": self.bus_of.get(index), "gpu": index,
                                "pid": None, "name": None, "message": "", "at_us": now_us()})
        return self.events

    def close(self):
        if self.evset is not None:
            self.nv.free_events(self.evset)
            self.evset = None


def _bus_id(nv, handle):
    """The GPU's bus id, normalised (nv: an nvml.Nvml); raises where it is not read."""
    bus = nv.bus_id(handle)
    if not bus:
        raise LookupError("no PCI bus id from NVML")
    return normalize_bus(bus)


def _same(nv, a, b):
    try:
        uuid = nv.uuid(a)
        return bool(uuid) and uuid == nv.uuid(b)
    except Exception:
        return False
