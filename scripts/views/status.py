"""Render scan, verify and ping results for people: a per-GPU table, a holder table, verdicts.

Why separate: tasks stay thin, and the same views serve status, verify, plan and teardown.
Each view takes the contract's record (AgentResult.result: records.ScanResult,
VerifyResult, PingResult); an agent document (a dict, as --json prints it) is read through
the contract first, in render.record, so these views never read the agent's keys themselves.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..agent.wire import records
from .render import Col, Command, age, note, paint, record, shorten, table, width

if TYPE_CHECKING:
    from ..agent.wire.rows import GpuSettings, ProcessRow


def scan_of(x) -> records.ScanResult:
    """The scan in a scan, verify or plan result (a record or an agent document)."""
    x = record(x)
    return getattr(x, "scan", x)


def _mib(v) -> str:
    return "?" if v is None else f"{v}"


def no_gpu_visible(x) -> str | None:
    """The host shows no GPU at all (no device file matches its glob, no GPU memory source),
    in verify's words; None when it shows one. Said plainly: "no process holds a GPU" there
    read as "free" on a host whose glob was wrong or whose driver was not loaded."""
    scan = scan_of(x)
    if scan.gpus or scan.devices:
        return None
    tried = "; ".join(scan.gpu_source_tried) or scan.gpu_source
    return f"no GPU visible: no device file matches {scan.devices_glob} and no GPU memory source ({tried})"


def visible(x) -> str:
    """`NO GPU VISIBLE: ...` (status) where the host shows no GPU; nothing where it shows one."""
    missing = no_gpu_visible(x)
    return note(missing.replace("no GPU visible", "NO GPU VISIBLE", 1), indent="", hang="  ") if missing else ""


def gpu_table(x) -> str:
    scan = scan_of(x)
    if no_gpu_visible(scan):
        return ""  # said once, plainly, by `visible` (status) or verify's verdict
    if not scan.gpus:
        tried = "; ".join(scan.gpu_source_tried)
        return note(f"GPU memory: no source on this host ({tried or 'none tried'}); holders below come from /proc "
                    "only", indent="", hang="  ")
    rows = []
    for g in scan.gpus:
        procs = " ".join(f"{p['pid']}({_mib(p['used_mib'])})" for p in g["processes"]) or "-"  # wraps between pids
        rows.append([g["index"], g["name"], _mib(g["used_mib"]), _mib(g["reserved_mib"]), _mib(g["total_mib"]), procs])
    # short headers and small floors: the table fits 60 columns (a split tmux pane); the
    # title says what the last column holds
    return note(f"GPU memory (source: {scan.gpu_source}; MiB, used excludes reserved; compute processes as "
                "pid(MiB))", indent="", hang="  ") + "\n" + \
        table(["gpu", Col("name", "cut", 8), "used", "reserved", "total", Col("processes", "wrap", 12)], rows, "  ")


# a GPU setting's words in status: (its name in a drift line, its unit)
SETTING_WORDS = {"persistence": ("persistence", ""), "compute_mode": ("compute mode", ""),
                 "graphics_clock_mhz": ("graphics application clock", " MHz"),
                 "memory_clock_mhz": ("memory application clock", " MHz"), "power_limit_w": ("power limit", " W"),
                 "mig": ("MIG", "")}


def _setting(st: GpuSettings, name: str) -> str:
    """One setting as read: its value, "n/a" where NVML does not support it, "?" where its call
    failed. Never 0 for a value not known."""
    value = st.get(name)
    if value is not None:
        return f"{value}"
    return "n/a" if name in (st.get("not_supported") or []) or name not in (st.get("unread") or {}) else "?"


def _drift(st: GpuSettings, expected: dict) -> list:
    """`power limit 500 W (baseline 700 W)` for each setting of `expected` ({field: (value, whose:
    "baseline" or "phase NAME")}) the GPU differs from, or could not be read for (a setting not
    confirmed is not called met)."""
    out = []
    for name, (want, whose) in expected.items():
        words, unit = SETTING_WORDS.get(name, (name, ""))
        got = st.get(name)
        if got is None:
            out.append(f"{words} {_setting(st, name)} ({whose} {want}{unit}: not confirmed)")
        elif got != want:
            out.append(f"{words} {got}{unit} ({whose} {want}{unit})")
    return out


def _pair(a: str, b: str) -> str:
    return "n/a" if a == b == "n/a" else f"{a}/{b}"


def settings(x, baseline: dict | None = None, key: str = "ALIAS_GPU_BASELINE", phase=None) -> str:
    """Each GPU's settings as NVML read them (persistence, compute mode, application clocks,
    power limit and its default, MIG), a `*` on each that differs from what is expected, and one
    line per GPU naming what differs. Expected: `baseline` (hosts.env `key`), with the settings
    of `phase` (the phase the last pivot started, where known) over it. Nothing from a source
    that reads none."""
    scan = scan_of(x)
    gpus = [g for g in scan.gpus if g.get("settings")]
    if not gpus:
        return ""
    own = dict(phase.gpu_settings) if phase is not None else {}
    expected = {n: (v, "baseline") for n, v in (baseline or {}).items()}
    expected.update({n: (v, f"phase {phase.name}") for n, v in own.items()})
    against = key + (f" and phase {phase.name}'s GPU_SETTINGS (the last pivot's)" if own else "")
    rows, lines = [], []
    for g in gpus:
        st = g["settings"]
        drift = _drift(st, expected)
        off = {n for n in expected if st.get(n) != expected[n][0]}
        cell = {n: _setting(st, n) + ("*" if n in off else "") for n in SETTING_WORDS}
        rows.append([g["index"], cell["persistence"], cell["compute_mode"],
                     _pair(cell["graphics_clock_mhz"], cell["memory_clock_mhz"]),
                     _pair(cell["power_limit_w"], _setting(st, "power_default_w")), cell["mig"]])
        if drift:
            lines.append(note(f"GPU {g['index']} differs from {against}: " + "; ".join(drift)))
    title = "GPU settings (app clocks graphics/memory MHz; power limit/default W; n/a: not supported"
    title += f"; *: differs from {against})" if expected else ")"
    return "\n".join([note(title, indent="", hang="  "),
                      table(["gpu", "persist", "compute", "app clocks", "power", "MIG"], rows, "  "), *lines])


def settings_of(host, phase=None):
    """The settings view for one host (a hostconfig.Host): its hosts.env baseline, named by its
    key, and the settings of `phase` (the phase the last pivot started) over it."""
    return lambda x: settings(x, host.gpu_baseline, f"{host.alias.upper()}_GPU_BASELINE", phase)


def where(h: ProcessRow) -> str:
    """A process row's unit or container, for a table column."""
    c = h.get("container")
    if c:
        if c.get("label"):  # `ct 129 pid 9 (node pid 814)`, seen from a Proxmox node
            return c["label"]
        return f"{c['kind']}:{c['name']} ({c['id'][:12]})" if c.get("name") else f"{c['kind']}:{c['id'][:12]}"
    return h.get("unit") or "-"


def holder_table(x) -> str:
    scan = scan_of(x)
    if not scan.holders and no_gpu_visible(scan):
        return "\n".join(_notes(scan))  # no device to hold: `visible` says so
    if not scan.holders:
        seen = "no process it could inspect holds" if scan.denied else "no process holds"
        return "\n".join([note(f"Holders: {seen} a GPU device" + (f" ({scan.devices_glob})" if scan.devices_glob
                                                                      else ""), indent="", hang="  "),
                          *_notes(scan)])
    rows = []
    for h in scan.holders:
        mib = sum(v for v in h["gpu_mib"].values() if v) if h["gpu_mib"] else None
        rows.append([h["pid"], h.get("ppid", "?"), h["user"], h["state"], age(h.get("age_s")), where(h),
                     _mib(mib) if mib is not None else "-", "PROTECTED" if h["protected"] else "-", Command.of(h)])
    why = [f"protected: {h['protected']}" if h["protected"] else None for h in scan.holders]
    out = "Holders\n" + table(HOLDER_COLS, rows, "  ", details=why)
    return paint("\n".join([out, *_notes(scan)]))


# The holder table's columns: which process it is, and whether it may ever be signalled.
# ppid: an orphan (a worker whose server died) reads 1, or its container's or subreaper's pid;
# the runbooks send people looking for it.
HOLDER_COLS = ("pid", "ppid", "user", "state", "age", Col("unit/container", "cut", optional=True), "GPU MiB",
               "protected", Col("command", "command", 30))


def writing_line(pid, files: list) -> str:
    """The data a stop may cut short. The agent lists only files the process writes in place
    (not its stdout/stderr, not append-only logs): a log losing its last line is no loss, a
    checkpoint or dataset shard half-written is."""
    more = f" and {len(files) - 5} more" if len(files) > 5 else ""
    which = "that file" if len(files) == 1 else "those files"
    return f"pid {pid} is writing {', '.join(files[:5])}{more}: stopping it may leave {which} incomplete"


def _notes(scan: records.ScanResult) -> list:
    extra = [note(writing_line(h["pid"], h["write_files"])) for h in scan.holders if h.get("write_files")]
    if scan.foreign_gpu_pids:
        pids = ", ".join(str(p["pid"]) for p in scan.foreign_gpu_pids)
        extra.append(note(f"NVML reports pids not visible here (another PID namespace, e.g. the Proxmox node): {pids}"))
    if scan.proc_hidden:
        extra.append(note(f"NOT INSPECTED: {scan.proc_hidden}: a holder may be unseen, so nothing is called free; "
                          "run as root"))
    if scan.denied:
        extra.append(note(f"NOT INSPECTED: {len(scan.denied)} process(es) whose open files this user cannot read "
                          f"({scan.denied[:10]}): they may hold a GPU, so nothing is called free; run as root"))
    return extra


def last_teardown(x) -> str:
    """The last teardown's line, and the host lock's holder while it is held (a pivot's)."""
    scan = scan_of(x)
    held = getattr(scan, "lock", None)  # a scan's; a view given only the last teardown has none
    lock = note(f"Host lock: held by {held}", indent="", hang="  ") if held else ""
    last = scan.last_teardown
    if not last:
        return lock
    return "\n".join(line for line in (lock, _last_teardown(last)) if line)


def _last_teardown(last) -> str:
    by = f" by {last['operator']}" if last.get("operator") else ""
    if last.get("state") == "running":  # no exit code yet: "exit None" read like a result
        return note(f"Last teardown on this host: running{by} since {last.get('started')} (its result shows here "
                    "when it ends)", indent="", hang="  ")
    when = last.get("finished") or last.get("started")
    parts = [last.get("state"), last.get("verdict"),
             None if last.get("exit_code") is None else f"exit {last['exit_code']}"]
    at = f" at {when}" if when else ""  # a state the agent could not read has no time
    return note(f"Last teardown on this host: {' '.join(str(p) for p in parts if p)}{by}{at}", indent="", hang="  ")


def verdict(x) -> str:
    """verify's answer: FREE, or NOT FREE and each problem on its own line."""
    v: records.VerifyResult = record(x)
    if v.free:
        return paint("FREE: every GPU is free")
    return paint("\n".join(["NOT FREE:", *(note(p) for p in v.problems)]))  # each problem whole, fitted


def still_holding(x) -> str:
    """What still holds each GPU after a verify or a teardown that did not free it."""
    v: records.VerifyResult | records.TeardownResult = record(x)
    rows = [[r["gpu"] if r["gpu"] is not None else "-", r["pid"], r["state"], _mib(r["used_mib"]), Command.of(r)]
            for r in v.still_holding]
    if not rows:
        return ""
    hint = ""
    if any(r[2] == "D" for r in rows):
        hint = "\n  state D = stuck in the driver (uninterruptible): see runbooks/gpu-memory-not-freed.md"
    return "Still holding\n" + table(["gpu", "pid", "state", "GPU MiB", Col("command", "command", 30)], rows,
                                     "  ") + hint


def verify_progress(alias: str, p: dict) -> str:
    """What `verify --wait` waits for, from one progress line of the agent: GPU MiB still used
    and the holders that keep a GPU busy (pid and program), with the time left; one line."""
    holders = p.get("holders") or []
    who = ", ".join(f"pid {h['pid']} {' '.join(Command.of(h).program)}" for h in holders[:3])
    more = f", +{len(holders) - 3}" if len(holders) > 3 else ""
    held = f"held by {who}{more}" if holders else (p.get("problems") or ["nothing named"])[0]
    left = max(0.0, float(p.get("wait_s") or 0) - float(p.get("elapsed_s") or 0))
    used = "GPU memory used unknown" if p.get("mib_left") is None else f"{p['mib_left']} MiB used"
    return shorten(f"{alias}: waiting, {left:.1f}s left: {used}, {held}", width())


def header(alias: str, x, sandbox: bool) -> str:
    """`== alias (hostname)`, before each host's views; x: a scan, verify, plan or teardown result."""
    x = record(x)
    hostname = x.scan.hostname if hasattr(x, "scan") else x.hostname
    label = "  [SANDBOX: fake GPUs on this machine]" if sandbox else ""
    return f"== {alias} ({hostname}){label}"


def ping_line(alias: str, x, wall_s: float) -> str:
    """One line per host for `invoke ping`: who answered and which GPU tools it has."""
    p: records.PingResult = record(x)

    def yes(v) -> str:
        return "yes" if v else "no"

    return (f"{alias}: {p.hostname} python {p.python} pid {p.pid} nvml={yes(p.nvml)} nvidia-smi={yes(p.nvidia_smi)} "
            f"fuser={yes(p.fuser)} devices={len(p.devices)} ({wall_s * 1000:.0f} ms)")


def failed(failure) -> str:
    """What a host's failed call was (a fleet Failure: ops/fleet.py reads its kind): 'timed out'
    (no answer in time, exit 7), 'login refused' (the host answered and refused the user or
    key: never called unreachable) or 'unreachable' (every other kind)."""
    return failure.kind if failure.kind in ("timed out", "login refused") else "unreachable"
