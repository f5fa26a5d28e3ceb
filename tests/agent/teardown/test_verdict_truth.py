"""The verdict is true by construction: whether a server can come back is decided from how
processes relate to it and what the kernel shows, never from the text of their code.

Each world is real processes (bash loops, sudo, timeout, flock, tmux, a compiled watchdog, a
node timer), each teardown scoped to the test's own temp dir, so it can match nothing the
test did not start. The rules (agent/policy/relation.py):
- the job's own launchers and shell loops above a target are frozen before its SIGTERM and
  ended after it: FREED, exit 0, and nothing comes back, whatever the loop's pause;
- any other related starter (a Python, node or compiled watchdog, a launcher that loops over
  logs, a notebook kernel) is frozen during the stop, thawed, and named: exit 11, with a
  command that stops exactly it; --stop-starters stops it with the targets;
- a process related to no target is never named and never signalled, under any flag;
- an interactive shell is never signalled: idle at its prompt, or busy with its own older
  foreground job (`tail -f`), it is inert.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scripts.agent.wire import requests
from scripts.reach.bundle import agent_payload
from tests.support import teardowns
from tests.support.agent_inproc import run_agent
from tests.support.procs import alive, children, cmdline, process_group, state, tmux_pane, wait_for
from tests.support.teardowns import host, ready_pid, server_cmd, server_pkg, shell

TARGETS = r"xsrv\.launch_server"
PAUSE = 5  # every restarter here waits this long between turns: longer than the 2 s window


def teardown(ps, **given):
    return teardowns.teardown(ps, **{"TARGETS": TARGETS, **given})


def plan(ps, stop_starters=False):
    return run_agent(host(ps, TARGETS=TARGETS), requests.Plan(stop_starters=stop_starters)).doc["plan"]


def signals_to(doc, pid):
    return [a["signal"] for a in doc["actions"] if a["pid"] == pid]


def server_argv(ps, ready):
    return [sys.executable, "-m", "xsrv.launch_server", "--ready", str(ready)]


def assert_named_and_thawed(result, starter):
    """Exit 11 naming `starter`, which runs again (not stopped) after the verdict."""
    doc = result.doc
    assert result.code == 11, (doc["verdict"], doc["problems"])
    assert doc["verdict"] == "free, starter alive"
    assert [s["pid"] for s in doc["starters_alive"]] == [starter], doc["starters_alive"]
    assert signals_to(doc, starter) == ["SIGSTOP", "SIGCONT"], doc["actions"]
    assert alive(starter) and state(starter) not in ("T", "t")
    return doc["starters_alive"][0]


def prompt(ps, tmp_path):
    """A person's interactive bash in a tmux pane: (socket, tmux server, pane). Its rc file lies
    in the test's dir, so the pane's command line (and a subshell's) carries the test's scope."""
    rc = ps.base / "rc"
    rc.write_text("PS1='$ '\n")
    return tmux_pane(ps, tmp_path, f"bash --norc --noprofile --rcfile {rc} -i")


def run_hint(hint):
    """The pinned kill line a hint names, run as printed, in a shell."""
    line = re.search(r"`([^`]*)`", hint).group(1)
    return subprocess.run(["sh", "-c", line], capture_output=True, text=True, timeout=10)


def _agent_in(ns_pid, ps, *extra):
    """The agent run inside the PID namespace of `ns_pid` (as a route into a container runs it)."""
    argv = ["nsenter", "-t", str(ns_pid), "-p", "-m", sys.executable, "-", "teardown", "--json",
            "--devices", ps.glob, "--fake-devices", "--fake-gpus", str(ps.memdir), "--scope", str(ps.base),
            "--target", TARGETS, "--grace", "2", "--timeout", "10", "--run-dir", str(ps.base / "run"), *extra]
    out = subprocess.run(argv, input=agent_payload(), capture_output=True, timeout=60)
    return out.returncode, json.loads(out.stdout)


# -- the job's own loop ends with the server: FREED, and nothing comes back --------------------

LAUNCHERS = ["", "timeout 86400 ", "flock {base}/lock ", "nice -n 5 ", "taskset -c 0 ",
             "sudo -n env PYTHONPATH={pkg} "]


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_a_shell_loop_through_a_launcher_is_the_jobs_own_and_ends_with_the_server(ps, launcher):
    """`while true; do LAUNCHER SERVER; sleep 5; done` in a script: the loop (and the launcher
    between, where it forks) is frozen before the server's SIGTERM and ended after. FREED."""
    if launcher.startswith("sudo") and not shutil.which("sudo"):
        pytest.skip("sudo is not installed (.ci/packages has it)")
    ready = ps.base / "srv.ready"
    script = ps.base / "loop.sh"
    server_run = " ".join(server_argv(ps, ready))
    script.write_text(f"export PYTHONPATH={server_pkg(ps)}\n"
                      f"while true; do rm -f {ready}; {launcher.format(base=ps.base, pkg=server_pkg(ps))}"
                      f"{server_run}; sleep {PAUSE}; done\n")
    loop = shell(ps, f"exec bash {script}")
    server = ready_pid(ready)
    ps.adopt(server)
    ps.pids.extend(children(loop))
    listed = {s["pid"]: s for s in plan(ps)["starters"]}
    assert listed[loop]["fate"] == "stop" and listed[loop]["role"] == "shell", listed
    result = teardown(ps)
    doc = result.doc
    assert result.code == 0, doc["problems"]
    assert not alive(loop) and not alive(server)
    order = [(a["pid"], a["signal"]) for a in doc["actions"]]
    assert order.index((loop, "SIGSTOP")) < order.index((server, "SIGTERM")) < order.index((loop, "SIGTERM"))
    time.sleep(0.5)
    assert ready.read_text() == str(server)  # no turn of the loop came after it: the loop is gone


def test_a_loop_that_runs_a_start_script_which_execs_the_server_ends_with_it(ps):
    ready = ps.base / "srv.ready"
    run = " ".join(server_argv(ps, ready))
    (ps.base / "start-server.sh").write_text(f"export PYTHONPATH={server_pkg(ps)}\nexec {run}\n")
    loop = shell(ps, f"cd {ps.base} && while true; do rm -f {ready}; bash ./start-server.sh; sleep {PAUSE}; done")
    ps.adopt(ready_pid(ready))
    result = teardown(ps)
    assert result.code == 0, result.doc["problems"]
    assert not alive(loop)


def test_a_launch_script_that_sources_an_env_file_and_runs_the_server_once_is_freed(ps):
    """No loop at all, but `source` and a function: it is the job's own launcher, ended with
    the server; FREED (its code is never read)."""
    ready = ps.base / "srv.ready"
    (ps.base / "env.sh").write_text("export MODE=serve\n")
    script = ps.base / "launch.sh"
    script.write_text(f"source {ps.base}/env.sh\nrun() {{ {server_cmd(ps, ready)}; }}\nrun\necho done\n")
    wrapper = shell(ps, f"exec bash {script}")
    ps.adopt(ready_pid(ready))
    result = teardown(ps)
    assert result.code == 0, result.doc["problems"]
    assert not alive(wrapper)


# -- other starters: frozen, thawed, named (exit 11) --------------------------------------------

PY_WATCHDOG = """\
import os, subprocess, sys, time
argv = sys.argv[sys.argv.index("--") + 1:]
while True:
    subprocess.call(argv)
    time.sleep({pause})
"""

PY_REEXEC = """\
import os, subprocess, sys, time
argv = sys.argv[sys.argv.index("--") + 1:]
subprocess.call(argv)
time.sleep({pause})
os.execv(sys.executable, [sys.executable] + sys.argv)
"""

PY_ONE_SHOT = """\
import subprocess, sys, time
argv = sys.argv[sys.argv.index("--") + 1:]
# loop over the logs once the server is up: the word loop in a comment decides nothing
subprocess.call(argv)
while True:
    time.sleep(0.2)
"""

C_WATCHDOG = r"""
#include <sys/wait.h>
#include <unistd.h>
int main(int argc, char **argv) {
    int i = 1;
    while (i < argc && argv[i][0] != '-') i++;
    for (;;) {
        pid_t p = fork();
        if (p == 0) { execv(argv[i + 1], argv + i + 1); _exit(127); }
        waitpid(p, 0, 0);
        sleep(PAUSE);
    }
}
"""

NODE_WATCHDOG = """\
const {{ spawn }} = require("child_process");
const argv = process.argv.slice(process.argv.indexOf("--") + 1);
function go() {{
  const p = spawn(argv[0], argv.slice(1), {{ stdio: "ignore" }});
  p.on("exit", () => setTimeout(go, {pause} * 1000));
}}
go();
"""


def _watchdog(ps, kind, ready):
    """argv of a restarter of `kind` that runs the server (the test's scope in its argv)."""
    pkg = server_pkg(ps)
    if kind == "python3 -m pkg.watchdog":
        (pkg / "wd").mkdir(exist_ok=True)
        (pkg / "wd" / "__init__.py").write_text("")
        (pkg / "wd" / "watchdog.py").write_text(PY_WATCHDOG.format(pause=PAUSE))
        return [sys.executable, "-m", "wd.watchdog", str(ps.base), "--", *server_argv(ps, ready)]
    if kind in ("python3 -W ignore watchdog.py", "a python restarter that re-execs itself",
                "a one-shot python launcher that loops over its logs"):
        code = {"python3 -W ignore watchdog.py": PY_WATCHDOG, "a python restarter that re-execs itself": PY_REEXEC,
                "a one-shot python launcher that loops over its logs": PY_ONE_SHOT}[kind]
        path = ps.base / "watchdog.py"
        path.write_text(code.format(pause=PAUSE))
        return [sys.executable, "-W", "ignore", str(path), "--", *server_argv(ps, ready)]
    if kind == "a compiled watchdog":
        if not shutil.which("gcc"):
            pytest.skip("gcc is not installed (.ci/packages has it)")
        src = ps.base / "wd.c"
        src.write_text(C_WATCHDOG.replace("PAUSE", str(PAUSE)))
        subprocess.run(["gcc", "-O1", "-o", str(ps.base / "wd"), str(src)], check=True)
        return [str(ps.base / "wd"), "--", *server_argv(ps, ready)]
    if not shutil.which("node"):
        pytest.skip("node is not installed (.ci/packages has it)")
    path = ps.base / "watchdog.js"
    path.write_text(NODE_WATCHDOG.format(pause=PAUSE))
    return ["node", str(path), "--", *server_argv(ps, ready)]


STARTERS = ["python3 -m pkg.watchdog", "python3 -W ignore watchdog.py", "a compiled watchdog", "a node restarter",
            "a python restarter that re-execs itself", "a one-shot python launcher that loops over its logs"]


@pytest.mark.parametrize("kind", STARTERS)
def test_a_starter_in_another_language_is_frozen_thawed_and_named_never_freed(ps, kind):
    """The server's parent is no shell and no launcher: what it does next cannot be known from
    the kernel, so it is frozen during the stop (it restarts nothing then), thawed, and named:
    exit 11, never FREED. Its hint, run literally, ends exactly it."""
    ready = ps.base / "srv.ready"
    bystander = subprocess.Popen(["sleep", "600"], start_new_session=True)
    ps.adopt(bystander.pid)
    starter = subprocess.Popen(_watchdog(ps, kind, ready), start_new_session=True, stdin=subprocess.DEVNULL,
                               env=dict(os.environ, PYTHONPATH=str(server_pkg(ps))))
    ps.adopt(starter.pid)
    server = ready_pid(ready)
    ps.adopt(server)
    named = assert_named_and_thawed(teardown(ps), starter.pid)
    assert "--stop-starters" in named["include"]
    ran = run_hint(named["include"])
    assert ran.returncode == 0, ran.stderr
    wait_for(lambda: not alive(starter.pid), "the starter to end")
    assert alive(bystander.pid)


def test_stop_starters_stops_a_watchdog_with_the_server(ps):
    ready = ps.base / "srv.ready"
    starter = subprocess.Popen(_watchdog(ps, "python3 -m pkg.watchdog", ready), start_new_session=True,
                               env=dict(os.environ, PYTHONPATH=str(server_pkg(ps))))
    ps.adopt(starter.pid)
    ps.adopt(ready_pid(ready))
    listed = {s["pid"]: s["fate"] for s in plan(ps, stop_starters=True)["starters"]}
    assert listed == {starter.pid: "stop"}
    result = teardown(ps, stop_starters=True)
    assert result.code == 0, result.doc["problems"]
    assert not alive(starter.pid)


def test_a_notebook_kernel_that_started_the_server_is_neither_stopped_nor_left_frozen(ps):
    """A Jupyter kernel (here: a Python process that ran the server with Popen and waits on
    its own work) started the server: it is named (exit 11), and runs on, unstopped."""
    ready = ps.base / "srv.ready"
    kernel = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time\n"
                               "p = subprocess.Popen(sys.argv[2:])\nwhile True: time.sleep(0.1)",
                               str(ps.base), *server_argv(ps, ready)], start_new_session=True,
                              env=dict(os.environ, PYTHONPATH=str(server_pkg(ps))))
    ps.adopt(kernel.pid)
    ps.adopt(ready_pid(ready))
    assert_named_and_thawed(teardown(ps), kernel.pid)


# -- related to no target: never named, never signalled ----------------------------------------

def test_an_unrelated_jobs_script_with_a_function_and_a_loop_is_never_named_nor_signalled(ps):
    """Another job's bash script (a function, `source`, a `while ... sleep` loop) that starts
    no server and is related to none: not in the plan, FREED, untouched even with
    --stop-starters (the old code reader named it a supervisor and its flag stopped it)."""
    (ps.base / "job.env").write_text("N=1\n")
    job = ps.base / "job.sh"
    job.write_text(f"source {ps.base}/job.env\nwork() {{ echo $N >/dev/null; }}\n"
                   "while true; do work; sleep 0.2; done\n")
    other = shell(ps, f"exec bash {job}")
    ready = ps.base / "srv.ready"
    shell(ps, server_cmd(ps, ready))
    ps.adopt(ready_pid(ready))
    assert other not in {s["pid"] for s in plan(ps, stop_starters=True)["starters"]}
    result = teardown(ps, stop_starters=True)
    assert result.code == 0, result.doc["problems"]
    assert alive(other) and signals_to(result.doc, other) == []


# -- interactive shells: never signalled; idle or busy with their own job is inert -------------

def test_a_server_run_at_a_prompt_leaves_an_idle_shell_freed(ps, tmp_path):
    sock, tmux_server, pane = tmux_pane(ps, tmp_path)
    ready = ps.base / "srv.ready"
    subprocess.run(["tmux", "-S", str(sock), "send-keys", server_cmd(ps, ready), "Enter"], check=True)
    ps.adopt(ready_pid(ready))
    result = teardown(ps)
    assert result.code == 0, result.doc["problems"]
    assert alive(pane) and alive(tmux_server) and signals_to(result.doc, pane) == []


def test_a_shell_tailing_the_servers_log_is_busy_not_a_starter(ps, tmp_path):
    """`SERVER & tail -f server.log` at a prompt, the most common launch: the shell is busy
    with its own older foreground job, so FREED; the shell and its tail live on."""
    sock, tmux_server, pane = tmux_pane(ps, tmp_path)
    ready, log = ps.base / "srv.ready", ps.base / "server.log"
    log.write_text("")
    subprocess.run(["tmux", "-S", str(sock), "send-keys", f"{server_cmd(ps, ready)} & tail -f {log}", "Enter"],
                   check=True)
    ps.adopt(ready_pid(ready))
    tail = wait_for(lambda: [c for c in children(pane) if Path(f"/proc/{c}/comm").read_text().strip() == "tail"],
                    "the tail")[0]
    result = teardown(ps)
    assert result.code == 0, result.doc["problems"]
    assert alive(pane) and alive(tail)
    assert signals_to(result.doc, pane) == [] and signals_to(result.doc, tail) == []


# -- a freeze is never left behind -------------------------------------------------------------

def test_a_freeze_left_by_a_dead_teardown_is_thawed_by_the_next_call(ps):
    """An agent that died between SIGSTOP and its end left its ledger: the next call (a plain
    scan) continues the process and says so, and the audit log has it."""
    from scripts.agent.state import frozen, lastrun

    victim = subprocess.Popen(["sleep", "600"], start_new_session=True)
    ps.adopt(victim.pid)
    start = int(Path(f"/proc/{victim.pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    run_dir = ps.base / "run"
    run_dir.mkdir(mode=0o700)
    dead = subprocess.Popen(["true"])
    dead.wait()
    os.environ[lastrun.RUN_DIR_ENV] = str(run_dir)
    try:
        frozen.write([{"pid": victim.pid, "start_time": start, "cmdline": "sleep 600"}])
        doc = json.loads((run_dir / frozen.NAME).read_text())
        doc["agent"]["pid"] = dead.pid  # as if the teardown that froze it had died
        (run_dir / frozen.NAME).write_text(json.dumps(doc))
    finally:
        del os.environ[lastrun.RUN_DIR_ENV]
    os.kill(victim.pid, signal.SIGSTOP)
    wait_for(lambda: state(victim.pid) == "T", "the freeze")
    out = subprocess.run([sys.executable, "-", "scan", "--json", "--run-dir", str(run_dir), "--devices",
                          ps.glob, "--fake-devices"], input=agent_payload(), capture_output=True, timeout=60)
    assert b'"thawed"' in out.stdout, out.stdout[-400:]
    wait_for(lambda: state(victim.pid) in ("S", "R"), "the thaw")
    assert not (run_dir / frozen.NAME).exists()
    assert "left frozen by a teardown that died" in (run_dir / "audit.jsonl").read_text()


def test_a_loop_typed_at_a_prompt_gets_ctrl_c_in_its_backoff_and_the_shell_lives(ps, tmp_path):
    """`while true; do SERVER; sleep 5; done` typed at a tmux prompt: the shell is never
    signalled; the loop's backoff `sleep` (its foreground job) gets SIGINT, as Ctrl-C would send,
    bash ends the loop and is back at its prompt: FREED, and nothing comes back."""
    sock, tmux_server, pane = prompt(ps, tmp_path)
    ready = ps.base / "srv.ready"
    subprocess.run(["tmux", "-S", str(sock), "send-keys",
                    f"while true; do rm -f {ready}; {server_cmd(ps, ready)}; sleep {PAUSE}; done", "Enter"],
                   check=True)
    server = ready_pid(ready)
    ps.adopt(server)
    listed = {s["pid"]: s for s in plan(ps)["starters"]}
    assert listed[pane]["fate"] == "watch" and listed[pane].get("foreground"), listed
    result = teardown(ps)
    doc = result.doc
    assert result.code == 0, doc["problems"]
    assert alive(pane) and signals_to(doc, pane) == []
    assert any(a["signal"].startswith("SIGINT to group") and f"PID {pane})" in a["signal"] for a in doc["actions"])
    time.sleep(0.5)
    assert ready.read_text() == str(server) and not children(pane)  # the loop is over, at its prompt


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("nsenter"),
                    reason="needs root, unshare and nsenter for a PID namespace")
def test_a_namespace_whose_pid_1_is_the_restart_loop_is_never_freed_and_pid_1_never_signalled(ps):
    """A container (here a plain PID namespace) whose PID 1 is `bash -c 'while true; do SERVER;
    sleep 3; done'`: the agent inside sees the server's parent as PID 1. Exit 11 naming PID 1
    with how to stop its namespace; PID 1 is never signalled, and nothing says "double fork"."""
    ready = ps.base / "srv.ready"
    loop = f"while true; do rm -f {ready}; {server_cmd(ps, ready)}; sleep 3; done"
    outer = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", "bash", "-c", loop],
                             start_new_session=True)
    ps.adopt(outer.pid)
    inner = wait_for(lambda: children(outer.pid), "the namespace's PID 1")[0]
    ps.adopt(inner)
    wait_for(lambda: ready.exists() and ready.read_text().strip(), "the server")
    code, doc = _agent_in(inner, ps)
    assert code == 11, doc.get("problems")
    [named] = [s for s in doc["starters_alive"] if s["role"] != "unseen"]  # its session reads 0 here: unseen too
    assert named["pid"] == 1 and "PID 1 is never signalled" in named["include"], named
    assert all(a["pid"] != 1 for a in doc["actions"]) and alive(inner)
    assert "double fork" not in " ".join(doc["problems"])


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("nsenter"),
                    reason="needs root, unshare and nsenter for a PID namespace")
def test_a_server_whose_launch_shell_was_entered_from_outside_the_namespace_is_never_freed(ps):
    """`pct exec CT -- bash -c 'SERVER; ...'`, here nsenter into a PID namespace from a restart
    loop outside it: inside, the launch shell's parent reads as pid 0. The shell is the job's
    own and ends with the server, but what started it cannot be seen: exit 11 (`unseen`), not
    FREED, and the loop outside does bring the server back."""
    ready = ps.base / "srv.ready"
    box = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", "sleep", "600"], start_new_session=True)
    ps.adopt(box.pid)
    inner = wait_for(lambda: children(box.pid), "the namespace's PID 1")[0]
    ps.adopt(inner)
    launch = f"rm -f {ready}; {server_cmd(ps, ready)}; true"
    loop = subprocess.Popen(["bash", "-c", f"while true; do nsenter -t {inner} -p -m bash -c '{launch}'; "
                                           f"sleep {PAUSE}; done"], start_new_session=True)
    ps.adopt(loop.pid)
    wait_for(lambda: ready.exists() and ready.read_text().strip(), "the server")
    code, doc = _agent_in(inner, ps)
    assert code == 11, (doc["verdict"], doc["problems"])
    [unseen] = [s for s in doc["starters_alive"] if s["role"] == "unseen"]
    assert "outside this PID namespace" in unseen["why"], unseen
    assert [u["pid"] for u in doc["plan"]["unseen"]] == [unseen["pid"]], doc["plan"]["unseen"]
    assert all(a["pid"] != loop.pid for a in doc["actions"]) and alive(loop.pid)
    wait_for(lambda: ready.exists() and ready.read_text().strip(), "the server, back from outside", timeout=PAUSE + 10)


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("busybox"), reason="needs root and busybox's crond")
def test_a_server_cron_started_is_freed_and_cron_never_signalled(ps):
    """A real cron (busybox crond, with a crontab of the test's own) started the server at the
    minute: cron is a scheduler with no start pending the teardown can see, not a starter; a
    finished cron run is history. FREED, and crond runs on, never signalled. (`busybox crond`
    is crond, the applet argv[1] names: it was taken for busybox's shell and ended.)"""
    ready = ps.base / "srv.ready"
    tabs = ps.base / "crontabs"
    tabs.mkdir()
    (tabs / "root").write_text(f"* * * * * [ -e {ready} ] || {server_cmd(ps, ready)}\n")
    crond = subprocess.Popen(["busybox", "crond", "-f", "-c", str(tabs), "-L", str(ps.base / "cron.log")],
                             start_new_session=True)
    ps.adopt(crond.pid)
    ps.adopt(int(wait_for(lambda: ready.exists() and ready.read_text().strip(), "cron's run, at the minute",
                          timeout=75)))
    result = teardown(ps)
    assert result.code == 0, (result.doc["verdict"], result.doc["problems"])
    assert all(a["pid"] != crond.pid for a in result.doc["actions"]) and alive(crond.pid), result.doc["actions"]
    assert not [s for s in result.doc["plan"]["starters"] if s["pid"] == crond.pid]


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("nsenter"),
                    reason="needs root, unshare and nsenter for a PID namespace")
def test_a_jupyterlab_containers_pid_1_is_never_signalled_and_its_kernel_runs_on(ps):
    """A JupyterLab container: PID 1 is the lab (Python), its kernel started the server. The
    kernel is a starter: frozen during the stop, thawed, named (exit 11); PID 1 is neither
    stopped nor frozen, and both run on."""
    ready = ps.base / "srv.ready"
    kernel = ("import subprocess, sys, time\np = subprocess.Popen(sys.argv[1:])\n"
              "while True: time.sleep(0.1)")
    lab = ("import subprocess, sys, time\nsubprocess.Popen([sys.executable, '-c', sys.argv[1]] + sys.argv[2:])\n"
           "while True: time.sleep(0.1)")
    box = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", lab, kernel,
                            *server_argv(ps, ready)], start_new_session=True,
                           env=dict(os.environ, PYTHONPATH=str(server_pkg(ps))))
    ps.adopt(box.pid)
    inner = wait_for(lambda: children(box.pid), "the lab, PID 1 of its namespace")[0]
    ps.adopt(inner)
    wait_for(lambda: ready.exists() and ready.read_text().strip(), "the server")
    code, doc = _agent_in(inner, ps)
    assert code == 11, (doc["verdict"], doc["problems"])
    [named] = doc["starters_alive"]
    assert named["pid"] != 1 and named["role"] == "starter", named
    assert [a["signal"] for a in doc["actions"] if a["pid"] == named["pid"]] == ["SIGSTOP", "SIGCONT"]
    assert all(a["pid"] != 1 for a in doc["actions"]) and alive(inner)
    assert state(inner) not in ("T", "t") and len(children(inner)) == 1  # the kernel lives on, running


# -- found by the red team ---------------------------------------------------------------------

def test_a_loop_typed_at_a_prompt_in_the_background_is_code_not_a_terminal(ps, tmp_path):
    """`while true; do SERVER; sleep 5; done &` at a prompt: the loop is a subshell with the
    interactive shell's argv, but it never exec'd (PF_FORKNOEXEC): it runs code, the job's own,
    and is ended; the prompt's shell is never signalled. It was FREED with the loop alive."""
    sock, tmux_server, pane = prompt(ps, tmp_path)
    ready = ps.base / "srv.ready"
    subprocess.run(["tmux", "-S", str(sock), "send-keys",
                    f"while true; do rm -f {ready}; {server_cmd(ps, ready)}; sleep {PAUSE}; done &", "Enter"],
                   check=True)
    server = ready_pid(ready)
    ps.adopt(server)
    loop = int(Path(f"/proc/{server}/stat").read_text().rsplit(")", 1)[1].split()[1])
    ps.adopt(loop)
    listed = {s["pid"]: s for s in plan(ps)["starters"]}
    assert listed[loop]["role"] == "shell" and listed[pane]["role"] == "terminal", listed
    result = teardown(ps)
    assert result.code == 0, result.doc["problems"]
    assert not alive(loop) and alive(pane) and signals_to(result.doc, pane) == []
    time.sleep(0.5)
    assert ready.read_text() == str(server)


def test_a_shell_upgraded_on_disk_is_still_a_shell_and_its_prompt_never_signalled(ps, tmp_path):
    """A package upgrade replaces bash while a pane runs it: /proc shows `bash (deleted)`. It
    is still an interactive shell at its prompt, never frozen (it was taken for a starter)."""
    if os.geteuid() != 0:
        pytest.skip("needs root: a root-owned copy of bash")
    bindir = ps.base / "usr-bin"
    bindir.mkdir(mode=0o755)
    shutil.copy2(shutil.which("bash"), bindir / "bash")
    sock, tmux_server, pane = tmux_pane(ps, tmp_path, f"{bindir}/bash --norc --noprofile -i")

    def running_the_copy():  # tmux starts the pane through sh -c: the copy is exec'd a moment later
        try:
            return os.readlink(f"/proc/{pane}/exe") == str(bindir / "bash")
        except OSError:
            return False

    wait_for(running_the_copy, "the pane's bash")
    (bindir / "bash").unlink()
    ready = ps.base / "srv.ready"
    subprocess.run(["tmux", "-S", str(sock), "send-keys", server_cmd(ps, ready), "Enter"], check=True)
    ps.adopt(ready_pid(ready))
    result = teardown(ps)
    assert result.code == 0, result.doc["problems"]
    assert alive(pane) and signals_to(result.doc, pane) == []


def test_a_watchdog_someone_stopped_is_left_stopped(ps):
    """A watchdog an admin had stopped (`kill -STOP`) before the teardown: it is named (exit
    11), never continued: the thaw starts nothing the teardown did not stop."""
    ready = ps.base / "srv.ready"
    starter = subprocess.Popen(_watchdog(ps, "python3 -m pkg.watchdog", ready), start_new_session=True,
                               env=dict(os.environ, PYTHONPATH=str(server_pkg(ps))))
    ps.adopt(starter.pid)
    ps.adopt(ready_pid(ready))
    os.kill(starter.pid, signal.SIGSTOP)
    wait_for(lambda: state(starter.pid) == "T", "the admin's stop")
    result = teardown(ps)
    assert result.code == 11, result.doc["problems"]
    assert signals_to(result.doc, starter.pid) == [] and state(starter.pid) == "T"
    os.kill(starter.pid, signal.SIGKILL)


def test_a_watchdog_script_named_like_a_manager_daemon_is_no_manager(ps):
    """A Python watchdog saved as `runsv`: a name is anyone's to take, so it is no runit
    supervisor (whose stop would be `sv down` of its directory) but a starter: never FREED."""
    ready = ps.base / "srv.ready"
    argv = _watchdog(ps, "python3 -W ignore watchdog.py", ready)
    fake = ps.base / "runsv"
    shutil.copy(argv[3], fake)
    argv[3] = str(fake)
    starter = subprocess.Popen(argv, start_new_session=True, env=dict(os.environ, PYTHONPATH=str(server_pkg(ps))))
    ps.adopt(starter.pid)
    ps.adopt(ready_pid(ready))
    result = teardown(ps)
    assert result.code == 11, (result.code, result.doc["problems"])
    assert [s["pid"] for s in result.doc["starters_alive"]] == [starter.pid]


def test_a_terminal_mode_is_never_read_by_reopening_a_file_on_fd_0(ps):
    """Only a terminal device node that is the very file on fd 0 is opened: fd 0 on a regular
    file (or a FUSE mount that stopped answering) gives no answer, without asking its filesystem."""
    from scripts.agent.policy import relation

    feed = ps.base / "feed"
    feed.write_text("")
    with open(feed) as stdin:
        proc = subprocess.Popen(["sleep", "30"], stdin=stdin)
    ps.adopt(proc.pid)
    assert relation.line_editing(proc.pid) is None


# -- found by the second red team ------------------------------------------------------------

NS = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("nsenter"),
                        reason="needs root, unshare and nsenter for a PID namespace")
REAPER = ("import os, time\nwhile True:\n    try:\n        os.wait()\n    except ChildProcessError:\n"
          "        time.sleep(0.2)")


def _namespace(ps, *argv):
    """A PID namespace whose PID 1 runs argv; returns PID 1's pid as this test sees it."""
    box = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", *argv], start_new_session=True,
                           env=dict(os.environ, PYTHONPATH=str(server_pkg(ps))))
    ps.adopt(box.pid)
    inner = wait_for(lambda: children(box.pid), "the namespace's PID 1")[0]
    ps.adopt(inner)
    return inner


@NS
def test_a_server_started_in_the_background_from_outside_the_namespace_is_unseen(ps):
    """`pct exec CT -- bash -c 'SERVER &'` from a loop on the node: inside, the server is left to
    PID 1 and its session reads 0 (it is outside). What started it cannot be seen: exit 11, and
    the loop outside does bring it back."""
    ready = ps.base / "srv.ready"
    inner = _namespace(ps, sys.executable, "-c", REAPER)
    launch = f"rm -f {ready}; {server_cmd(ps, ready)} &"
    loop = shell(ps, f"while true; do [ -s {ready} ] && kill -0 $(cat {ready}) 2>/dev/null || "
                     f"nsenter -t {inner} -p -m bash -c '{launch}'; sleep {PAUSE}; done")
    wait_for(lambda: ready.exists() and ready.read_text().strip(), "the server")
    code, doc = _agent_in(inner, ps)
    # never FREED: 11 (unseen), or 1 where the loop outside happened to bring it back within the window
    assert code in (11, 1), (doc["verdict"], doc["problems"])
    [unseen] = doc["plan"]["unseen"]
    assert "session is outside this PID namespace" in unseen["why"], unseen
    assert alive(loop) and all(a["pid"] != 1 for a in doc["actions"])


@NS
def test_a_containers_python_entrypoint_that_restarts_the_server_is_pid_1_and_named(ps):
    """A container whose PID 1 is a Python entrypoint: `Popen(server); wait; sleep; again`. PID 1
    runs code and started the server: related, never signalled, exit 11 naming it."""
    ready = ps.base / "srv.ready"
    entry = ("import subprocess, sys, time\nwhile True:\n    subprocess.Popen(sys.argv[1:]).wait()\n"
             f"    time.sleep({PAUSE})")
    inner = _namespace(ps, sys.executable, "-c", entry, *server_argv(ps, ready))
    wait_for(lambda: ready.exists() and ready.read_text().strip(), "the server")
    code, doc = _agent_in(inner, ps)
    assert code == 11, (doc["verdict"], doc["problems"])
    assert [s["pid"] for s in doc["starters_alive"] if s["role"] != "unseen"] == [1], doc["starters_alive"]
    assert all(a["pid"] != 1 for a in doc["actions"]) and alive(inner)


def test_a_watchdog_started_after_the_server_in_its_group_is_frozen_and_named(ps):
    """`setsid bash -c 'SERVER & watchdog & exit 0'`: the script is gone and both are left in
    its group, the watchdog younger than the server. It is related by the group: frozen during
    the stop, thawed, named (exit 11); it was FREED, and the server back 5 s later."""
    ready = ps.base / "srv.ready"
    wd = ps.base / "wd.py"
    wd.write_text("import os, subprocess, sys, time\nwhile True:\n    time.sleep(0.5)\n"
                  f"    if not os.path.exists({str(ready)!r}):\n        time.sleep({PAUSE})\n"
                  "        subprocess.Popen(sys.argv[1:])\n")
    argv = " ".join(server_argv(ps, ready))
    script = shell(ps, f"PYTHONPATH={server_pkg(ps)} {argv} & sleep 0.3; {sys.executable} {wd} {argv} & exit 0")
    server = ready_pid(ready)
    ps.adopt(server)
    watchdog = wait_for(lambda: [p for p in process_group(server) if cmdline(p).startswith(f"{sys.executable} {wd}")],
                        "the watchdog")[0]
    ps.adopt(watchdog)
    wait_for(lambda: not alive(script), "the script's exit: both left in its group")
    result = teardown(ps)
    named = assert_named_and_thawed(result, watchdog)
    assert "started after it" in named["why"], named


def test_someone_elses_shell_binary_at_a_prompt_is_a_terminal_never_signalled(ps, tmp_path):
    """A zsh or bash of one's own (linuxbrew, nix, ~/.local: not root's) at a tmux prompt ran the
    server: it is a terminal, idle at its prompt after the stop, never signalled. It was taken
    for a starter: frozen, exit 11, and with --stop-starters SIGKILLed with its session."""
    own = ps.base / "home-bin"
    own.mkdir()
    shutil.copy2(shutil.which("bash"), own / "bash")
    os.chown(own / "bash", 65534, 65534)  # nobody's file: not a root-owned program
    sock, tmux_server, pane = tmux_pane(ps, tmp_path, f"{own}/bash --norc --noprofile -i")
    ready = ps.base / "srv.ready"
    subprocess.run(["tmux", "-S", str(sock), "send-keys", server_cmd(ps, ready), "Enter"], check=True)
    ps.adopt(ready_pid(ready))
    result = teardown(ps, stop_starters=True)
    assert result.code == 0, result.doc["problems"]
    assert alive(pane) and signals_to(result.doc, pane) == []


def test_the_next_command_of_a_typed_list_is_never_interrupted(ps, tmp_path):
    """`SERVER; python3 next_step.py` typed at a prompt: after the server, the shell runs the
    person's next command, which is no loop's pause: it is never sent Ctrl-C, and runs to its
    end; the shell is busy with something new meanwhile, so the verdict names it (exit 11)."""
    sock, tmux_server, pane = prompt(ps, tmp_path)
    ready, after = ps.base / "srv.ready", ps.base / "after"
    step = f"{sys.executable} -c 'import time; time.sleep(12); open(\"{after}\", \"w\").write(\"done\")'"
    subprocess.run(["tmux", "-S", str(sock), "send-keys", f"{server_cmd(ps, ready, '--term-exit')}; {step}", "Enter"],
                   check=True)
    ps.adopt(ready_pid(ready))
    result = teardown(ps)
    assert not any(a["signal"].startswith("SIGINT") for a in result.doc["actions"]), result.doc["actions"]
    assert result.code == 11 and [s["pid"] for s in result.doc["starters_alive"]] == [pane], result.doc["problems"]
    wait_for(lambda: after.exists(), "the next command, run to its end", timeout=30)
    assert alive(pane)


def test_a_script_that_pipes_the_server_into_a_filter_ends_with_it_freed(ps):
    """`SRV 2>&1 | grep -v DEBUG > log` in a launch script: grep is the other end of the
    server's pipeline (it ends on EOF), not other work of the script's: the script is the job's
    own, ended with the server, FREED (it was named, exit 11)."""
    ready = ps.base / "srv.ready"
    script = shell(ps, f"{server_cmd(ps, ready)} 2>&1 | grep -v DEBUG > {ps.base}/log; sleep {PAUSE}; "
                       f"{server_cmd(ps, ready)}")
    ps.adopt(ready_pid(ready))
    result = teardown(ps)
    assert result.code == 0, result.doc["problems"]
    assert not alive(script)


def test_a_launch_shell_that_became_someones_prompt_is_never_killed(ps, tmp_path):
    """`tmux new -d "SRV; exec bash"` keeps a pane open: the launch shell is the job's own, but
    once the server is gone it has exec'd an interactive bash (same pid), which ignores SIGTERM.
    It runs another program than the one frozen: never SIGKILLed (the pane and its session
    vanished)."""
    ready = ps.base / "srv.ready"
    sock, tmux_server, pane = tmux_pane(ps, tmp_path, f"bash -c '{server_cmd(ps, ready)}; exec bash --norc -i'")
    ps.adopt(ready_pid(ready))
    result = teardown(ps)
    assert "SIGKILL" not in signals_to(result.doc, pane), result.doc["actions"]
    assert result.code == 0, result.doc["problems"]  # a prompt now, idle: nothing that could start it
    time.sleep(0.5)
    assert alive(pane) and alive(tmux_server)
