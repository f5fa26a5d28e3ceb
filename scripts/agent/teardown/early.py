"""The teardown's first SIGTERM batch: the processes a target pattern names, sent as soon as
the scan's workers have read every process's record, before the fd tables and maps are read.

Why: on a host of 20,000 processes the holder scan takes ~0.18 s, and most of it reads every
process's open files and maps, which only finds holders no pattern names (an orphaned
worker, a renamed one). The server and its workers are named by the patterns; making them
wait for the rest of the scan put the first signal at 0.2 s and "free at" at 1.6x the floor.

The whole account: docs/design-notes.md (scripts/agent/teardown/early.py)."""
import os

from ..holders import scan
from ..policy import managers, relation, rules
from ..procs import procfs, procscan
from . import plan


def own_chain():
    """This agent and its ancestors, read from /proc now (the scan's self_chain, before its
    table is complete)."""
    return set(procscan.ancestors(os.getpid(), _Live()))


class _Live:
    """A process table that reads /proc at each look (what procscan.ancestors asks of one)."""

    @staticmethod
    def get(pid):
        return procfs.read_stat(pid)


class _OnDemand(dict):
    """The records the early batch looks at: the marked ones, and any other read from /proc the
    first time it is asked for, when its start time and its parent are the ones the scan read (`starts`, `parents`: a
    target's tree, filled as _Kids finds it; a few processes, read here rather than every
    record sent from the workers)."""

    def __init__(self, records):
        super().__init__((r["pid"], r) for r in records)
        self.starts: dict = {}
        self.parents: dict = {}  # pid -> the parent the scan's table gave it

    def _load(self, pid):
        if dict.__contains__(self, pid) or pid not in self.starts:
            return
        try:
            info = procscan.basic(pid)
        except Exception:  # data no parser here understands: the full plan decides about it
            info = None
        if info is not None and info["start_time"] == self.starts[pid] and \
                info["ppid"] == self.parents.get(pid, info["ppid"]):  # still that parent's child
            dict.__setitem__(self, pid, info)

    def __contains__(self, pid):
        self._load(pid)
        return dict.__contains__(self, pid)

    def __getitem__(self, pid):
        self._load(pid)
        return dict.__getitem__(self, pid)


class _Kids:
    """plan._Picked.trees' `kids` (parent pid -> child pids) from the scan's Kin, noting each
    child's start time for _OnDemand as it is asked for."""

    def __init__(self, kin, procs):
        self.kin, self.procs = kin, procs

    def get(self, parent, default=()):
        pairs = self.kin.children(parent)
        for pid, start in pairs:
            self.procs.starts.setdefault(pid, start)
            self.procs.parents.setdefault(pid, parent)
        return [pid for pid, _ in pairs] or default


def pick(records, sel, approved, table=()):
    """Plan rows (via "signal") for what plan.build makes targets by a pattern - the marked
    `records` and their trees (`table`: every process's parent and start time, a procscan.Kin
    or (pid, ppid, start_time) rows) - and could only signal; sorted by pid."""
    kin = table if isinstance(table, procscan.Kin) else procscan.Kin.of_rows(table)
    procs = _OnDemand(records)
    picked = plan._Picked(procs, own_chain() | {os.getpid()}, sel)
    # another person's copy is the full plan's to judge: only it knows whether its tree holds a GPU
    matched = [r["pid"] for r in sorted(records, key=lambda r: r["pid"])
               if r.get("mark") and plan.in_scope(r, sel) and not plan.another_persons(r, sel)
               and picked.add(r["pid"], r["mark"])]
    picked.trees(matched, _Kids(kin, procs))
    now = scan.procfs_now_ticks()
    rows = []
    seen: dict = {}
    for pid in sorted(picked.reasons):
        info = procs[pid]
        if approved is not None and (pid, info["start_time"]) not in approved:
            continue
        full = procscan.detail(info, [], now_ticks=now)
        if plan.stoppable_unit(full["unit"]) or full["container"] or full.get("gone") or _under_manager(pid, seen):
            continue  # its manager may be the one to stop it (or it has exited): the full plan decides
        full["gpu_mib"] = {}
        row = plan._row(full, picked.reasons[pid])
        row["via"] = "signal"
        rows.append(row)
    return rows


def _under_manager(pid, seen):
    """Is a manager's daemon (supervisord, runsv, a raylet: managers.is_manager_daemon) among
    pid's ancestors, read from /proc now? Then the full plan decides: it stops the program
    through that manager, or names it and signals nothing (the manager would start it again).
    `seen` {pid: answer} is shared by the batch: a server's workers share its ancestry."""
    chain: list = []
    answer = False
    while pid > 1 and pid not in seen and len(chain) < 64:
        chain.append(pid)
        info = procscan.basic(pid)
        if info is None:
            break
        if chain[1:] and managers.is_manager_daemon(info):
            answer = True
            break
        pid = info["ppid"]
    answer = answer or seen.get(pid, False)
    for p in chain:
        seen[p] = answer
    return answer


def starters(rows, sel, approved):
    """The early batch's related starters to freeze before its SIGTERM (relation.py): the
    ancestors of its targets, read from /proc now, in the scope, not protected, not another
    person's nor a manager's daemon, approved where a plan was shown. The full plan decides
    their fate later; this only keeps them from starting anything meanwhile."""
    table = {r["pid"]: r for r in rows}
    for r in rows:
        pid = r["ppid"]
        for _ in range(64):
            if pid in (0, 1) or pid in table:
                break
            info = procscan.basic(pid)
            if info is None:
                break
            table[pid] = info
            pid = info["ppid"]
    chain = own_chain() | {os.getpid()}
    out = []
    for link in relation.Relation(rows, table, chain).links.values():
        info = table[link["pid"]]
        if link["fate"] == "watch" or rules.protect_reason(info, chain, sel.protect) \
                or not plan.in_scope(info, sel) or plan.another_persons(info, sel):
            continue
        if approved is None or (link["pid"], link["start_time"]) in approved:
            out.append(link)
    return out


class Batch:
    """scan.collect's `early` callback: picks the batch and hands it to `send(rows)` at once.
    Never raises into the scan: an error is kept (`error`) and the rest of the teardown goes on
    with the full plan; what was sent before it is in `rows`."""

    def __init__(self, sel, approved, send):
        self.sel, self.approved, self.send = sel, approved, send
        self.rows: list = []
        self.pipes: dict = {}  # pid -> the pipes on its stdin/stdout/stderr, read before its SIGTERM
        self.error = None

    def __call__(self, records, table=()):
        try:
            self.rows = pick(records, self.sel, self.approved, table)
            if self.rows:
                # a dying target closes its fds: the plan tells its pipeline's other end by them
                self.pipes = {r["pid"]: relation.target_pipes(r["pid"]) for r in self.rows}
                self.send(self.rows)
        except Exception as exc:  # the full plan still runs: this batch only saves time
            self.error = "the early SIGTERM batch failed (%s: %s); the plan's batch sent the rest" % (
                type(exc).__name__, exc)


def merge(the_plan, rows):
    """The plan with the early batch's rows it does not list (they exited, or began to, before
    the full scan read them): the plan states every process that was signalled, and its `gone`
    (not signalled) none of them."""
    have = {(t["pid"], t["start_time"]) for t in the_plan["targets"]}
    extra = [r for r in rows if (r["pid"], r["start_time"]) not in have]
    if extra:
        the_plan["targets"] = sorted(the_plan["targets"] + extra, key=lambda t: t["pid"])
    sent = {(r["pid"], r["start_time"]) for r in rows}
    if the_plan.get("gone"):
        the_plan["gone"] = [g for g in the_plan["gone"] if (g["pid"], g["start_time"]) not in sent]
    return the_plan


def as_plan(rows, sel):
    """A plan of the early batch alone, shaped as plan.build's (when the full scan failed after
    the batch went out: teardown.unverified records what was signalled)."""
    return {"targets": rows, "protected": [], "left_alone": [], "starters": [], "units": [], "containers": [],
            "patterns": plan.patterns_of(sel), "scope": {"text": sel.scope, "uid": sel.scope_uid},
            "rules": list(plan.RULES), "will_free_mib": 0, "writing": []}
