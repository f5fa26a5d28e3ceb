"""Render teardowns: the plan, progress lines, the before/after table and every verdict.

Why one module: the same plan table is shown by `invoke plan`, before the confirmation
prompt of `invoke teardown`, and by `--dry-run`; and a teardown's verdict (FREED and
verified, NOT FREE, LOCKED, UNREACHABLE) is said here only: in the report of one host
(report), the line of each host of a fleet as it finishes (host_line), the fleet's summary
table (summary) and a pivot's teardown step (brief). Each takes the contract's record
(records.TeardownResult, records.Plan) or what carries it (transport.AgentResult, a
fleet Outcome); an agent document (dict) is read through the contract first.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..agent.wire import codes, records
from . import health as health_view
from .render import Col, Command, Progress, command, note, paint, record, shorten, shown, table
from .status import header, still_holding, where, writing_line

if TYPE_CHECKING:
    from ..agent.wire.rows import GpuRow, PlanRow


def mib_words(mib: int | None, about: str = "") -> str:
    """'1234 MiB', or 'an unknown amount' where no figure was read (no NVML): never 0."""
    return "an unknown amount" if mib is None else f"{about}{mib} MiB"


def _mib(row: PlanRow) -> str:
    """A process's GPU MiB: its sum, "unknown" where it holds a GPU whose share was not read
    (no NVML), "-" where it holds none."""
    gpu_mib = row.get("gpu_mib") or {}
    if any(v is None for v in gpu_mib.values()) or (row.get("devices") and not gpu_mib):
        return "unknown"
    return str(sum(v for v in gpu_mib.values() if v)) if gpu_mib else "-"


COMMAND = Col("command", "command", 30)


def plan_tables(x) -> str:
    """The plan (records.Plan, or a plan or teardown result holding one) as tables."""
    if isinstance(x, dict):
        x = records.read_plan(x["plan"]) if "command" in x else records.read_plan(x)
    plan: records.Plan = shown(getattr(x, "plan", x))
    out = []
    if plan.targets:
        rows = [[t["pid"], t["state"], where(t), _mib(t), t["via"], Command.of(t)] for t in plan.targets]
        out.append(f"Targets ({len(rows)}; will free {mib_words(plan.will_free_mib, 'about ')} of GPU memory)\n" +
                   table(["pid", "state", Col("unit/container", "cut", optional=True), "GPU MiB",
                          Col("stopped by", "wrap", 10), COMMAND], rows, "  ",
                         details=["why: " + t["reason"] for t in plan.targets]))
    else:
        out.append(note("Targets: none (nothing matches the target patterns and no unprotected process holds a GPU)",
                        "", "  "))
    if plan.protected:
        rows = [[p["pid"], "PROTECTED", Command.of(p)] for p in plan.protected]
        out.append("Protected, never signalled\n" + table(["pid", "protected", COMMAND], rows, "  ",
                                                          details=["why: " + p["reason"] for p in plan.protected]))
    if plan.left_alone:
        rows = [[p["pid"], _mib(p), Command.of(p)] for p in plan.left_alone]
        out.append("Left alone although they hold a GPU (reported, not signalled)\n"
                   + table(["pid", "GPU MiB", COMMAND], rows, "  ",
                           details=["why: " + (p.get("reason") or "-") for p in plan.left_alone]))
    out.extend(note(writing_line(w["pid"], w["files"])) for w in plan.writing)
    out.extend(note(checkpoint_plan_line(c)) for c in plan.checkpoint_stops)
    out.extend(note(f"shared memory pid {r['pid']} may leave: {shm_what(r)}, removed once FREED unless another "
                    "process holds it (--keep-shm keeps it)") for r in plan.shm)
    for u in plan.units:
        how = f"pct exec {u['ctid']} -- systemctl" if u.get("ctid") else "systemctl"  # a unit inside an LXC CT
        out.append(note(f"unit {u['unit']} will be stopped with {how}{' and disabled' if u['disable'] else ''}"
                        + (f" ({u['pending']})" if u.get("pending") else "")))
    for c in plan.containers:
        name = f"{c['name']} ({c['id'][:12]})" if c.get("name") else c["id"][:12]
        out.append(note(f"container {name} will be stopped with docker stop"
                        + (" (its restart policy set to no first)" if c.get("disable") else "")
                        + (f" ({c['pending']})" if c.get("pending") else "")))
    out.extend(manager_lines(plan.managers))
    out.extend(starter_lines(plan.starters))
    out.extend(note(f"UNSEEN pid {u['pid']}: {u['why']}; what started it cannot be seen from here, so the "
                    "verdict is at best 11 (starter-alive), never FREED") for u in plan.unseen)
    scope = plan.scope
    if scope.get("text") or scope.get("uid") is not None:
        out.append(note(f"scope: only processes with {scope.get('text')!r} in their command line"
                         + (f", owned by uid {scope['uid']}" if scope.get("uid") is not None else "")))
    out.extend(note(f"rule: {r}") for r in plan.rules)
    return paint("\n".join(out))


def checkpoint_plan_line(c) -> str:
    """A running phase's checkpoint stop as the plan shows it: signal, pids, what it waits for."""
    pids = " ".join(map(str, c.get("pids") or []))
    return (f"CHECKPOINT STOP phase {c.get('phase')}: SIG{str(c.get('signal')).upper().removeprefix('SIG')} to "
            f"pid {pids} first, then wait up to {c.get('deadline_s'):g}s for {c.get('waits_for')}; then the "
            "targets' SIGTERM, SIGKILL after grace")


def checkpoint_result(c) -> str:
    """A checkpoint stop's outcome: the file that arrived and when, or why none counted."""
    head = f"phase {c.get('phase')}: SIG{str(c.get('signal')).upper().removeprefix('SIG')}"
    if c.get("arrived"):
        return f"{head}: checkpoint {c.get('checkpoint')} arrived after {c.get('waited_s')}s"
    what = {"idle": "idle", "job exited": "the job exited"}.get(c.get("outcome", ""),
                                                                 f"deadline {c.get('deadline_s'):g}s passed")
    return f"{head}: no checkpoint ({what} after {c.get('waited_s')}s)" + (f": {c['note']}" if c.get("note") else "")


def shm_what(r) -> str:
    """A shared memory leftover in words: its file or System V segment, and its bytes."""
    what = r.get("path") if r.get("kind") == "file" else f"System V segment {r.get('shmid')}"
    return f"{what} ({size_words(r.get('bytes', 0))}, of pid {r.get('pid')})"


def size_words(n) -> str:
    """Bytes as a person reads them: '512 bytes', '4.0 KiB', '1.0 MiB', '2.5 GiB'."""
    if n < 1024:
        return f"{n} bytes"
    for unit in ("KiB", "MiB", "GiB"):
        n /= 1024.0
        if n < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}"
    return f"{n:.1f} GiB"  # not reached: GiB ends the loop


FATE_WORDS = {
    "stop": "frozen before the targets' SIGTERM, ended after them (the job's own)",
    "freeze": "frozen during the stop, then thawed: not ended (to stop it: {hint})",
    "watch": "never signalled; the verdict looks whether it is idle (to stop it: {hint})",
}


def starter_lines(starters: list) -> list[str]:
    """Each process related to a target (agent/policy/relation.py) and what the teardown does to it."""
    out = []
    for s in starters:
        what = FATE_WORDS.get(s.get("fate", ""), "{hint}").format(hint=s.get("hint"))
        if s.get("foreground"):
            what += "; the server ran in its foreground: a loop typed there gets Ctrl-C"
        out.append(note(f"STARTER pid {s['pid']} ({command(s, 60)}): {s.get('reason')}; {what}"))
    return out


def manager_lines(stops: list) -> list[str]:
    """Each manager of a target (plan.managers), its program's name and what the teardown does
    with it: runs its stop, or names it (not signalled) with the exact command to run by hand."""
    out = []
    for m in stops:
        what = f"{m['kind']} {m.get('name') or '(name unreadable)'}"
        pids = ", ".join(map(str, m.get("pids") or []))
        if m.get("run"):
            out.append(note(f"{what} (pid {pids}) will be stopped with {m.get('command')}"))
        else:
            run = (f"`{m['first']}` first, then `{m['command']}`" if m.get("first") else f"`{m['command']}`") \
                if m.get("command") else "its manager's own stop"
            out.append(note(f"MANAGED pid {pids}: {what} runs it and would start it again: NOT signalled; "
                            f"to stop it run {run} ({m.get('why')})"))
    return out


def progress_line(alias: str, p: dict, kill_in: float | None = None) -> str:
    """One progress line of a running teardown (the fields of frame.parse_progress), fitted
    to the width (wrapped, never cut: a claim keeps its caveat). `kill_in`: the seconds left
    until SIGKILL, where the caller knows them (TeardownProgress)."""
    return note(_progress_text(alias, p, kill_in), "", "    ")


def _free_text(alias: str, p: dict, left: float | None = None) -> str:
    """The GPUs read free: a moment, not the verdict. FREED is the verdict's word alone (the
    last line, after the settle window): a line that said it here was followed by NOT FREE
    whenever a respawn came inside the window. `left`: the seconds of the window still to
    watch (a terminal's countdown)."""
    seen = f"{alias}: free at {_secs(p.get('free_at_s')):.2f}s"
    if p.get("settle_s"):
        countdown = "" if left is None else f": {max(0.0, left):.1f}s left"
        return f"{seen}, watching {_secs(p['settle_s']):g} s for a respawn before the verdict{countdown} (every GPU " \
               "read free, no holder left)"
    return f"{seen} (every GPU read free, no holder left); no respawn window to watch: the verdict follows"


def _secs(value) -> float:
    """A number of seconds from a progress line, 0 for anything else: a line a host sent
    that holds no number must not end the view (its error would stop the call's reader)."""
    try:
        return float(value or 0)
    except (TypeError, ValueError):
        return 0.0


def _progress_text(alias: str, p: dict, kill_in: float | None = None) -> str:
    if p.get("phase") == "free":  # seen free now; the verdict (exit code) comes after the settle window
        return _free_text(alias, p)
    alive = p.get("alive")
    parts = [f"{alias}: [{_secs(p.get('elapsed_s')):6.2f}s] {p.get('phase')}"]
    if kill_in is not None:  # first: a line cut to the terminal's width keeps it
        parts.append(f"SIGKILL in {kill_in:.1f}s")
    if alive is not None:
        parts.append(f"alive {len(alive)}" + (f" ({' '.join(map(str, alive[:8]))})" if alive else ""))
    if p.get("mib_left") is not None:
        parts.append(f"GPU MiB used {p['mib_left']}")
    if p.get("problems"):
        parts.append(f"waiting on: {p['problems'][0]}")
    return "  ".join(parts)


class TeardownProgress:
    """One host's running teardown as the CLI shows it (teardown.on_progress).

    On a terminal: one line rewritten in place (render.Progress, as `verify --wait` shows
    its wait), counting down to SIGKILL during the grace and to the verdict while a free
    stretch is watched for a respawn; a new line every half second scrolled the plan off the
    screen. Elsewhere (a pipe, a log): a line per update (progress_line). Either way the
    "free at" line comes once per free stretch: a repeat of the stretch already shown is
    dropped, and only a respawn (the agent's next progress names a problem or memory in use)
    makes the next one news."""

    def __init__(self, alias: str, grace_s: float, stream=None):
        self.alias, self.grace_s = alias, grace_s
        self.line = Progress(stream)
        self.sigterm_at: float | None = None
        self.free: dict | None = None  # the free stretch shown: its "free" progress fields

    def update(self, p: dict) -> None:
        p = shown(p)
        phase = p.get("phase")
        if phase == "sigterm":
            self.sigterm_at = _secs(p.get("elapsed_s"))
        if phase == "free":
            if self.free is not None and self.free.get("free_at_s") == p.get("free_at_s"):
                return
            self.free = p
        elif p.get("problems") or p.get("mib_left"):
            self.free = None  # the stretch ended: the next free is news
        if self.line.live:
            self.line.update(self._live_text(p))
        else:
            self.line.update(progress_line(self.alias, p, self._kill_in(p)))

    def _kill_in(self, p: dict) -> float | None:
        if self.sigterm_at is None or p.get("phase") not in ("sigterm", "grace"):
            return None
        return max(0.0, self.grace_s - (_secs(p.get("elapsed_s")) - self.sigterm_at))

    def _live_text(self, p: dict) -> str:
        stretch = self.free
        if p.get("phase") == "free":
            return _free_text(self.alias, p, _secs(p.get("settle_s")))
        if p.get("phase") == "verify" and stretch is not None and stretch.get("settle_s"):
            left = _secs(stretch.get("free_at_s")) + _secs(stretch["settle_s"]) - _secs(p.get("elapsed_s"))
            return _free_text(self.alias, stretch, left)
        return _progress_text(self.alias, p, self._kill_in(p))

    def done(self) -> None:
        """End the live line: the report starts on a line of its own."""
        self.line.done()


def before_after(x) -> str:
    t: records.TeardownResult = record(x)
    before = {g["index"]: g for g in t.before}
    after = {g["index"]: g for g in t.after}
    if not before and not after:
        return "GPU memory: no source on this host (device holders only)"
    rows = []
    for idx in sorted(set(before) | set(after)):
        b: GpuRow | dict = before.get(idx, {})
        a: GpuRow | dict = after.get(idx, {})
        rows.append([idx, b.get("used_mib", "?"), a.get("used_mib", "?"), len(b.get("processes", [])),
                     len(a.get("processes", [])), a.get("total_mib", b.get("total_mib", "?"))])
    return f"GPU memory before -> after (source: {t.gpu_source})\n" + \
        table(["gpu", "used before", "used after", "procs before", "procs after", "total MiB"], rows, "  ")


def actions(x) -> str:
    t: records.TeardownResult = record(x)
    recs = [r for r in t.actions if not r.get("shm")]  # shared memory removed: its own REMOVED lines
    if not recs:
        return ""
    rows = [[r["signal"], r["pid"], r["result"], Command.of(r)] for r in recs]
    return "Actions\n" + table(["action", "pid", Col("result", "wrap", 12), COMMAND], rows, "  ")


def _word(t: records.TeardownResult) -> str:
    """The verdict in one word or two, as the short lines say it."""
    if t.locked:
        return "LOCKED"
    if t.state_error:
        return "NOT STARTED"
    if t.code == codes.EXIT_UNHEALTHY:
        return "freed, GPU UNHEALTHY"
    return "freed" if t.code == codes.EXIT_OK else "NOT FREE"


def brief(x, wall_s: float | None = None) -> str:
    """'freed 1234 MiB, 3 target(s) stopped, 2 protected kept, 1.52s' (a pivot's teardown step)."""
    t: records.TeardownResult = record(x)
    if t.plan is None:  # it did not run
        return f"{_word(t)}: {t.error}"
    wall = t.wall_s if wall_s is None else wall_s
    return (f"{_word(t)} {mib_words(t.freed_mib)}, {len(t.plan.targets)} target(s) stopped, "
            f"{len(t.plan.protected)} protected kept, {wall:.2f}s"
            + "".join(f"; {checkpoint_result(c)}" for c in t.checkpoint_stops))


def shm_lines(x) -> list:
    """'REMOVED /dev/shm/nccl-1 (1.0 MiB, of pid 7)' or 'KEPT ...: why', one per shared-memory
    leftover the stopped targets left (agent/teardown/shm.py)."""
    return [f"{'REMOVED' if left.get('removed') else 'KEPT'} {shm_what(left)}"
            f"{'' if left.get('removed') else ': ' + str(left.get('why'))}" for left in record(x).shm_removed]


def host_line(outcome) -> str:
    """One line per host as it finishes, for a fleet teardown (outcome: a fleet.Outcome)."""
    alias = outcome.host.alias
    if outcome.failure is not None:
        from .fleet import failure

        return note(f"{alias}: {failure(outcome)[1]}", "", "    ")  # wrapped between words: a port stays whole
    return paint(note(f"{alias}: {brief(outcome.value, outcome.value.wall_s)}", "", "    "))


def verdict_lines(alias: str, x, code: int | None = None) -> list:
    """The end of a teardown report: why it is or is not free, in the words a person acts on.

    FREED only with exit 0, i.e. the agent saw every GPU free for the whole settle window,
    could inspect every process and sent every signal. (`code` is not needed: the record
    carries it; it is accepted for callers that still pass the document and its code.)
    """
    t: records.TeardownResult = record(x)
    if t.locked:
        return [f"{alias}: LOCKED: {t.error}"]
    if t.state_error or t.plan is None:
        return [f"{alias}: NOT STARTED: {t.state_error} (nothing was signalled)"]
    lines = []
    if t.unapproved:
        lines.append(f"  not signalled (appeared after the plan you approved): {[u['pid'] for u in t.unapproved]}")
    for a in t.adopted:
        lines.append(f"  also signalled pid {a['pid']}: {a['reason']} ({command(a, 60)})")
    for f in t.signal_failures:
        lines.append(f"  COULD NOT SIGNAL pid {f['pid']} ({f['signal']}: {f['result']}): it was not stopped")
    for r in t.appeared:
        lines.append(f"  RESPAWN pid {r['pid']} ({command(r, 60)}) {r['why']}")
        if r.get("include"):
            lines.append(f"    to stop what restarts it: {r['include']}")
    for act in t.actions:  # a stopped unit or container that starts again by itself (agent/teardown/units.py)
        if act.get("comes_back"):
            lines.append(f"  NOTE {shorten(act['signal'], 60)}: {act['comes_back']}")
    for s in t.stuck:
        lines.append(f"  STUCK pid {s['pid']} state {s['state']} GPU MiB {s['gpu_mib']}: {s['why']}")
    for c in t.concurrent_teardowns:
        lines.append(f"  NOTE another user's teardown ran beside this one: pid {c['pid']} ({c['user']}): "
                     f"{command(c, 60)}")
    lines.extend("  " + line for line in shm_lines(t))
    lines.extend(f"  CHECKPOINT {checkpoint_result(c)}" for c in t.checkpoint_stops)
    for e in t.record_errors:
        lines.append(f"  WARNING {e} (the teardown itself finished)")
    lines.append(f"{alias}: {_verdict(t)} {_timing(t)} (freed {mib_words(t.freed_mib)}, "
                 f"{t.signalled} signals sent, {len(t.plan.protected)} protected kept)")
    if t.code:
        lines.extend("  " + p for p in t.problems)
    return lines


def _timing(t: records.TeardownResult) -> str:
    """`free at 0.41s, settled at 0.41s (settle: ...)`: when it read free and when the answer came."""
    if t.free_at_s is not None and t.settled_at_s is not None:
        return f"free at {t.free_at_s:.2f}s, settled at {t.settled_at_s:.2f}s " + (
            f"({t.settle_s:g}s watched for respawns)" if not t.settle_ended else f"(settle: {t.settle_ended})")
    if t.free_at_s is not None:
        return f"free at {t.free_at_s:.2f}s, then not free; in {t.wall_s:.2f}s"
    return f"in {t.wall_s:.2f}s"


def _verdict(t: records.TeardownResult) -> str:
    if t.code == codes.EXIT_OK:
        return "FREED and verified"
    if t.code == codes.EXIT_UNHEALTHY:
        return "FREED, but a GPU needs a reset, a reboot or draining (GPU health below)"
    return "NOT FREE (could not inspect every process)" if t.code == codes.EXIT_UNINSPECTED else "NOT FREE"


def report(alias: str, result, sandbox: bool = False) -> str:
    """One host's whole teardown report: actions, GPU memory before -> after, the verdict,
    and what still holds a GPU when it is not free. Locked or not started: one line."""
    t: records.TeardownResult = record(result)
    if not t.ran:
        return paint("== " + verdict_lines(alias, t)[0])
    verdict = "\n".join(note(v.lstrip(), v[:len(v) - len(v.lstrip())], " " * (len(v) - len(v.lstrip()) + 4))
                        for v in verdict_lines(alias, t))  # fitted to the width, words never cut
    parts = [header(alias, t, sandbox), actions(t), before_after(t), verdict,
             health_view.health(t, alias), health_view.mps(t)]
    if t.code and t.code != codes.EXIT_UNHEALTHY:
        parts.append(still_holding(t))
    return paint("\n".join(p for p in parts if p))


def summary(outcomes) -> str:
    """The table after a fleet teardown: one row per host, in the order given, each with its
    exit code in a column of its own (0 included), as the status and verify fleet summaries."""
    from .fleet import failure

    rows = []
    for out in outcomes:
        if out.failure is not None:
            code, words = failure(out)
            rows.append([out.host.alias, "-", "-", "-", "-", code, words])
            continue
        t: records.TeardownResult = record(out.value)
        result = "locked" if t.locked else ("not started" if t.state_error else _word(t))
        plan = t.plan or records.Plan(targets=[], protected=[])
        rows.append([out.host.alias, (t.freed_mib if t.freed_mib is not None else "unknown") if t.ran else "-",
                     len(plan.targets), len(plan.protected),
                     f"{out.value.wall_s:.2f}s", out.value.code, result])
    return paint("Summary\n" + table(["host", "freed MiB", "targets", "protected kept", "wall", "exit",
                                       Col("result", "wrap", 20)], rows, "  "))
