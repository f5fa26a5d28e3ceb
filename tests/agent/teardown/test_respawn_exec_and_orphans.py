"""Restarts the settle window must see even where no new process ties them to a survivor:
a starter that execs the server in place (same pid, same start time), a launcher that joined
the plan and execs the server under the same name, a restarter a target forked and left to
PID 1 (no fork event ties it to the target inside a PID namespace or with clone(CLONE_PARENT)),
and a loop above a `setsid` Python launcher. Each must end NOT FREE (exit 1) with the restart
named, or - where the kernel's fork event ties the child to a target - be stopped with it.
Every process is started here; every teardown is scoped to the test's temp dir."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scripts.agent.holders.scan import Scan
from scripts.agent.wire import requests
from tests.support import teardowns
from tests.support.agent_inproc import run_agent
from tests.support.procs import alive, wait_for
from tests.support.teardowns import host

SERVER = """\
import os, signal, sys, time
args = sys.argv[1:]
def opt(name):
    return args[args.index(name) + 1] if name in args else None
def restart_on_term(clone_parent):
    def term(*_):
        if clone_parent:  # clone(CLONE_PARENT | SIGCHLD): the child's parent is this one's parent
            import ctypes
            child = ctypes.CDLL(None, use_errno=True).syscall(56, 0x00008000 | 17, 0, 0, 0, 0) == 0
        else:
            child = os.fork() == 0
        if child:
            os.setsid()
            os.execv("/bin/sh", ["sh", "-c", opt("--restart")])
        os._exit(0)
    signal.signal(signal.SIGTERM, term)
if opt("--restart"):
    restart_on_term(opt("--how") == "clone-parent")
with open(opt("--ready") + ".tmp", "w") as f:
    f.write(str(os.getpid()))
os.rename(opt("--ready") + ".tmp", opt("--ready"))
time.sleep(float(opt("--load") or 0))
fd = os.open(opt("--hold"), os.O_RDWR)
open(opt("--ready") + ".holds", "w").close()
while True:
    time.sleep(1)
"""
TARGETS = r"xsrv\.launch_server"


def server_pkg(base: Path) -> Path:
    pkg = base / "pkg"
    (pkg / "xsrv").mkdir(parents=True, exist_ok=True)
    (pkg / "xsrv" / "__init__.py").write_text("")
    (pkg / "xsrv" / "launch_server.py").write_text(SERVER)
    return pkg


def ready_pid(path: Path, timeout: float = 30) -> int:
    return int(wait_for(lambda: path.exists() and path.read_text().strip(), f"{path.name} written", timeout))


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def under_bash(ps, ready: Path, script: str, env=None) -> int:
    """`bash -c script` in a session of its own, once the server it starts holds GPU 0: its pid."""
    shell = subprocess.Popen(["bash", "-c", script], start_new_session=True, stdin=subprocess.DEVNULL, env=env)
    ps.adopt(shell.pid)
    ps.adopt(ready_pid(ready))
    wait_for(Path(f"{ready}.holds").exists, "the server on GPU 0")
    return shell.pid


def teardown(ps):
    return teardowns.teardown(ps, TARGETS=TARGETS)


def assert_restart_named(result, pid: int):
    doc = result.doc
    assert result.code == 1, (result.code, doc.get("problems"), doc.get("settle_ended"), doc["appeared"],
                              doc["ignored"], doc["plan"]["starters"])
    assert pid in [a["pid"] for a in doc["appeared"]], (doc["appeared"], doc.get("ignored"))
    assert doc.get("settle_ended") is None


def test_bash_that_would_run_its_last_command_in_place_is_ended_before_it_can(ps):
    """`bash -c "SERVER; SERVER"`: bash would exec the second server in place; it is the job's
    own shell, frozen before the first server's SIGTERM and ended after it. FREED."""
    pkg, ready, dev = server_pkg(ps.base), ps.base / "srv.ready", ps.devdir / "nvidia0"
    srv = f"{sys.executable} -m xsrv.launch_server --hold {dev}"
    wrapper = under_bash(ps, ready, f"export PYTHONPATH={pkg}; {srv} --ready {ready}; "
                                    f"{srv} --ready {ready}.again --load 4")
    result = teardown(ps)
    assert result.code == 0, result.doc["problems"]
    assert not alive(wrapper) and not Path(f"{ready}.again").exists()


def assert_starter_named(result, pid: int):
    """The middle verdict (11): the GPUs free now, `pid` named as a starter that lives."""
    doc = result.doc
    assert result.code == 11, (result.code, doc.get("problems"))
    assert pid in [s["pid"] for s in doc["starters_alive"]], doc["starters_alive"]


LAUNCHER = """\
import os, sys, time
srv, ready, dev, exe = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
open(ready + ".launcher", "w").write(str(os.getpid()))
def runs(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False
while runs(srv):
    time.sleep(0.002)
time.sleep(0.05)
os.execv(exe, [exe, "-m", "xsrv.launch_server", "--ready", ready + ".again", "--hold", dev, "--load", "6"])
"""


def test_a_standby_older_than_the_teardown_that_execs_the_server_is_a_restart(ps):
    """A standby (the server's parent, there long before the teardown) execs the server under the
    interpreter's own name once the target is gone: its record would look the same to a
    confirming scan that kept the plan's."""
    pkg, ready, dev = server_pkg(ps.base), ps.base / "srv.ready", ps.devdir / "nvidia0"
    (ps.base / "launcher.py").write_text(LAUNCHER)
    launcher = ps.base / "launcher.py"
    standby = under_bash(ps, ready, f"{sys.executable} -m xsrv.launch_server --ready {ready} --hold {dev} & "
                                    f"exec {sys.executable} {launcher} $! {ready} {dev} {sys.executable}",
                         env=dict(os.environ, PYTHONPATH=str(pkg)))
    result = teardown(ps)
    assert_starter_named(result, standby)  # frozen through the stop: its exec comes after the verdict
    assert ready_pid(Path(f"{ready}.again")) == standby


@pytest.mark.parametrize("how", ["fork", "clone-parent"])
def test_a_restarter_a_target_leaves_to_pid_1_keeps_the_window(ps, how):
    """On SIGTERM the server (itself left to PID 1 by a double fork) forks a child that leaves
    its session and runs the server again 0.8 s later. Where the fork watch ties the child to
    the target it is stopped with it; where nothing does (a PID namespace or another user: no
    fork events; clone(CLONE_PARENT): the event names PID 1) the window is watched, not ended
    at once, and the restart makes the verdict NOT FREE."""
    pkg, ready, dev = server_pkg(ps.base), ps.base / "srv.ready", ps.devdir / "nvidia0"
    restart = (f"sleep 0.8; PYTHONPATH={pkg} exec {sys.executable} -m xsrv.launch_server "
               f"--ready {ready}.again --hold {dev} --load 4 {ps.base}")
    subprocess.run(["setsid", "-f", sys.executable, "-m", "xsrv.launch_server", "--ready", str(ready),
                    "--hold", str(dev), "--restart", restart, "--how", how],
                   env=dict(os.environ, PYTHONPATH=str(pkg)), stdin=subprocess.DEVNULL, check=True, timeout=30)
    server = ready_pid(ready)
    ps.adopt(server)
    wait_for(Path(f"{ready}.holds").exists, "the server on GPU 0")
    result = teardown(ps)
    doc = result.doc
    if doc["adopted"]:  # tied to the target (its fork event, or still in its session when seen): stopped with it
        assert result.code == 0, doc["problems"]
        assert not Path(f"{ready}.again").exists()
        return
    if doc["fork_watch"] == "connector":
        assert how == "clone-parent"
        pytest.skip("with the kernel's fork events a clone(CLONE_PARENT) child is not tied to its target, and "
                    "the orphan rule is off there (README: the settle window's limits)")
    again = ready_pid(Path(f"{ready}.again"))
    ps.adopt(again)
    assert not alive(server) and alive(again)
    assert_restart_named(result, again)


@pytest.mark.parametrize("form", ["exec", "fork"])
def test_a_watcher_beside_the_server_names_its_shell_never_freed(ps, form):
    """`bash -c 'SERVER & p=$!; (while kill -0 $p; do sleep .05; done; exec SERVER) & wait'`: the
    watcher subshell (a child of the server's shell, no ancestor of the server) execs the
    server in place, or forks it, once the first one is gone: never FREED."""
    pkg, ready, dev = server_pkg(ps.base), ps.base / "srv.ready", ps.devdir / "nvidia0"
    srv = f"{sys.executable} -m xsrv.launch_server --hold {dev}"
    how = ("exec ", "") if form == "exec" else ("", "; true")
    wrapper = under_bash(ps, ready, f"export PYTHONPATH={pkg}; {srv} --ready {ready} & p=$!; "
                                    f"(while kill -0 $p 2>/dev/null; do sleep 0.05; done; {how[0]}{srv} "
                                    f"--ready {ready}.again --load 4{how[1]}) & wait")
    result = teardown(ps)
    # the shell runs the watcher beside the server (shared): frozen, so the dead server stays its
    # unreaped child and `kill -0` keeps the watcher waiting, mostly until the thaw (named, exit
    # 11); where the watcher sees it gone sooner, its restart is caught in the window (exit 1)
    if result.code == 11:
        assert_starter_named(result, wrapper)
    else:
        assert_restart_named(result, ready_pid(Path(f"{ready}.again")))  # the watcher, exec'd, or its child
    ps.adopt(ready_pid(Path(f"{ready}.again")))


ROUTER = """\
import os, subprocess, sys, time
def retitle(old, new):  # what setproctitle does: the argv area rewritten in place, no exec
    fields = open("/proc/self/stat").read().rsplit(")", 1)[1].split()
    start, end = int(fields[45]), int(fields[46])
    with open("/proc/self/mem", "r+b") as mem:
        mem.seek(start)
        area = mem.read(end - start)
        mem.seek(start)
        mem.write(area.replace(old, new))
rest = sys.argv[sys.argv.index("--role") + 3:]
subprocess.call([sys.executable, "-m", "xsrv.launch_server"] + rest)
retitle(b"state=serving", b"state=drained")
while True:
    time.sleep(1)
"""


def test_a_router_that_retitles_itself_when_its_server_goes_is_no_restart(ps):
    """A router of the same package runs the server and, once it is gone, rewrites its own
    title in place (setproctitle: no exec). It is named (exit 11), never a restart: it exec'd
    nothing."""
    pkg, ready, dev = server_pkg(ps.base), ps.base / "srv.ready", ps.devdir / "nvidia0"
    (pkg / "xsrv" / "router.py").write_text(ROUTER)
    router = subprocess.Popen([sys.executable, "-m", "xsrv.router", "--role", "router", "state=serving",
                               "--ready", str(ready), "--hold", str(dev)], start_new_session=True,
                              stdin=subprocess.DEVNULL, env=dict(os.environ, PYTHONPATH=str(pkg)))
    ps.adopt(router.pid)
    ps.adopt(ready_pid(ready))
    wait_for(Path(f"{ready}.holds").exists, "the server on GPU 0")
    result = teardown(ps)
    assert_starter_named(result, router.pid)  # the server's parent: what it does next is unknown
    wait_for(lambda: "state=drained" in cmdline(router.pid), "the router's new title")
    assert result.doc["appeared"] == []


DAEMON = """\
import os, sys, time
while True:  # an unrelated daemon that leaves short jobs to PID 1 (a timer's unit, cron's mail)
    if os.fork() == 0:
        if os.fork() == 0:
            os.setsid()
            os.execv("/bin/sh", ["sh", "-c", "sleep 1.5; : " + sys.argv[1]])
        os._exit(0)
    os.wait()
    time.sleep(0.1)
"""


def test_jobs_an_unrelated_daemon_leaves_to_pid_1_end_no_teardown_as_not_free(ps):
    """Nothing could restart the server (its parent is PID 1); a daemon beside it starts jobs
    under PID 1 all the while. FREED; where fork events are read the window still ends at once."""
    pkg, ready, dev = server_pkg(ps.base), ps.base / "srv.ready", ps.devdir / "nvidia0"
    subprocess.run(["setsid", "-f", sys.executable, "-m", "xsrv.launch_server", "--ready", str(ready), "--hold",
                    str(dev)], env=dict(os.environ, PYTHONPATH=str(pkg)), stdin=subprocess.DEVNULL, check=True,
                   timeout=30)
    ps.adopt(ready_pid(ready))
    wait_for(Path(f"{ready}.holds").exists, "the server on GPU 0")
    (ps.base / "daemon.py").write_text(DAEMON)
    daemon = subprocess.Popen([sys.executable, str(ps.base / "daemon.py"), str(ps.base)], start_new_session=True,
                              stdin=subprocess.DEVNULL)
    ps.adopt(daemon.pid)
    result = teardown(ps)
    assert result.code == 0, result.doc["problems"]
    if result.doc["fork_watch"] == "connector":
        assert result.doc["settle_ended"] == "nothing left that could restart a target"


LAUNCH = """\
import os, subprocess, sys
n = int(open(sys.argv[1] + ".n").read()) if os.path.exists(sys.argv[1] + ".n") else 0
open(sys.argv[1] + ".n", "w").write(str(n + 1))
ready = sys.argv[1] if n == 0 else sys.argv[1] + ".again"
subprocess.call([sys.executable, "-m", "xsrv.launch_server", "--ready", ready, "--hold", sys.argv[2],
                 "--load", "0" if n == 0 else "4"])
"""


@pytest.mark.parametrize("between", ["", "flock LOCK ", "setsid -f -w "])
def test_a_loop_above_a_setsid_python_launcher_is_ended_and_the_launcher_named(ps, between):
    """`while :; do setsid python3 launch.py; sleep 0.3; done`: the loop (and a lock or `setsid
    --fork --wait` between) is the job's own and ended; the Python launcher between it and the
    server is frozen, thawed and named (exit 11): nothing starts the server again."""
    pkg, ready, dev = server_pkg(ps.base), ps.base / "srv.ready", ps.devdir / "nvidia0"
    (ps.base / "launch.py").write_text(LAUNCH)
    helper = between.replace("LOCK", str(ps.base / "lock")) or "setsid "
    loop = under_bash(ps, ready, f"export PYTHONPATH={pkg}; while :; do {helper}{sys.executable} "
                                 f"{ps.base / 'launch.py'} {ready} {dev}; sleep 0.3; done")
    launcher = next(s["pid"] for s in run_agent(host(ps, TARGETS=TARGETS), requests.Plan()).doc["plan"]["starters"]
                    if s["role"] == "starter")
    result = teardown(ps)
    assert_starter_named(result, launcher)  # the Python launcher: frozen, thawed, named
    assert not alive(loop)  # the loop above it (and the lock or setsid between) is the job's own: ended
    time.sleep(0.6)
    assert not Path(f"{ready}.again").exists()


def test_the_confirming_scans_never_keep_the_record_of_a_starter_or_of_a_process_started_since():
    """An exec keeps a process's start time, parent, group, session and, under the same
    interpreter, its name: the plan's record of a starter, or of a process started during the
    teardown (a launcher that later execs the server), must be read again on every scan."""
    from scripts.agent.procs import procscan
    from scripts.agent.teardown import settle

    me = procscan.basic(os.getpid())
    loop = dict(me, pid=900001, ppid=1, pgid=900001, sid=900001, start_time=100,
                argv=["bash", "-c", "while :; do x; done"], comm="bash", cmdline="bash -c while :; do x; done")
    server = dict(me, pid=900002, ppid=900001, pgid=900001, sid=900001, start_time=101, argv=["python3", "-m", "srv"],
                  comm="python3", cmdline="python3 -m srv")
    bystander = dict(me, pid=900003, ppid=1, pgid=900003, sid=900003, start_time=50, argv=["sleep", "9"],
                     comm="sleep", cmdline="sleep 9")
    launcher = dict(me, pid=900004, ppid=900001, pgid=900001, sid=900001, start_time=200,
                    argv=["python3", "launcher.py"], comm="python3", cmdline="python3 launcher.py")
    procs = {p["pid"]: p for p in (loop, server, bystander, launcher)}
    lineage = settle.Lineage(Scan({}, procs, set()), [server])
    assert (900001, 100) in lineage.starters
    assert set(settle.reusable_records(lineage, since_ticks=150)) == {900002, 900003}
