"""A fleet at a glance: one line per host, before any host's details (status, verify).

Why: `status --host gpu[1-8]` printed eight sections of tables, and nobody could see which
GPUs were free without reading them all. The summary says, per host in the order given:
how many GPUs are free of the total, how many processes hold a GPU (those a teardown would
stop, and the protected ones), and the verdict with the exit code it gives, so the fleet's
exit code (the highest of them) can be traced to its host. A host that did not answer is a
line too, saying so: it is never left out.

A GPU counts free only where nothing says otherwise: no compute process listed, used memory
read and at or under the threshold, and no unprotected holder on it (one with GPU memory is
on those GPUs; one holding only device handles is on the GPU of each `nvidiaN` file it has
open, and on every GPU when it holds none of those). Where some process could not be
inspected, the count is `?`: an unseen holder may be on any GPU.
"""
from __future__ import annotations

import os
import re

from ..agent.wire import codes, defaults, records
from .health import gpu_health
from .render import Col, paint, record, table
from .status import failed, no_gpu_visible, scan_of

_PER_GPU_FILE = re.compile(r"nvidia(\d+)")


def _gpu_of_file(path: str) -> str | None:
    """The GPU index of a per-GPU device file (`/dev/nvidia3` -> "3"); None for nvidiactl, uvm."""
    m = _PER_GPU_FILE.fullmatch(os.path.basename(path))
    return m.group(1) if m else None


def _held(scan: records.ScanResult) -> tuple[set, bool]:
    """(the GPU indices unprotected holders are on, whether one is on every GPU)."""
    on: set = set()
    everywhere = False
    for h in scan.holders:
        if h["protected"]:
            continue
        if h.get("gpu_mib"):
            on |= {str(k) for k in h["gpu_mib"]}
            continue
        files = {i for i in map(_gpu_of_file, h.get("devices") or []) if i is not None}
        on |= files
        everywhere = everywhere or not files
    return on, everywhere


def gpus_free(x, max_used_mib: int = defaults.MAX_USED_MIB) -> str:
    """`free/total` GPUs of a scan or verify result ('?/total' where not every process could be
    inspected); the GPUs are the source's rows, else the host's `nvidiaN` files."""
    scan = scan_of(x)
    on, everywhere = _held(scan)
    if scan.gpus:
        total = len(scan.gpus)
        free = 0 if everywhere else sum(
            1 for g in scan.gpus if not g["processes"] and g["used_mib"] is not None and not g.get("unread")
            and g["used_mib"] <= max_used_mib and str(g["index"]) not in on)
    else:
        indices = {i for i in map(_gpu_of_file, scan.devices) if i is not None}
        total = len(indices)
        free = 0 if everywhere else len(indices - on)
    if scan.denied or scan.proc_hidden:
        return f"?/{total}"
    return f"{free}/{total}"


def holders(x) -> str:
    """`2 (+3 protected)`: the holders a teardown may stop, and the protected ones beside them."""
    scan = scan_of(x)
    kept = sum(1 for h in scan.holders if h["protected"])
    free_to_stop = len(scan.holders) - kept
    return f"{free_to_stop}" + (f" (+{kept} protected)" if kept else "")


def status_verdict(x) -> str:
    """What `status` tells of a host, in the words `verify` would use."""
    scan = scan_of(x)
    if no_gpu_visible(scan):
        return "NO GPU VISIBLE"
    if scan.denied or scan.proc_hidden:
        return "NOT INSPECTED (run as root)"
    free, total = gpus_free(scan).split("/")  # the default threshold, as verify's default
    if any(not h["protected"] for h in scan.holders) or free != total:
        return "NOT FREE"
    return _unhealthy(scan, "FREE")


def verify_verdict(x) -> str:
    """verify's own verdict for a host (its exit code, in words)."""
    v: records.VerifyResult = record(x)
    if no_gpu_visible(v.scan):
        return "NO GPU VISIBLE"
    if v.code == codes.EXIT_UNINSPECTED:
        return "NOT INSPECTED (run as root)"
    if v.code == codes.EXIT_UNHEALTHY:
        return "FREE, GPU UNHEALTHY"
    return "FREE" if v.free and v.code == codes.EXIT_OK else "NOT FREE"


def _unhealthy(scan: records.ScanResult, word: str) -> str:
    bad = [g for g in scan.gpus if gpu_health(g)["verdict"] in ("not ready", "drain", "reset needed", "reboot needed")]
    return f"{word}, GPU UNHEALTHY" if bad else word


def failure(out) -> tuple[int, str]:
    """(exit code, words) of a host whose call failed (a fleet Outcome with a Failure): the code
    its failure gives, else not free, and `UNREACHABLE: why` without the host's name (its row
    names it), cut only between words and only past 160 characters (the whole error is on
    stderr): a port or a pid is never cut inside."""
    import textwrap

    code = out.failure.code or codes.EXIT_NOT_FREE
    said = " ".join(out.failure.said.split())
    alias = out.host.alias
    said = said[len(alias) + 2:] if said.startswith(f"{alias}: ") else said
    return code, f"{failed(out.failure).upper()}: {textwrap.shorten(said, 160, placeholder=' ...')}"


def summary(outcomes, verdict, max_used_mib: int = defaults.MAX_USED_MIB) -> str:
    """The fleet's summary table: a row per host in the order given, each with its exit code in
    a column of its own, 0 included (a code shown on some rows only read as a code missing).
    `verdict(result)`: the task's words for an answering host's result (status_verdict,
    verify_verdict); its exit code is the call's (AgentResult.code), a failed host's the one
    its failure gives (failure)."""
    rows = []
    for out in outcomes:
        alias = out.host.alias
        if out.failure is not None:
            code, words = failure(out)
            rows.append([alias, "-", "-", code, words])
            continue
        result = out.value.result
        rows.append([alias, gpus_free(result, max_used_mib), holders(result), out.value.code, verdict(result)])
    return paint(table(["host", "GPUs free/total", "holders", "exit", Col("verdict", "wrap", 24)], rows))
