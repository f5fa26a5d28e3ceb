"""Is each GPU usable after its memory is freed? One verdict per GPU, with its reasons.

The whole account: docs/design-notes.md (scripts/agent/gpu/health.py)."""
import os
import subprocess
import threading

from ..wire import codes
from . import fabric, gpuinfo, nvml, probe as cuda_probe, xid

OK, UNKNOWN, DRAIN, RESET, REBOOT = xid.OK, xid.UNKNOWN, xid.DRAIN, xid.RESET, xid.REBOOT
NOT_READY = "not ready"
ORDER = (OK, UNKNOWN, NOT_READY, DRAIN, RESET, REBOOT)  # worst last
UNHEALTHY = (NOT_READY, DRAIN, RESET, REBOOT)
CALL_TIMEOUT_S = 8.0

RECOVERY_ACTIONS = xid.RECOVERY_ACTIONS  # nvmlDeviceGpuRecoveryAction_t -> (verdict, words)


def worst(verdicts):
    verdicts = list(verdicts)
    return max(verdicts, key=ORDER.index) if verdicts else UNKNOWN


def verdict(findings, read_any):
    """{verdict, reasons} from findings [(verdict, reason)]; `read_any`: whether any source
    answered. Nothing read and nothing found: unknown."""
    reasons = [r for _, r in findings]
    bad = [v for v, _ in findings]
    if not bad:
        return {"verdict": OK if read_any else UNKNOWN, "reasons": reasons or (
            ["every health source answered: no recovery action, no rows to remap, no Xid, nothing stuck"]
            if read_any else ["no health source could be read"])}
    return {"verdict": worst(bad + ([OK] if read_any else [])), "reasons": reasons}


class Hung(Exception):
    """A driver call that did not return in time."""

    gpu = None  # the GPU it was asked about, where one was


def bounded(fn, timeout_s, what):
    """fn() run with a deadline; raises Hung. The call runs in a daemon thread: one stuck in
    the driver cannot be interrupted, so it is left behind and the agent goes on."""
    box = {}

    def call():
        try:
            box["value"] = fn()
        except BaseException as exc:  # handed to the caller
            box["error"] = exc

    t = threading.Thread(target=call, name="health:" + what, daemon=True)
    t.start()
    t.join(timeout_s)
    if t.is_alive():
        raise Hung("%s did not return within %g s" % (what, timeout_s))
    if "error" in box:
        raise box["error"]
    return box.get("value")


def nvml_checks(nv, handle):
    """[(verdict, reason)], [what was read], [what could not be read] for one GPU through NVML
    (nv: an nvml.Nvml)."""
    findings, read, unread = [], [], []
    action, why = _or_error(nv.recovery_action, handle)
    if why is None:
        read.append("recovery action %d" % action)
        v, words = RECOVERY_ACTIONS.get(action, (UNKNOWN, "action %d, not in this tool's table" % action))
        if action:
            findings.append((v, "NVML recovery action %d: %s" % (action, words)))
    else:
        unread.append("recovery action: %s" % why)
    rows, why = _or_error(nv.remapped_rows, handle)
    if why is None:
        corr, unc, pending, failed = rows
        read.append("remapped rows %d correctable, %d uncorrectable, pending %s, failure %s"
                    % (corr, unc, bool(pending), bool(failed)))
        if failed:
            findings.append((RESET, "row remapping FAILED (%d uncorrectable rows): reset the GPU; if it fails "
                                    "again the GPU needs service" % unc))
        elif pending:
            findings.append((RESET, "remapped rows pending: they take effect at the next GPU reset"))
        return findings, read, unread
    unread.append("remapped rows: %s" % why)
    pages, why = _or_error(nv.retired_pages_pending, handle)  # GPUs without row remapping (before Ampere) retire
    if why is None:
        if pages:
            findings.append((RESET, "retired pages pending: they take effect at the next GPU reset"))
        read.append("retired pages pending status")
    else:
        unread.append("retired pages: %s" % why)
    return findings, read, unread


def _or_error(query, handle):
    """(query(handle), None), or (None, why it gave nothing: NVML's words; nvml.NA: "Not Supported")."""
    try:
        value = query(handle)
    except Exception as exc:
        return None, _err(exc)
    return (None, "Not Supported") if value is nvml.NA else (value, None)


def _fabric_of(nv, handle):
    """fabric.read's answer, or {"error": why} (one failing field never fails the others)."""
    try:
        return fabric.read(nv, handle)
    except Exception as exc:
        return {"error": _err(exc)}


def _err(exc):
    return str(exc) or type(exc).__name__


SMI_QUERY = ["nvidia-smi", "--query-gpu=index,pci.bus_id,remapped_rows.pending,remapped_rows.failure",
             "--format=csv,noheader"]


def smi_checks(timeout_s):
    """{index: ([(verdict, reason)], [read])} from nvidia-smi where NVML is missing; raises Hung."""
    try:
        out = subprocess.run(SMI_QUERY, capture_output=True, text=True, timeout=timeout_s).stdout
    except subprocess.TimeoutExpired:
        raise Hung("nvidia-smi --query-gpu did not return within %g s" % timeout_s) from None
    res = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) < 4 or not cells[0].isdigit():
            continue
        findings = []
        if cells[3].lower() in ("yes", "1"):
            findings.append((RESET, "row remapping FAILED (nvidia-smi): reset the GPU; if it fails again, service"))
        elif cells[2].lower() in ("yes", "1"):
            findings.append((RESET, "remapped rows pending (nvidia-smi): they take effect at the next GPU reset"))
        read = ["remapped rows (nvidia-smi)"] if cells[2].lower() in ("yes", "no", "0", "1") else []
        res[int(cells[0])] = (findings, read, xid.normalize_bus(cells[1]))
    return res


def wchan(pid):
    try:
        with open("/proc/%d/wchan" % pid) as f:
            return f.read().strip() or "0"
    except OSError:
        return "?"


def gpus_of(holder, indices):
    """The GPU indices a holder is on: its GPU memory, its /dev/nvidiaN files, else every GPU
    (nvidiactl and nvidia-uvm serve them all)."""
    on = {int(k) for k, v in (holder.get("gpu_mib") or {}).items() if str(k).isdigit()}
    for d in holder.get("devices") or []:
        tail = os.path.basename(d)[len("nvidia"):]
        if os.path.basename(d).startswith("nvidia") and tail.isdigit():
            on.add(int(tail))
    return sorted(on & set(indices)) if on else list(indices)


def stuck_findings(stuck, indices):
    """{gpu: [(verdict, reason)]} for targets that did not end (teardown.stuck_report rows:
    after SIGKILL, or stuck in their exit, where no SIGKILL is sent)."""
    out: dict = {}
    for s in stuck:
        how = "is stuck in its exit" if s.get("in_exit") else "outlived SIGKILL"
        if s.get("state") == "D":
            reason = ("pid %s (%s) is stuck in the kernel (state D, wchan %s) and %s: a GPU reset needs it gone, "
                      "so only a reboot frees this GPU" % (s["pid"], (s.get("cmdline") or "")[:60],
                                                           s.get("wchan") or wchan(s["pid"]), how))
            verdict_ = REBOOT
        else:
            reason = "pid %s (%s) %s in state %s" % (s["pid"], (s.get("cmdline") or "")[:60], how, s.get("state"))
            verdict_ = UNKNOWN
        for g in gpus_of(s, indices):
            out.setdefault(g, []).append((verdict_, reason))
    return out


def xid_findings(events, bus_to_index, indices):
    """({gpu: [(verdict, reason)]}, [notes]) from Xid events. An Xid is held against a GPU only
    when it names that GPU (NVML's event) or its bus: one on a bus no listed GPU has, or read
    where no bus is known (fake GPUs, no NVML), is only noted - spread to every GPU, one forged
    or foreign line would make the whole node read "reboot needed" and drain it."""
    out: dict = {}
    elsewhere = []
    for e in events:
        v, why = xid.resolve(e)
        pid = " pid %s" % e["pid"] if e.get("pid") else ""
        text = (" [%s]" % e["message"][:80]) if e.get("message") else ""
        on = [e["gpu"]] if e.get("gpu") is not None else (
            [bus_to_index[e["bus"]]] if e.get("bus") in bus_to_index else [])
        if not on:
            elsewhere.append("Xid %d%s on PCI %s, not among the GPUs listed here: not held against them (%s: %s)%s"
                             % (e["xid"], pid, e.get("bus"), v, why, text))
            continue
        for g in on:
            out.setdefault(g, []).append((v, "Xid %d%s: %s%s" % (e["xid"], pid, why, text)))
    return out, elsewhere


class _Findings:
    """Per GPU index: findings [(verdict, why)], what was read, and notes on what was not."""

    def __init__(self, indices):
        self.indices = indices
        self.per: dict = {i: [] for i in indices}
        self.read: dict = {i: [] for i in indices}
        self.notes: dict = {i: [] for i in indices}
        self.fabric: dict = {}
        self.bus_to_index: dict = {}

    def nvml(self, gpus, source, timeout_s):
        """NVML's health queries, GPU by GPU, each call bounded: a driver that stops answering
        is a reboot, and is not asked again."""
        nv = source.nvml
        hung = None
        for g, h in zip(gpus, source.handles):
            i = g["index"]
            if hung is not None:  # the driver stopped answering: the next call would wait as long again
                self.per[i].append((REBOOT, "%s (on GPU %s); not asked again: reboot the node" % (hung, hung.gpu)))
                continue
            try:
                self.bus_to_index[bounded(lambda h=h: xid._bus_id(nv, h), timeout_s, "nvmlDeviceGetPciInfo")] = i
                f, r, u = bounded(lambda h=h: nvml_checks(nv, h), timeout_s, "NVML health queries")
                fab = bounded(lambda h=h: _fabric_of(nv, h), timeout_s, "nvmlDeviceGetGpuFabricInfoV")
            except Hung as exc:
                hung, exc.gpu = exc, i
                source.hung = True  # gpuinfo skips nvmlShutdown: it would wait on the stuck call
                self.per[i].append((REBOOT, "%s on GPU %s: the driver does not answer; a reset goes through the "
                                            "same driver, so reboot the node" % (exc, i)))
                continue
            except Exception as exc:
                self.notes[i].append("NVML health: %s" % _err(exc))
                continue
            self.per[i] += f
            self.read[i] += r
            self.notes[i] += ["not read: " + x for x in u]
            self._fabric(i, fab)

    def _fabric(self, i, fab):
        if "error" in fab:
            self.notes[i].append("not read: fabric state: %s" % fab["error"])
            return
        self.fabric[i] = fab
        if fab["state"] != fabric.NOT_SUPPORTED:  # no fabric is no answer about this GPU's health
            self.read[i].append("fabric %s" % fabric.words(fab))
        why = fabric.finding(fab)
        if why:
            self.per[i].append((NOT_READY, why))

    def probe(self, result):
        """The CUDA probe's findings (probe.py), each with what NVML read about the GPU."""
        for i in self.indices:
            r = ((result or {}).get("gpus") or {}).get(str(i)) or {}
            v = {cuda_probe.FAILED: NOT_READY if r.get("code") == 802 else RESET,
                 cuda_probe.HUNG: REBOOT}.get(r.get("state") or "")
            if v is not None:
                nvml = "; NVML read: %s" % ", ".join(self.read[i]) if self.read[i] else ""
                self.per[i].append((v, "CUDA probe %s: %s%s" % (r["state"], r.get("error"), nvml)))

    def smi(self, timeout_s):
        """The same from nvidia-smi's CSV, where there is no NVML."""
        try:
            res = smi_checks(timeout_s)
        except Hung as exc:
            res = {}
            for i in self.indices:
                self.per[i].append((REBOOT, "%s: the driver does not answer; reboot the node" % exc))
        except OSError as exc:
            res = {}
            for i in self.indices:
                self.notes[i].append("nvidia-smi: %s" % exc)
        for i, (f, r, bus) in res.items():
            if i in self.per:
                self.per[i] += f
                self.read[i] += r
                self.bus_to_index[bus] = i

    def xids(self, source_name, since_us, watch, kmsg):
        """Xid findings (NVML's event watch, else the kernel log since the teardown started);
        returns the lines about GPUs that are not these."""
        if watch is not None and watch.evset is not None:
            events = watch.drain()
            for i in self.indices:
                self.read[i].append("NVML Xid events since the teardown started")
        elif since_us is not None and source_name != gpuinfo.SandboxSource.name:  # fake GPUs: not the log's
            events, where, error = xid.kernel_log(since_us, kmsg)
            for i in self.indices:
                if where:
                    self.read[i].append("kernel log (%s) since the teardown started" % where)
                else:
                    self.notes[i].append("kernel log not readable: %s" % error)
        else:
            return []
        per_x, elsewhere = xid_findings(events, self.bus_to_index, self.indices)
        for i, f in per_x.items():
            self.per[i] += f
        return elsewhere


def assess(gpus, source, since_us=None, stuck=(), watch=None, timeout_s=None, kmsg="/dev/kmsg", probe=None):  # noqa: PLR0913
    """Set g['health'] = {verdict, reasons, read} on every GPU row; returns the rows.

    since_us: Xids logged from then (kernel-log clock, xid.now_us()) count; None: no window
    (verify and status without a teardown: the kernel log is not consulted). watch: an
    xid.NvmlWatch started with the teardown (its events are used instead of the log). probe:
    a probe.run result; each GPU row gets its part (g['probe']) and g['fabric'] where read."""
    source = source.opened()[0] if hasattr(type(source), "opened") else source  # a gpuinfo.Opening: the source
    timeout_s = CALL_TIMEOUT_S if timeout_s is None else timeout_s
    found = _Findings([g["index"] for g in gpus])
    name = getattr(source, "name", "none")
    if name == "nvml":
        found.nvml(gpus, source, timeout_s)
    elif name == "nvidia-smi":
        found.smi(timeout_s)
    else:
        for i in found.indices:
            found.notes[i].append("no NVML on this host (GPU source: %s): recovery action and remapped rows not read"
                                  % name)
    answered = {i: bool(found.read[i]) for i in found.indices}  # the GPU itself answered (NVML, nvidia-smi):
    # the Xid sources below only add findings; an empty kernel log alone never makes a GPU "ok"
    elsewhere = found.xids(name, since_us, watch, kmsg)
    for i, f in stuck_findings(stuck, found.indices).items():
        found.per[i] += f
    found.probe(probe)
    for g in gpus:
        i = g["index"]
        if i in found.fabric:
            g["fabric"] = found.fabric[i]
        if probe is not None:
            g["probe"] = (probe.get("gpus") or {}).get(str(i))
        h = verdict(found.per[i], answered[i])
        h["reasons"] += (found.notes[i] if h["verdict"] == UNKNOWN else []) + elsewhere
        h["read"] = found.read[i]
        g["health"] = h
    return gpus


def exit_code(code, gpus):
    """A free result (exit 0, or 11: free with a starter alive) with a GPU that needs a drain,
    reset or reboot exits 9 instead."""
    free = code in (codes.EXIT_OK, codes.EXIT_STARTER_ALIVE)
    if free and any((g.get("health") or {}).get("verdict") in UNHEALTHY for g in gpus):
        return codes.EXIT_UNHEALTHY
    return code


def summary(gpus):
    """'GPU 0: reset needed (remapped rows pending...)' lines for the problems list."""
    out = []
    for g in gpus:
        h = g.get("health") or {}
        if h.get("verdict") in UNHEALTHY:
            out.append("GPU %s: %s: %s" % (g["index"], h["verdict"].upper(), "; ".join(h["reasons"][:3])))
    return out
