"""The wrapper, supervisor, respawn and process-group rules at their edges, on real processes
(each teardown scoped to the test's temp dir by tests.support.teardowns.host): a loop
above a setsid wrapper, a pipeline member's own child, a shell opened with --rcfile, a loop
typed at a prompt, a watchdog that restarts a server detached, a cron job's wrapper, a
restart through a double fork, and a torn snapshot whose parents form a cycle."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from scripts.agent.wire import requests
from tests.support.agent_inproc import run_agent
from tests.support.paths import REPO
from tests.support.procs import alive, children, tmux_pane, wait_for
from tests.support.teardowns import host, ready_pid, server_cmd, shell, teardown

KEYS = dict(TARGETS=r"xsrv\.launch_server")


def test_a_loop_above_a_setsid_wrapper_is_the_jobs_own_through_the_new_session(ps):
    """`while true; do setsid bash -c 'SERVER; echo exited'; sleep 1; done`: the inner bash -c
    leads its session, but the walk up goes on to the loop (both shells running code): both are
    frozen first and ended after the server, so nothing restarts it. FREED."""
    ready = ps.base / "srv.ready"
    inner = f"{server_cmd(ps, ready, '--hold', str(ps.devdir / 'nvidia0'))}; echo exited"
    loop = shell(ps, f"while true; do rm -f {ready}; setsid bash -c \"{inner}\"; sleep 1; done")
    first = ready_pid(ready)
    ps.adopt(first)
    result = teardown(ps, **KEYS)  # no --settle: the agent's own rule
    ps.pids.extend(children(loop))
    assert loop in {s["pid"] for s in result.doc["plan"]["starters"] if s["fate"] == "stop"}
    assert result.code == 0, result.doc["problems"]
    assert not alive(loop)
    time.sleep(1.2)
    assert ready.read_text() == str(first)  # no turn came after it


def test_a_child_of_a_pipeline_sibling_is_not_a_leftover_of_the_server(ps):
    """`set -m; SERVER | bash -c 'sleep 0.5; python3 uploader; true'`: the server leads its
    job's process group; the log shipper is the shell's, and so is the uploader it starts 0.5 s
    later in the same group: its line of parents reaches the shell, not the server."""
    ready = ps.base / "srv.ready"
    up_ready = ps.base / "uploader.ready"
    script = ps.base / "uploader.py"
    script.write_text("import os, sys, time\nopen(sys.argv[1], 'w').write(str(os.getpid()))\ntime.sleep(600)\n")
    uploader = f"{sys.executable} {script} {up_ready}"
    shell(ps, f"set -m; {server_cmd(ps, ready)} | bash -c \"sleep 0.5; {uploader}; true\" & wait")
    server = ready_pid(ready)
    ps.adopt(server)
    up = ready_pid(up_ready)
    ps.adopt(up)
    with open(f"/proc/{up}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    assert int(fields[2]) == server  # in the server's process group, as a pipeline member's child is
    result = teardown(ps, **KEYS)
    reasons = {t["pid"]: t["reason"] for t in result.doc["plan"]["targets"]}
    assert up not in reasons, reasons[up]
    assert alive(up)


def test_an_interactive_shell_with_an_rcfile_is_no_wrapper(ps, tmp_path):
    """A tmux pane running `bash --rcfile venv.rc -i` (a shell with a venv active) is someone's
    terminal: `--rcfile`'s value is no script, and the pane is never a supervisor, not even with
    --stop-starters."""
    rc = tmp_path / "venv.rc"
    rc.write_text("PS1='$ '\n")
    sock, tmux_server, pane = tmux_pane(ps, tmp_path, f"bash --rcfile {rc} -i")
    ready = ps.base / "srv.ready"
    subprocess.run(["tmux", "-S", str(sock), "send-keys", server_cmd(ps, ready), "Enter"], check=True)
    server = ready_pid(ready)
    ps.adopt(server)
    plan = run_agent(host(ps, **KEYS), requests.Plan()).doc["plan"]
    result = teardown(ps, stop_starters=True, **KEYS)
    assert alive(pane) and alive(tmux_server), [t["reason"] for t in result.doc["plan"]["targets"]]
    assert [(s["pid"], s["fate"]) for s in plan["starters"]] == [(pane, "watch")], plan["starters"]


def test_the_hint_for_a_loop_typed_at_a_prompt_never_names_the_flag(ps, tmp_path):
    """`while true; do SERVER; sleep 0.5; done` typed in a tmux pane: the loop runs in the
    interactive shell itself. The respawn is caught, and its hint never offers
    --stop-starters, which does not stop an interactive shell."""
    sock, tmux_server, pane = tmux_pane(ps, tmp_path)
    ready = ps.base / "srv.ready"
    subprocess.run(["tmux", "-S", str(sock), "send-keys",
                    f"while true; do rm -f {ready}; {server_cmd(ps, ready)}; sleep 0.5; done", "Enter"], check=True)
    first = ready_pid(ready)
    ps.adopt(first)
    result = teardown(ps, settle=2, **KEYS)
    assert result.code == 1 and result.doc["appeared"], result.doc["problems"]
    hint = result.doc["appeared"][0]["include"]
    ps.pids.extend(a["pid"] for a in result.doc["appeared"])
    ps.adopt(ready_pid(ready))  # the restart
    again = teardown(ps, settle=2, stop_starters=True, **KEYS)  # as the hint says
    ps.pids.extend(a["pid"] for a in again.doc["appeared"])
    assert again.code == 0 or not hint.startswith("--stop-starters"), (hint, again.doc["problems"])


def _watchdog(ps, ready):
    """`while sleep 0.5; do <the server runs> || setsid -f SERVER; done`: a watchdog that
    starts the server detached (its parent is PID 1), the way a cron-like restarter does. It
    reads the server's state, not `kill -0`, which a zombie PID 1 has not reaped yet passes."""
    srv = server_cmd(ps, ready, "--hold", str(ps.devdir / "nvidia0"))
    runs = f"grep -qs '^State:[[:space:]]*[^ZX]' /proc/$(cat {ready} 2>/dev/null)/status"
    return shell(ps, f"while sleep 0.5; do {runs} || "
                     f"{{ rm -f {ready}; {srv.split(' ', 1)[0]} setsid -f {srv.split(' ', 1)[1]}; }}; done")


def _next_server(ready, old):
    def pid():
        try:
            value = int(ready.read_text())
        except (OSError, ValueError):
            return None
        return value if value != old else None
    return wait_for(pid, "a (new) server", timeout=15)


@pytest.mark.parametrize("settle", [3])
def test_a_detached_watchdog_restart_inside_a_given_window_is_not_free(ps, settle):
    """A watchdog that restarts the server detached (its parent is PID 1): with a window given
    (--settle 3) the restart inside it is NOT FREE. Without --settle nothing the teardown sees
    could restart the target and the window ends at once: the README names this limit."""
    ready = ps.base / "srv.ready"
    dog = _watchdog(ps, ready)
    first = _next_server(ready, None)
    ps.adopt(first)
    assert procs_ppid(first) != dog
    result = teardown(ps, settle=settle, **KEYS)
    again = _next_server(ready, first)
    ps.adopt(again)
    assert result.code != 0, (result.doc["settle_ended"], result.doc["settle_s"], result.doc["ignored"])


def procs_ppid(pid):
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


@pytest.fixture
def shared_unit(ps):
    """A cgroup of our own named like a system service (`...-cron.service`), holding what
    cron.service holds: the daemon (a stand-in) and, later, a job's `bash -c` wrapper."""
    from tests.support.realhosts import cgroups
    dirs = cgroups.make("cron.service")
    unit = dirs[0].name
    yield unit, dirs
    ps.kill_all()
    for d in dirs:
        for _ in range(100):
            if not cgroups.procs_in(d):
                break
            time.sleep(0.05)
        cgroups.remove(d)


def _move(pid, dirs):
    for d in dirs:
        (d / "cgroup.procs").write_text(str(pid))


def test_the_hint_for_a_cron_jobs_wrapper_never_says_stop_cron(ps, shared_unit):
    """A cron job `/bin/sh -c "SERVER; echo done"` in cron.service beside the cron daemon: the
    plan signals the server and the job's own shell (the unit holds the daemon too), never
    `systemctl stop` of the daemon's unit."""
    unit, dirs = shared_unit
    daemon = subprocess.Popen(["sleep", "600", str(ps.base)], start_new_session=True)
    ps.adopt(daemon.pid)
    _move(daemon.pid, dirs)
    ready = ps.base / "srv.ready"
    job = subprocess.Popen(["bash", "-c", f"sleep 0.5; {server_cmd(ps, ready)}; echo done"],
                           start_new_session=True, stdin=subprocess.DEVNULL)
    ps.adopt(job.pid)
    _move(job.pid, dirs)
    server = ready_pid(ready)
    ps.adopt(server)
    plan = run_agent(host(ps, **KEYS), requests.Plan()).doc["plan"]
    assert plan["units"] == [] and [t["pid"] for t in plan["targets"]] == [server]
    sup = {s["pid"]: s for s in plan["starters"]}
    assert job.pid in sup and sup[job.pid]["unit"] == unit and sup[job.pid]["fate"] == "stop"
    assert sup[job.pid]["via"] == "signal" and daemon.pid not in sup


SLOW_SERVER = """\
import os, sys, time
args = sys.argv[1:]
def opt(name):
    return args[args.index(name) + 1] if name in args else None
with open(opt("--ready") + ".tmp", "w") as f:
    f.write(str(os.getpid()))
os.rename(opt("--ready") + ".tmp", opt("--ready"))
time.sleep(float(opt("--load") or 0))  # importing, reading weights: no GPU yet
fd = os.open(opt("--hold"), os.O_RDWR)
time.sleep(600)
"""


def test_a_keepalive_that_restarts_through_a_double_fork_is_ended_before_it_can(ps):
    """A keepalive script started the server as its child and would restart it detached, `(
    SERVER & )`: it is the server's parent, so it is frozen before the server's SIGTERM and
    ended after: it never gets the turn."""
    pkg = ps.base / "pkg2"
    (pkg / "ysrv").mkdir(parents=True)
    (pkg / "ysrv" / "__init__.py").write_text("")
    (pkg / "ysrv" / "launch_server.py").write_text(SLOW_SERVER)
    ready = ps.base / "srv.ready"
    srv = f"{sys.executable} -m ysrv.launch_server --ready {ready} --hold {ps.devdir / 'nvidia0'}"
    keepalive = shell(ps, f"export PYTHONPATH={pkg}; {srv} & "
                          f"while sleep 0.3; do kill -0 $(cat {ready} 2>/dev/null) 2>/dev/null || "
                          f"{{ rm -f {ready}; ( {srv} --load 3 & ); }}; done")
    first = _next_server(ready, None)
    ps.adopt(first)
    wait_for(lambda: any(str(ps.devdir) in os.readlink(f"/proc/{first}/fd/{fd}")
                         for fd in os.listdir(f"/proc/{first}/fd")), "the server on GPU 0")
    result = teardown(ps, TARGETS=r"ysrv\.launch_server")
    ps.pids.extend(children(keepalive))
    assert result.code == 0, result.doc["problems"]
    assert not alive(keepalive)  # the server's parent: the job's own, frozen first and ended after


CYCLE = """
import os
from scripts.agent.options.record import Options
from scripts.agent.holders.scan import Scan
from scripts.agent.procs import procscan
from scripts.agent.teardown import plan, settle
me = procscan.basic(os.getpid())
# A snapshot is not atomic: pid 900002 was torchrun's parent when torchrun's stat was read; it
# exited, and the pid was reused by a child of torchrun before its own stat was read.
a = dict(me, pid=900001, ppid=900002, pgid=900001, sid=900003, argv=["torchrun"], comm="torchrun",
         cmdline="torchrun", state="S")
b = dict(me, pid=900002, ppid=900001, pgid=900001, sid=900003, argv=["sleep", "1"], comm="sleep",
         cmdline="sleep 1", state="S")
doc = Scan({"holders": []}, {a["pid"]: a, b["pid"]: b}, set())
if "lineage" in os.environ.get("WHAT", ""):
    settle.Lineage(doc, [a])
else:
    args = Options(target=None, match=[], protect=[], scope=None, scope_uid=None,
                   only_matching=False, stop_starters=False, disable=False)
    plan.build(doc, args.selection)
print("done")
"""


@pytest.mark.parametrize("what", ["plan", "lineage"])
def test_a_parent_cycle_in_a_torn_snapshot_does_not_hang_the_agent(what):
    """A snapshot is not atomic: a pid reused between two stat reads can show parents in a
    cycle. Neither the plan's tree walk nor the targets' ancestry may loop on it (the host's
    lock is held meanwhile)."""
    repo = REPO
    try:
        out = subprocess.run([sys.executable, "-c", CYCLE], cwd=repo, capture_output=True, text=True, timeout=10,
                             env=dict(os.environ, WHAT=what))
    except subprocess.TimeoutExpired:
        pytest.fail(f"{what}: still walking the cycle after 10 s")
    assert "done" in out.stdout, out.stderr[-2000:]
