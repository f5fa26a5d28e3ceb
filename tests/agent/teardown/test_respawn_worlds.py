"""Property tests of the respawn rule over random process worlds (hypothesis).

Each world is a process table as the scan reads it: PID 1, a tmux server whose panes are
interactive shells or `bash -c` wrappers, a server (`python3 -m xsrv.launch_server`) started
under a random chain of a loop or a one-shot wrapper and launchers (sudo and its use_pty
monitor, setsid, su, setpriv, nohup), helpers in the server's tree named like common programs
(sleep, bash, tail), and bystanders: another pane's clock loop, a client of the same package
(`-m xsrv.bench_serving`). The teardown's world follows: the server gone, and processes started
during it by the loop (a restart, or its `sleep` when the restart comes later than any
window), by the one-shot wrapper (its `sleep` afterwards), by the bystanders.

Checked for every world, through settle's own Lineage and _classify (the rules, not a copy):
- a process that matches no pattern and runs no target's program is never a respawn, however
  it is named (`sleep`, `bash`, `tail`, `date`) and whichever pane it is in;
- the server's restart by the loop is a respawn, through any launchers, started by the loop;
- a loop alive at the verdict is a restarter whatever its restart delay; a one-shot wrapper
  never is;
- the tmux server and the other panes are never starters.
The real-process cases of the same rules are tests/agent/teardown/test_verdict_truth.py.
"""
from __future__ import annotations

from hypothesis import HealthCheck, given, settings, strategies as st

from scripts.agent.options import Options
from scripts.agent.status.scan import Scan
from scripts.agent.teardown import settle

SINCE = 10_000  # clock ticks: what starts from here on started during the teardown
TARGETS = [r"xsrv\.launch_server"]
SERVER = ["python3", "-m", "xsrv.launch_server", "--port", "30000"]
LAUNCHERS = {
    "sudo": [["sudo", *SERVER], ["sudo", *SERVER]],  # sudo, then its monitor in a session of its own
    "setsid": [["setsid", *SERVER]],
    "su": [["su", "-c", " ".join(SERVER), "svc"]],
    "setpriv": [["setpriv", "--reuid=1001", "--", *SERVER]],
    "nohup": [["nohup", *SERVER]],
}


class World:
    """A process table: add() gives pids in order; `alive` is what lives at the verdict."""

    def __init__(self):
        self.procs: dict = {}
        self.next_pid = 100
        self.alive: set = set()

    def add(self, argv, ppid, *, session=False, start=1000, comm=None):
        pid = self.next_pid
        self.next_pid += 1
        parent = self.procs.get(ppid)
        sid = pid if session or parent is None else parent["sid"]
        self.procs[pid] = {"pid": pid, "ppid": ppid, "pgid": pid, "sid": sid, "start_time": start,
                           "comm": comm or argv[0].rsplit("/", 1)[-1][:15], "argv": list(argv),
                           "cmdline": " ".join(argv), "state": "S", "threads": 1, "uid": 0, "flags": 0}
        self.alive.add((pid, start))
        return pid

    def end(self, pid):
        self.alive.discard((pid, self.procs[pid]["start_time"]))


@st.composite
def worlds(draw):
    w = World()
    w.procs[1] = {"pid": 1, "ppid": 0, "pgid": 1, "sid": 1, "start_time": 1, "comm": "systemd",
                  "argv": ["/sbin/init"], "cmdline": "/sbin/init", "state": "S", "threads": 1, "uid": 0, "flags": 0}
    w.alive.add((1, 1))
    tmux = w.add(["tmux", "new-session", "-d"], 1, session=True)
    clock = w.add(["bash", "-c", "while sleep 0.5; do date; done"], tmux, session=True)
    client = w.add(["bash", "-c", "while true; do python3 -m xsrv.bench_serving; sleep 1; done"], tmux, session=True)
    shape = draw(st.sampled_from(["loop", "one-shot", "interactive"]))
    delay = draw(st.sampled_from([0.2, 3, 30]))  # the loop's pause before a restart: shorter or longer than 2 s
    launchers = draw(st.lists(st.sampled_from(sorted(LAUNCHERS)), max_size=2, unique=True))
    helper = draw(st.sampled_from(["sleep", "bash", "tail", "date"]))
    if shape == "loop":
        top = w.add(["bash", "-c", "while true; do %s; %s %s; done" % (" ".join(SERVER), "sleep", delay)], tmux,
                    session=True)
    elif shape == "one-shot":
        top = w.add(["bash", "-c", "%s; sleep 20" % " ".join(SERVER)], tmux, session=True)
    else:
        top = w.add(["bash", "-i"], tmux, session=True)
    parent = top
    chain = []
    for name in launchers:
        for i, argv in enumerate(LAUNCHERS[name]):
            parent = w.add(argv, parent, session=(name == "sudo" and i == 1))
            chain.append(parent)
    server = w.add(SERVER, parent)
    tree_helper = w.add([helper, "x"], server)
    return w, {"shape": shape, "delay": delay, "top": top, "launchers": launchers, "chain": chain, "server": server,
               "tmux": tmux, "clock": clock, "client": client, "helper": tree_helper, "helper_name": helper}


def _after(w, roles):
    """The world during the teardown: the server's tree gone, its launchers with it; what the
    loop, the wrapper and the bystanders start meanwhile. Returns {role: pid} of the new ones."""
    for pid in [roles["server"], roles["helper"], *roles["chain"]]:
        w.end(pid)
        del w.procs[pid]
    new = {"clock_sleep": w.add(["sleep", "0.5"], roles["clock"], start=SINCE + 5),
           "clock_date": w.add(["date"], roles["clock"], start=SINCE + 6),
           "client_run": w.add(["python3", "-m", "xsrv.bench_serving"], roles["client"], start=SINCE + 7),
           "bystander_helper": w.add([roles["helper_name"], "x"], roles["clock"], start=SINCE + 8)}
    if roles["shape"] == "one-shot":
        new["afterwards"] = w.add(["sleep", "20"], roles["top"], start=SINCE + 9)
    if roles["shape"] == "loop":
        if roles["delay"] < 2:  # within the window: the restart itself, through the same launchers
            parent = roles["top"]
            for name in roles["launchers"]:
                for i, argv in enumerate(LAUNCHERS[name]):
                    parent = w.add(argv, parent, session=(name == "sudo" and i == 1), start=SINCE + 10)
            new["restart"] = w.add(SERVER, parent, start=SINCE + 11)
        else:
            new["loop_sleep"] = w.add(["sleep", str(roles["delay"])], roles["top"], start=SINCE + 10)
    return new


class _Targets:
    def __init__(self, keys):
        self.since_ticks, self.keys = SINCE, keys


ARGS = Options(scope=None, scope_uid=None, protect=[], match=[], target=TARGETS)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(worlds())
def test_the_respawn_rule_over_random_worlds(monkeypatch, world):
    w, roles = world
    monkeypatch.setattr(settle.procfs, "same_process", lambda pid, start: (pid, start) in w.alive)
    monkeypatch.setattr(settle, "_owned", lambda info: dict(info, unit=None, container=None))
    monkeypatch.setattr(settle.managers, "manager_of", lambda info, procs: None)
    server = dict(w.procs[roles["server"]], gpu_mib={"0": 80000}, devices=["/dev/nvidia0"])
    doc = Scan({"holders": []}, dict(w.procs), set())
    helper = dict(w.procs[roles["helper"]], gpu_mib={}, devices=[])  # a target too: the server started it
    lineage = settle.Lineage(doc, [server, helper], patterns=TARGETS)
    starters = {k[0] for k in lineage.starters}
    assert roles["tmux"] not in starters and roles["clock"] not in starters and roles["client"] not in starters
    assert not {roles["clock"], roles["client"]} & {k[0] for k in lineage.near}
    if roles["shape"] != "interactive":
        assert roles["top"] in starters, (roles, starters)  # through every launcher, to the wrapper

    new = _after(w, roles)
    doc = Scan({"holders": [], "context_source": "nvml"}, dict(w.procs), set())
    respawns, _ = settle._classify(doc, _Targets({(roles["server"], 1000)}), ARGS, TARGETS, lineage, set())
    flagged = {k[0] for k in respawns}
    restart_chain = {pid for pid, info in w.procs.items() if info["start_time"] == SINCE + 10
                     and roles["shape"] == "loop" and roles["delay"] < 2}
    innocent = {pid for role, pid in new.items() if role != "restart"} - restart_chain
    assert not flagged & innocent, ({r: p for r, p in new.items() if p in flagged}, roles)
    if "restart" in new:
        assert new["restart"] in flagged
        assert respawns[(new["restart"], SINCE + 11)]["started_by"].startswith("PID %d:" % roles["top"])

    restarters = {r["pid"] for r in lineage.restarters()}
    assert restarters == ({roles["top"]} if roles["shape"] == "loop" else set()), (roles, restarters)
