"""Resume drained Slurm nodes whose GPUs verify free, and only those; say what was done per node.

Why not `scontrol update state=resume` by hand: a node the epilog drained because a process
would not leave its GPU goes back into service with that process still there, and the next
job fails on it (or shares its memory). So each drained node is verified over ssh (the
agent's `verify`, the same FREE as a teardown's) before it is resumed, and a node is never
resumed that was drained for a reason that is not about leftover GPU processes (a person's
"bad DIMM, do not use" stays until `--force`).

Why only on exit 0: `verify` reads "free" also when a GPU has no process left but needs a
reset or the node a reboot (exit 9, REBOOT NEEDED); a node resumed then fails its next job.

The whole account: docs/design-notes.md (scripts/engines/undrain.py)."""
from __future__ import annotations

import subprocess
from dataclasses import dataclass

from ..agent.wire import codes, records

# Drain reasons that mean "a job's processes may be left on the GPUs": ours, and Slurm's own
# for a failed epilog / prolog and for a job step that would not die.
GPU_REASONS = ("gpu-pivot ", "Epilog error", "Prolog error", "Kill task failed")
SLURM_TIMEOUT_S = 15.0


class SlurmError(RuntimeError):
    """sinfo or scontrol failed: one line with what it said."""


@dataclass
class NodeResult:
    node: str
    action: str  # resumed | left drained | not drained | left alone | unreachable
    detail: str
    code: int

    def line(self) -> str:
        return f"{self.node}: {self.action}: {self.detail}" if self.detail else f"{self.node}: {self.action}"


def _slurm(argv: list) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=SLURM_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SlurmError(f"{argv[0]}: {exc}") from None
    if done.returncode:
        raise SlurmError(f"{' '.join(argv[:3])} exited {done.returncode}: {done.stderr.strip()}")
    return done.stdout


def node_states(nodes: list) -> dict:
    """{node: (state, reason)} from sinfo, one row per node; a node Slurm does not know is absent."""
    out = _slurm(["sinfo", "-h", "-N", "-n", ",".join(nodes), "-o", "%N|%T|%E"])
    states = {}
    for line in out.splitlines():
        name, _, rest = line.partition("|")
        state, _, reason = rest.partition("|")
        states[name] = (state.strip(), reason.strip())
    return states


def resume(node: str) -> None:
    _slurm(["scontrol", "update", f"nodename={node}", "state=resume"])


def _gpu_reason(reason: str) -> bool:
    return reason.startswith(GPU_REASONS)


def decide(node: str, state: str | None, reason: str, force: bool) -> NodeResult | None:
    """The outcome for a node that needs no verify, or None when it must be verified."""
    if state is None:
        return NodeResult(node, "left alone", "Slurm knows no such node", codes.EXIT_USAGE)
    if not state.startswith("drained"):
        if state.startswith("draining"):
            return NodeResult(node, "left drained", f"still draining (jobs running; reason: {reason})",
                              codes.EXIT_NOT_FREE)
        return NodeResult(node, f"not drained ({state})", "nothing to do", codes.EXIT_OK)
    if not (force or _gpu_reason(reason)):
        return NodeResult(node, "left alone", f"drained for another reason ({reason!r}); --force resumes it "
                          "after a clean verify", codes.EXIT_NOT_FREE)
    return None


def after_verify(node: str, reason: str, result: records.VerifyResult) -> NodeResult:
    """Resume on a clean verify (records.VerifyResult with exit 0) when the node is still
    drained for the reason read before it, else say what still holds the GPUs or what changed."""
    if result.code == codes.EXIT_OK and result.free:
        state, now = node_states([node]).get(node, (None, ""))
        if state is None or not state.startswith("drained") or now != reason:
            return NodeResult(node, "left alone", f"changed during the verify: now {state or 'unknown'} "
                              f"({now!r}), was drained: {reason}", codes.EXIT_NOT_FREE)
        resume(node)
        return NodeResult(node, "resumed", f"GPUs verified free; was drained: {reason}", codes.EXIT_OK)
    problems = result.problems or ["not free"]
    more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
    return NodeResult(node, "left drained", problems[0] + more, result.code or codes.EXIT_NOT_FREE)


def undrain(hosts: list, force: bool, verify, each_host) -> list:
    """NodeResult per host, in order. `verify(host)` -> AgentResult of `verify`;
    `each_host(hosts, fn)` runs fn per host in parallel (scripts.ops.fleet.each_host)."""
    states = node_states([h.alias for h in hosts])
    todo, results = [], {}
    for h in hosts:
        state, reason = states.get(h.alias, (None, ""))
        early = decide(h.alias, state, reason, force)
        if early is None:
            todo.append(h)
        else:
            results[h.alias] = early

    def one(h):
        return after_verify(h.alias, states[h.alias][1], verify(h).result)

    for out in each_host(todo, one):
        if out.error is None:
            results[out.host.alias] = out.value
        else:
            results[out.host.alias] = NodeResult(out.host.alias, "left drained", str(out.error),
                                                 codes.EXIT_UNREACHABLE)
    return [results[h.alias] for h in hosts]
