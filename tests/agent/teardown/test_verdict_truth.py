"""The verdict is true: never FREED while something can bring the server back, never NOT FREE
when nothing holds a GPU and nothing restarts one, and every hint names a command that works.

Each world is built of real processes (real bash loops, real sudo, a real tmux server), and
each teardown is scoped to the test's own temp dir, so it can match nothing the test did not
start. Helper programs (`sleep`, `date`) run from links under that dir (`ps.base/bin/sleep`),
so they are in scope too, as they would be on a host where nothing is scoped.

The rules protected here:
- a shell loop that restarts the server after any delay (longer than the settle window) and
  is alive at the verdict makes it NOT FREE, named with --stop-supervisors, which then stops it;
- the walk up from a server goes through sudo and its monitor to the loop above them;
- a helper of a target's tree (`sleep` after the server in a tmux pane's `bash -c`) or another
  session's clock loop under the same tmux server is no respawn;
- a client of the same Python package (`-m pkg.bench_serving`) is no respawn;
- a container's PID 1 that loops is named, with the container's stop, never "a double fork";
- a wrapper that exec'd the server in place is called the server, and a second teardown stops it;
- --only-matching gives its verdict as soon as only the holders it left remain;
- another person's copy of a target program holding no GPU is left and named (--all-users takes it).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from scripts.reach.bundle import agent_payload
from scripts.reach.transport import call_agent
from tests.support.procs import alive, children, tmux_pane, wait_for
from tests.support.teardowns import host, ready_pid, server_cmd, server_pkg, shell

TARGETS = r"xsrv\.launch_server"


def teardown(ps, *extra, **keys):
    keys.setdefault("TARGETS", TARGETS)
    return call_agent(host(ps, **keys), "teardown", ["--grace", "2", "--timeout", "10", *extra])


def helpers(ps, *names: str) -> Path:
    """ps.base/bin with links to the named programs: their argv[0] carries the test's scope."""
    bindir = ps.base / "bin"
    bindir.mkdir(exist_ok=True)
    for name in names:
        link = bindir / name
        if not link.exists():
            link.symlink_to(shutil.which(name))
    return bindir


def restarted(ready: Path, old: int) -> int:
    """The pid of the next server to write `ready`, once one other than `old` has."""
    def new():
        text = ready.read_text().strip() if ready.exists() else ""
        return text if text and text != str(old) else None
    return int(wait_for(new, f"a restart after pid {old}", timeout=15))


# -- FREED never while a loop can bring the server back --------------------------------------

def test_a_loop_that_restarts_after_longer_than_the_window_is_never_freed(ps):
    """`setsid nohup bash sup.sh` whose loop sleeps 3 s after the server ends: the 2 s window
    sees no respawn, but the loop is alive at the verdict, so it is NOT FREE, naming the loop
    and --stop-supervisors; run with that flag, the loop is stopped and the GPU stays free."""
    ready = ps.base / "srv.ready"
    script = ps.base / "sup.sh"
    script.write_text(f"while true; do rm -f {ready}; {server_cmd(ps, ready)}; sleep 3; done\n")
    shell(ps, f"exec setsid nohup bash {script} >/dev/null 2>&1")  # setsid forks: the loop is its child
    first = ready_pid(ready)
    ps.adopt(first)
    loop = int(Path(f"/proc/{first}/stat").read_text().rsplit(")", 1)[1].split()[1])
    ps.adopt(loop)
    plan = call_agent(host(ps, TARGETS=TARGETS), "plan").doc["plan"]
    assert [(s["pid"], s["cmdline"]) for s in plan["supervisors"]] == [(loop, f"bash {script}")], plan["supervisors"]
    result = teardown(ps)
    doc = result.doc
    assert result.code == 1 and doc["verdict"] == "not free", doc["problems"]
    assert not alive(first) and alive(loop)
    assert [r["pid"] for r in doc["restarters"]] == [loop], doc["restarters"]
    hint = doc["restarters"][0]["include"]
    assert hint.startswith(f"--stop-supervisors (also stops PID {loop}"), hint
    assert any(p.startswith(f"pid {loop} (bash ") and "runs a loop" in p for p in doc["problems"]), doc["problems"]
    again = restarted(ready, first)  # the loop's next turn, after the window: what the verdict warned of
    ps.adopt(again)
    result = teardown(ps, "--stop-supervisors")  # the hint, run as printed
    assert result.code == 0, result.doc["problems"]
    assert not alive(loop) and not alive(again) and result.doc["restarters"] == []


def test_a_watchdog_with_a_sleep_child_is_listed_and_the_flag_its_hint_names_stops_it(ps):
    """A watchdog that started the server in the background and checks it every 4 s: its
    children are the server and a `sleep`. The plan lists it (a loop's timer is no other job),
    so the --stop-supervisors its hint names stops it."""
    ready = ps.base / "srv.ready"
    watchdog = shell(ps, f"{server_cmd(ps, ready)} & s=$!; "
                         f"while sleep 4; do kill -0 $s 2>/dev/null || {{ {server_cmd(ps, ready)} & s=$!; }}; done")
    server = ready_pid(ready)
    ps.adopt(server)
    wait_for(lambda: any(Path(f"/proc/{c}/comm").read_text().strip() == "sleep" for c in children(watchdog)),
             "the watchdog's sleep")
    result = teardown(ps)
    assert result.code == 1, result.doc["problems"]
    assert [r["pid"] for r in result.doc["restarters"]] == [watchdog]
    hint = result.doc["restarters"][0]["include"]
    assert hint.startswith("--stop-supervisors"), hint
    assert alive(watchdog)
    ps.adopt(restarted(ready, server))  # its next check finds the server gone and starts it again
    result = teardown(ps, "--stop-supervisors")
    assert result.code == 0, result.doc["problems"]
    assert not alive(watchdog)


@pytest.mark.skipif(not shutil.which("sudo"), reason="sudo is not installed (.ci/packages has it)")
def test_a_loop_that_launches_through_sudo_is_seen_through_sudo_and_its_monitor(ps):
    """`while true; do sudo SERVER; sleep 0.2; done` in a script: sudo (with use_pty, as Debian
    configures it) runs the server under a monitor in a session of its own. The walk up goes
    through both to the loop: the plan lists it, and its restart is a respawn started by it."""
    ready = ps.base / "srv.ready"
    script = ps.base / "sudo-loop.sh"
    script.write_text(f"while true; do rm -f {ready}; sudo -n {server_cmd(ps, ready)}; sleep 0.2; done\n")
    loop = shell(ps, f"exec bash {script}")
    server = ready_pid(ready)
    ps.adopt(server)
    result = teardown(ps)
    doc = result.doc
    assert result.code == 1, doc["problems"]
    assert [s["pid"] for s in doc["plan"]["supervisors"]] == [loop], doc["plan"]["supervisors"]
    assert doc["appeared"] and all(a["started_by"].startswith(f"PID {loop}: bash {script}")
                                   for a in doc["appeared"]), doc["appeared"]
    assert doc["appeared"][0]["include"].startswith("--stop-supervisors")
    ps.adopt(restarted(ready, server))
    result = teardown(ps, "--stop-supervisors")
    assert result.code == 0, result.doc["problems"]
    assert not alive(loop)


@pytest.mark.skipif(not shutil.which("sudo"), reason="sudo is not installed (.ci/packages has it)")
def test_a_sudo_loop_typed_at_a_tmux_prompt_is_not_freed(ps, tmp_path):
    """The same loop typed at an interactive prompt: the pane's shell runs it. The walk up goes
    through sudo's monitor (a session leader) and sudo to the pane's shell, so the restart
    0.2 s later is a respawn, NOT FREE, and the pane and tmux live on."""
    sock, tmux_server, pane = tmux_pane(ps, tmp_path)
    ready = ps.base / "srv.ready"
    line = f"while true; do rm -f {ready}; sudo -n {server_cmd(ps, ready)}; sleep 0.2; done"
    subprocess.run(["tmux", "-S", str(sock), "send-keys", line, "Enter"], check=True)
    ps.adopt(ready_pid(ready))
    result = teardown(ps)
    doc = result.doc
    assert result.code == 1, doc["problems"]
    assert doc["appeared"], doc["problems"]
    assert all(a["started_by"].startswith(f"PID {pane}:") for a in doc["appeared"]), doc["appeared"]
    assert alive(pane) and alive(tmux_server)
    subprocess.run(["tmux", "-S", str(sock), "send-keys", "C-c", ""], check=False)


# -- NOT FREE never when nothing holds a GPU and nothing restarts one --------------------------

def test_a_panes_sleep_after_its_server_and_another_sessions_clock_are_no_respawn(ps, tmp_path):
    """A tmux pane `bash -c "SERVER; sleep 20"` runs its sleep after the server ends, and a
    clock loop `while sleep 0.5; do date; done` runs in another session of the same tmux
    server. Neither is a respawn: `sleep` is no target program (only a helper of the target's
    tree), and sharing a tmux server relates nothing. FREED, exit 0."""
    bindir = helpers(ps, "sleep", "date")
    ready = ps.base / "srv.ready"
    clock = f"bash -c 'while {bindir}/sleep 0.5; do {bindir}/date; done'"
    sock, tmux_server, clock_pane = tmux_pane(ps, tmp_path, clock)
    subprocess.run(["tmux", "-S", str(sock), "new-window", "-d",
                    f"bash -c '{server_cmd(ps, ready)}; {bindir}/sleep 20'"], check=True)
    ps.adopt(ready_pid(ready))
    result = teardown(ps, "--settle", "1.5")
    doc = result.doc
    assert result.code == 0, doc["problems"]
    assert doc["appeared"] == [] and doc["restarters"] == [], (doc["appeared"], doc["restarters"])
    assert alive(clock_pane) and alive(tmux_server)


@pytest.mark.parametrize("how", ["another tmux window", "a double fork"])
def test_a_client_of_the_same_package_is_no_respawn(ps, tmp_path, how):
    """`python3 -m xsrv.bench_serving` in a retry loop holding no GPU, in another window of the
    tmux server the server's window is in, or started with `( client & )` so that it is left to
    PID 1: the server is `-m xsrv.launch_server`; a package is not a program. FREED, exit 0."""
    pkg = Path(server_cmd(ps, ps.base / "x").split()[0].split("=", 1)[1])
    (pkg / "xsrv" / "bench_serving.py").write_text("import time\ntime.sleep(0.3)\n")
    client = f"PYTHONPATH={pkg} {sys.executable} -m xsrv.bench_serving {ps.base}"
    ready = ps.base / "srv.ready"
    if how == "a double fork":
        loop = shell(ps, f"while true; do ( {client} & ); sleep 0.1; done")
        shell(ps, server_cmd(ps, ready))
    else:
        sock, tmux_server, loop = tmux_pane(ps, tmp_path, f"bash -c 'while true; do {client}; sleep 0.1; done'")
        subprocess.run(["tmux", "-S", str(sock), "new-window", "-d", f"bash -c '{server_cmd(ps, ready)}'"],
                       check=True)
    ps.adopt(ready_pid(ready))
    result = teardown(ps, "--settle", "1.5")
    assert result.code == 0, result.doc["problems"]
    assert result.doc["appeared"] == []
    assert alive(loop)


# -- hints that name what is there ----------------------------------------------------------

def test_a_wrapper_that_execd_the_server_in_place_is_called_the_server_and_a_second_teardown_stops_it(ps):
    ready = ps.base / "srv.ready"
    second = ps.base / "srv2.ready"
    wrapper = shell(ps, f"{server_cmd(ps, ready)}; {server_cmd(ps, second)}")
    ps.adopt(ready_pid(ready))
    result = teardown(ps, "--settle", "1.5")
    assert result.code == 1, result.doc["problems"]
    execd = [a for a in result.doc["appeared"] if a["pid"] == wrapper]
    assert execd, result.doc["appeared"]
    assert "it is the server now" in execd[0]["include"] and "teardown again" in execd[0]["include"]
    assert "terminal's shell" not in execd[0]["include"]
    assert ready_pid(second) == wrapper
    result = teardown(ps)
    assert result.code == 0, result.doc["problems"]
    assert not alive(wrapper)


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("nsenter"),
                    reason="needs root, unshare and nsenter for a PID namespace")
def test_a_container_whose_pid_1_is_the_restart_loop_is_named_with_its_stop(ps):
    """A container (here a PID namespace) whose PID 1 is `bash -c 'while true; do SERVER; sleep
    3; done'`: the agent inside sees the server's parent as PID 1. The verdict is NOT FREE,
    naming PID 1's loop and how to stop the container; it never calls it a double fork."""
    ready = ps.base / "srv.ready"
    loop = f"while true; do rm -f {ready}; {server_cmd(ps, ready)}; sleep 3; done"
    outer = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", "bash", "-c", loop],
                             start_new_session=True)
    ps.adopt(outer.pid)
    inner = wait_for(lambda: children(outer.pid), "the namespace's PID 1")[0]
    ps.adopt(inner)
    # the pid it writes is the namespace's own (never ours to end): ending its PID 1 ends it
    wait_for(lambda: ready.exists() and ready.read_text().strip(), "the server")
    argv = ["nsenter", "-t", str(inner), "-p", "-m", sys.executable, "-", "teardown", "--json",
            "--devices", ps.glob, "--fake-devices", "--fake-gpus", str(ps.memdir), "--scope", str(ps.base),
            "--target", TARGETS, "--grace", "2", "--timeout", "10", "--run-dir", str(ps.base / "run")]
    out = subprocess.run(argv, input=agent_payload(), capture_output=True, timeout=60)
    import json

    doc = json.loads(out.stdout)
    assert out.returncode == 1, doc.get("problems")
    assert [r["pid"] for r in doc["restarters"]] == [1], doc["restarters"]
    assert "PID 1 is never signalled" in doc["restarters"][0]["include"] or "stop the container" in \
        doc["restarters"][0]["include"]
    assert "double fork" not in " ".join(doc["problems"])


# -- the verdict as soon as it is known --------------------------------------------------------

def test_only_matching_gives_its_verdict_once_only_the_holders_it_left_remain(ps):
    """--only-matching leaves a holder that matches no pattern: once the targets are gone the
    verdict (NOT FREE, naming it) comes at once, not after --timeout."""
    ready = ps.base / "srv.ready"
    shell(ps, server_cmd(ps, ready, "--hold", str(ps.devdir / "nvidia0")))
    server = ready_pid(ready)
    ps.adopt(server)
    other = ps.role("worker", "--gpu", "1")  # holds GPU 1, matches no pattern
    result = call_agent(host(ps, TARGETS=TARGETS), "teardown",
                        ["--grace", "2", "--timeout", "60", "--only-matching"], deadline_s=120)
    assert result.code == 1, result.doc["problems"]
    assert not alive(server) and alive(other)
    assert any(f"pid {other}" in p for p in result.doc["problems"]), result.doc["problems"]
    assert result.doc["left_alone_only"] is True  # the verdict came from that, not from --timeout


# -- another person's work ---------------------------------------------------------------------

def test_another_persons_idle_copy_of_a_target_is_left_and_named_unless_all_users(shared_ps, second_user):
    """Root's default teardown: a second user's `-m xsrv.launch_server` that holds no GPU is left
    and named in the plan with its owner; that user's copy holding a GPU is stopped (the GPUs
    must be freed); --all-users stops the idle one too."""
    ps = shared_ps
    pkg = server_pkg(ps)
    rw = ps.base / "rw"
    rw.mkdir()
    os.chmod(rw, 0o777)
    env = second_user.env(PYTHONPATH=str(pkg))
    run = [second_user.python, "-m", "xsrv.launch_server", "--ready"]
    idle = second_user.popen([*run, str(rw / "idle.ready")], env=env).pid
    busy = second_user.popen([*run, str(rw / "busy.ready"), "--hold", str(ps.devdir / "nvidia0")], env=env).pid
    for name in ("idle", "busy"):
        ready_pid(rw / f"{name}.ready")
    result = teardown(ps)
    assert result.code == 0, result.doc["problems"]
    assert alive(idle) and not alive(busy)
    left = {r["pid"]: r["reason"] for r in result.doc["plan"]["left_alone"]}
    assert idle in left and f"another person ({second_user.name}, uid {second_user.uid})" in left[idle], left
    assert idle not in [a["pid"] for a in result.doc["actions"]]  # not even the early batch's SIGTERM
    result = teardown(ps, "--all-users")
    assert result.code == 0, result.doc["problems"]
    assert not alive(idle)


def test_scope_uid_is_a_hosts_env_key_for_real_hosts_and_a_bad_one_is_refused():
    from scripts.config.errors import ConfigError
    from scripts.config.hostconfig import build_host

    host = build_host("gpu1", {"SSH": "ops@192.0.2.7", "SCOPE_UID": "1001"}, "hosts.env")
    assert host.scope_uid == 1001
    for bad in ("alice", "-1", "1e3", "4294967295"):
        with pytest.raises(ConfigError) as err:
            build_host("gpu1", {"SSH": "ops@192.0.2.7", "SCOPE_UID": bad}, "hosts.env")
        assert str(err.value).startswith("GPU1_SCOPE_UID=") and "not a uid" in str(err.value)


# -- loops however they are written, and one-shots however they read ------------------------------

def _loop_cases(ps, ready):
    """{name: (argv, stdin file or None)}: loops that restart the server 3 s after it ends, longer
    than the window, written as people write them."""
    srv = f"rm -f {ready}; {server_cmd(ps, ready)}"
    script = ps.base / "loop.sh"
    script.write_text(f"while true; do {srv}; sleep 3; done\n")
    pyloop = (f"import subprocess, time\nwhile True:\n    subprocess.call({srv!r}, shell=True)\n    time.sleep(3)\n")
    return {
        "arithmetic for": (["bash", "-c", f"for ((;;)); do {srv}; sleep 3; done"], None),
        "eval": (["bash", "-c", f'eval "while true; do {srv}; sleep 3; done"'], None),
        "a function calling itself": (["bash", "-c", f"f() {{ {srv}; sleep 3; f; }}; f"], None),
        "a script on stdin": (["bash"], script),
        "a python loop": ([sys.executable, "-c", pyloop], None),
        "a double fork in a watchdog": (["bash", "-c", f"( {srv} & ); while sleep 3; do kill -0 $(cat {ready}) "
                                                       f"2>/dev/null || ( {srv} & ); done"], None),
    }


@pytest.mark.parametrize("case", ["arithmetic for", "eval", "a function calling itself", "a script on stdin",
                                  "a python loop", "a double fork in a watchdog"])
def test_a_loop_however_written_is_never_freed_while_it_lives(ps, case):
    ready = ps.base / "srv.ready"
    argv, stdin = _loop_cases(ps, ready)[case]
    with open(stdin or os.devnull) as feed:
        loop = subprocess.Popen(argv, start_new_session=True, stdin=feed)
    ps.adopt(loop.pid)
    ps.adopt(ready_pid(ready))
    result = teardown(ps)
    assert result.code == 1, (case, result.doc["problems"])
    assert loop.pid in [r["pid"] for r in result.doc["restarters"]] + [
        int(a["started_by"].split(":")[0][4:]) for a in result.doc["appeared"] if a["started_by"].startswith("PID ")
    ], (case, result.doc["restarters"], result.doc["appeared"])
    assert alive(loop.pid)


@pytest.mark.parametrize("code", [
    "for f in a b; do echo $f; done; SERVER; sleep 6",
    "SERVER; echo 'server exited, waiting for logs'; sleep 6",
    "SERVER; while true; do sleep 1000; done",
    "# start the server for the demo\nSERVER\nsleep 6",
])
def test_a_one_shot_wrapper_is_no_restarter_whatever_its_words(ps, code):
    """A loop that runs no target, a loop keyword in a string or a comment: nothing restarts the
    server, so FREED, exit 0, with the wrapper alive running what follows."""
    ready = ps.base / "srv.ready"
    script = ps.base / "run.sh"
    script.write_text(code.replace("SERVER", server_cmd(ps, ready)) + "\n")
    wrapper = shell(ps, f"exec bash {script}")
    ps.adopt(ready_pid(ready))
    result = teardown(ps)
    assert result.code == 0, (code, result.doc["problems"])
    assert result.doc["restarters"] == [] and alive(wrapper)


def test_the_hint_run_while_the_loop_sleeps_between_turns_still_stops_it(ps):
    """NOT FREE names --stop-supervisors; run at once, while the loop sleeps and no server runs,
    the plan still lists the loop by its code, and the flag stops it: FREED, the loop gone."""
    ready = ps.base / "srv.ready"
    loop = shell(ps, f"while true; do rm -f {ready}; {server_cmd(ps, ready)}; sleep 5; done")
    first = ready_pid(ready)
    ps.adopt(first)
    result = teardown(ps)
    assert result.code == 1 and result.doc["restarters"][0]["include"].startswith("--stop-supervisors")
    plan = call_agent(host(ps, TARGETS=TARGETS), "plan").doc["plan"]
    assert [s["pid"] for s in plan["supervisors"]] == [loop], plan  # no server runs now: listed by its code
    result = teardown(ps, "--stop-supervisors")
    assert result.code == 0, result.doc["problems"]
    assert not alive(loop)


def test_another_persons_copy_holding_only_nvidiactl_is_left(shared_ps, second_user):
    """nvidiactl (or nvidia-uvm) alone is no GPU: every NVML or CUDA client opens it."""
    ps = shared_ps
    pkg = server_pkg(ps)
    rw = ps.base / "rw"
    rw.mkdir()
    os.chmod(rw, 0o777)
    proc = second_user.popen([second_user.python, "-m", "xsrv.launch_server", "--ready", str(rw / "ctl.ready"),
                              "--hold", str(ps.devdir / "nvidiactl")], env=second_user.env(PYTHONPATH=str(pkg)))
    ready_pid(rw / "ctl.ready")
    result = teardown(ps)
    assert alive(proc.pid), result.doc["actions"]
    assert proc.pid in {r["pid"] for r in result.doc["plan"]["left_alone"]}
