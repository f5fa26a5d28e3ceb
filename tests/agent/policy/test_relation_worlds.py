"""The restart rule (scripts/agent/policy/relation.py) over random process worlds (hypothesis).

Each world is a process table as the scan reads it: PID 1, a tmux server whose panes are
interactive shells, the server (`python3 -m xsrv.launch_server`, with a worker and a fork of
itself holding nothing) under a random chain of launchers with arguments (sudo and its use_pty
monitor, timeout, flock, nice, taskset), shell loops, and a starter in another language
(python, node, a compiled watchdog), maybe a sibling watchdog older than it in its group, and
bystanders: related and unrelated scripts in several languages in other sessions. The
executable of each process is the table's (monkeypatched: the rule reads it from /proc).

Checked for every world, through relation.Relation itself:
- a process related to no target (another session, another pane, a bystander of any
  language, whatever its name or code) is never a link;
- every link is an ancestor of a target, a leader of its session or group, or an older
  member of its group;
- only launchers and shells running code are ever "stop", and only below the first link that
  runs other work; a terminal is "watch"; any other starter is "freeze";
- the server's own children (its worker, a fork of it) are never links: they are targets.
"""
from __future__ import annotations

from hypothesis import HealthCheck, given, settings, strategies as st

from scripts.agent.policy import relation

SERVER = ["python3", "-m", "xsrv.launch_server", "--port", "30000"]
LAUNCHERS = {
    "sudo -u svc": [(["sudo", "-u", "svc", *SERVER], "sudo"), (["sudo", "-u", "svc", *SERVER], "sudo")],
    "timeout 86400": [(["timeout", "86400", *SERVER], "timeout")],
    "flock FILE": [(["flock", "/tmp/l", *SERVER], "flock")],
    "nice -n 5": [(["nice", "-n", "5", *SERVER], "nice")],
    "taskset -c 0": [(["taskset", "-c", "0", *SERVER], "taskset")],
}
STARTERS = {
    "python -m pkg.watchdog": (["python3", "-m", "pkg.watchdog"], "python3.11"),
    "python -W ignore wd.py": (["python3", "-W", "ignore", "wd.py"], "python3.11"),
    "node": (["node", "restart.js"], "node"),
    "compiled": (["./wd"], "wd"),
}
SCRIPTS = {  # bystanders: each its own session, related to nothing
    "bash job": (["bash", "job.sh"], "bash"),
    "bash -c loop": (["bash", "-c", "f() { sleep 1; }; while true; do f; done"], "bash"),
    "python loop": (["python3", "-c", "while True: pass"], "python3.11"),
    "node timer": (["node", "-e", "setInterval(()=>{}, 1000)"], "node"),
    "compiled": (["/opt/job/bin/daemon"], "daemon"),
}


class World:
    def __init__(self):
        self.procs: dict = {}
        self.next_pid = 100

    def add(self, argv, exe, ppid, *, session=False, group=False, start=1000):
        pid = self.next_pid
        self.next_pid += 1
        parent = self.procs.get(ppid, {"sid": 1, "pgid": 1})
        self.procs[pid] = {"pid": pid, "ppid": ppid, "pgid": pid if session or group else parent["pgid"],
                           "sid": pid if session else parent["sid"], "start_time": start, "exe": exe,
                           "comm": exe[:15], "argv": list(argv), "cmdline": " ".join(argv), "state": "S",
                           "threads": 1, "uid": 0, "flags": 0, "tpgid": -1, "tty_nr": 0}
        return pid


@st.composite
def worlds(draw):
    w = World()
    w.procs[1] = {"pid": 1, "ppid": 0, "pgid": 1, "sid": 1, "start_time": 1, "exe": "systemd", "comm": "systemd",
                  "argv": ["/sbin/init"], "cmdline": "/sbin/init", "state": "S", "threads": 1, "uid": 0, "flags": 0}
    tmux = w.add(["tmux", "new-session", "-d"], "tmux", 1, session=True)
    other_pane = w.add(["bash", "-i"], "bash", tmux, session=True)
    bystanders = [w.add(argv, exe, draw(st.sampled_from([1, tmux, other_pane])), session=True)
                  for argv, exe in draw(st.lists(st.sampled_from(sorted(SCRIPTS.values())), max_size=4))]
    top_kind = draw(st.sampled_from(["pane", "loop", "script", "starter", "none"]))
    if top_kind == "pane":
        top = w.add(["bash", "-i"], "bash", tmux, session=True)
    elif top_kind == "loop":
        top = w.add(["bash", "-c", "while true; do SERVER; sleep 5; done"], "bash", tmux, session=True)
    elif top_kind == "script":
        top = w.add(["bash", "run.sh"], "bash", 1, session=True)
    elif top_kind == "starter":
        argv, exe = STARTERS[draw(st.sampled_from(sorted(STARTERS)))]
        top = w.add(argv, exe, 1, session=True)
    else:
        top = 1
    parent, chain = top, []
    if draw(st.booleans()) and top != 1:  # a starter between the chain and the server
        argv, exe = STARTERS[draw(st.sampled_from(sorted(STARTERS)))]
        parent = w.add(argv, exe, parent)
        chain.append(parent)
    for name in draw(st.lists(st.sampled_from(sorted(LAUNCHERS)), max_size=2, unique=True)):
        for i, (argv, exe) in enumerate(LAUNCHERS[name]):
            parent = w.add(argv, exe, parent, session=(name.startswith("sudo") and i == 1))
            chain.append(parent)
    sibling = None
    if draw(st.booleans()) and parent != 1:  # a watchdog beside it in its group, started before it
        argv, exe = STARTERS[draw(st.sampled_from(sorted(STARTERS)))]
        sibling = w.add(argv, exe, parent, start=900)
    server = w.add(SERVER, "python3.11", parent, group=top_kind == "pane", start=1000)
    worker = w.add(SERVER + ["--worker"], "python3.11", server, start=1001)
    fork = w.add(SERVER, "python3.11", server, start=1002)  # a fork of the server, holding nothing
    return w, {"top": top, "top_kind": top_kind, "chain": chain, "server": server, "tree": {server, worker, fork},
               "sibling": sibling, "bystanders": bystanders, "tmux": tmux, "other_pane": other_pane}


def _ancestors(procs, pid):
    out = []
    while pid in procs and procs[pid]["ppid"] not in (0,):
        pid = procs[pid]["ppid"]
        out.append(pid)
    return out


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(worlds())
def test_the_restart_rule_over_random_worlds(monkeypatch, world):
    w, roles = world
    procs = w.procs
    monkeypatch.setattr(relation, "executable", lambda pid: (procs[pid]["exe"], True))
    monkeypatch.setattr(relation.shellcode, "_stdin_unknown", lambda info: False)
    targets = [procs[p] for p in sorted(roles["tree"])]
    rel = relation.Relation(targets, procs, chain=set(), tree=roles["tree"])
    links = {link["pid"]: link for link in rel.links.values()}
    server = procs[roles["server"]]
    related = set(_ancestors(procs, roles["server"])) | {server["sid"], server["pgid"]} | {
        p for p, info in procs.items() if info["pgid"] == server["pgid"] and info["start_time"] < 1000}
    # nothing related to no target; the server's own tree never a link
    assert set(links) <= related, (set(links) - related, roles)
    assert not set(links) & roles["tree"]
    for p in roles["bystanders"] + [roles["other_pane"], roles["tmux"]]:
        assert p not in links, (p, procs[p]["cmdline"], roles)
    # fates by role
    for link in links.values():
        assert link["fate"] != "stop" or link["role"] in ("launcher", "shell"), link
        if link["role"] == "terminal":
            assert link["fate"] == "watch", link
        elif link["role"] == "starter":
            assert link["fate"] == "freeze", link
    # the job's own chain: launchers and loops right above the server, with nothing else beside them
    if roles["top_kind"] in ("loop", "script") and not roles["sibling"] and all(
            procs[p]["exe"] in relation.LAUNCHERS for p in roles["chain"]):
        assert links[roles["top"]]["fate"] == "stop", (links, roles)
        assert all(links[p]["fate"] == "stop" for p in roles["chain"]), (links, roles)
    sibling = roles["sibling"]
    if sibling and procs[sibling]["pgid"] == server["pgid"] not in (0, 1):  # a script's `nohup wd & nohup server &`
        assert links[sibling]["fate"] == "freeze", (links, roles)
    elif sibling:  # a job of its own at a prompt, or init's group: related by nothing
        assert sibling not in links, (links, roles)
    if roles["top_kind"] == "pane" and not sibling:  # (beside a sibling the walk ends at the shared link)
        assert links[roles["top"]]["fate"] == "watch"
    if roles["top_kind"] == "none" and not roles["chain"]:
        assert links == {}
