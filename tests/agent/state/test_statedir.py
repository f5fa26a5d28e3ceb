"""No path another user controls is trusted; gpu-pivot's own failures are reported, not hidden.

State, lock, audit log and last.json live in a directory gpu-pivot creates 0700 or checks
(ours, not a link, not group/other writable); files are opened O_NOFOLLOW, created 0600.
The cases about other users run as a real second user (tests/support/second_user.py). Cases that
need a read-only or full filesystem mount a tmpfs in a private mount namespace
(`unshare --mount`), so nothing outside the test sees it.
Every teardown here is scoped like test_teardown's: fake device files in the test's temp
dir and target patterns naming the test's own server programs.
"""
import json
import os
import secrets
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from scripts.agent.procs import procfs
from scripts.agent.state import auditlog, lastrun, statedir
from scripts.agent.state.statedir import StateDirError
from scripts.agent.teardown import hostlock
from scripts.agent.wire import frame, requests
from scripts.reach.bundle import agent_payload
from tests.conftest import REPO, invoke
from tests.support import scenario
from tests.support.agent_inproc import run_agent
from tests.support.procs import alive, wait_for
from tests.support.teardowns import assert_outcome, env_file, scenario_host as scoped_host

VICTIM_TEXT = "precious: must never be truncated or appended to\n"




@pytest.fixture
def run_dir(tmp_path, monkeypatch):
    """A fresh run dir for this test (the agent's state dir, via GPU_PIVOT_RUN_DIR)."""
    path = tmp_path / "run"
    monkeypatch.setenv(statedir.RUN_DIR_ENV, str(path))
    return path


@pytest.fixture
def victim(tmp_path):
    """A file of someone else's that a planted link points at."""
    path = tmp_path / "victim.txt"
    path.write_text(VICTIM_TEXT)
    return path


def assert_untouched(victim):
    assert victim.read_text() == VICTIM_TEXT
    assert stat.S_IMODE(victim.stat().st_mode) == 0o644


def one_line(text):
    lines = [line for line in str(text).strip().splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one line, got {lines!r}"
    return lines[0]


def in_mount_ns(mount_opts: str, target: Path, argv: list, fill: bool = False, **kw):
    """Run argv in a private mount namespace where `target` is a fresh tmpfs (e.g. 'ro')."""
    script = 'mount -t tmpfs -o "$1" gpu-pivot-test "$2" || exit 99; shift 2; '
    if fill:
        script += 'dd if=/dev/zero of="$TARGET/fill" bs=4k 2>/dev/null; '
    script += 'exec "$@"'
    env = dict(kw.pop("env", None) or os.environ, TARGET=str(target))
    proc = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", mount_opts,
                           str(target), *argv], capture_output=True, text=True, env=env, timeout=120, **kw)
    if proc.returncode == 99 or "unshare failed" in proc.stderr:
        pytest.skip(f"cannot mount a tmpfs in a private mount namespace here: {proc.stderr.strip()}")
    return proc


# -- planted links: the victim file is untouched and the refusal is clear ------------------------------------


def test_symlink_at_lock_path_is_refused_and_victim_untouched(run_dir, victim):
    statedir.private_dir(str(run_dir))
    (run_dir / hostlock.LOCK_NAME).symlink_to(victim)
    with pytest.raises(StateDirError) as err:
        fd = hostlock.acquire("mallory-bait@test")
        hostlock.release(fd)
    msg = one_line(err.value)
    assert str(run_dir / hostlock.LOCK_NAME) in msg and "symlink" in msg
    assert_untouched(victim)


def test_symlink_at_host_audit_log_is_refused_teardown_goes_on(run_dir, victim):
    statedir.private_dir(str(run_dir))
    (run_dir / "audit.jsonl").symlink_to(victim)
    audit = auditlog.Audit("op@test")
    for n in range(3):
        audit.log({"pid": 1000 + n, "start_time": 1, "cmdline": "x"}, "SIGTERM", "sent")  # must not raise
    assert_untouched(victim)
    assert len(audit.records) == 3
    assert len(audit.write_errors) == 1  # the same failure is one line, not one per record
    assert "audit.jsonl" in audit.write_errors[0] and "symlink" in audit.write_errors[0]


def test_symlink_at_last_json_is_refused_not_followed(run_dir, victim):
    statedir.private_dir(str(run_dir))
    victim.write_text(json.dumps({"state": "finished", "verdict": "free", "secret": "victim's data"}))
    victim.chmod(0o644)
    (run_dir / "last.json").symlink_to(victim)
    with pytest.raises(StateDirError) as err:
        lastrun.save({"state": "running"})
    assert "last.json" in one_line(err.value) and "symlink" in str(err.value)
    assert (run_dir / "last.json").is_symlink()  # refused, not silently replaced
    assert json.loads(victim.read_text())["secret"] == "victim's data"
    loaded = lastrun.load()  # reading refuses the link too: the victim's content is not shown as ours
    assert loaded["state"] == "unreadable" and "secret" not in loaded


def test_symlink_at_local_audit_log_is_refused(tmp_path, monkeypatch, victim, capsys):
    from scripts.ops import audit_log

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    statedir.private_dir(str(audit_log.audit_dir()), parents=True)
    audit_log.audit_path().symlink_to(victim)
    assert audit_log.append("gpu1", [{"pid": 1, "signal": "SIGTERM", "result": "sent"}]) is None
    assert_untouched(victim)
    err = one_line(capsys.readouterr().err)
    assert str(audit_log.audit_path()) in err and "symlink" in err


def test_state_files_are_private(run_dir, tmp_path, monkeypatch):
    from scripts.ops import audit_log

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    old = os.umask(0)  # even with a permissive umask
    try:
        fd = hostlock.acquire("op@test")
        hostlock.release(fd)
        lastrun.save({"state": "finished"})
        auditlog.Audit("op@test").log({"pid": 1}, "SIGTERM", "sent")
        audit_log.append("gpu1", [{"pid": 1}])
    finally:
        os.umask(old)
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
    for name in (hostlock.LOCK_NAME, "last.json", "audit.jsonl"):
        assert stat.S_IMODE((run_dir / name).stat().st_mode) == 0o600, name
    assert stat.S_IMODE(audit_log.audit_path().stat().st_mode) == 0o600
    assert stat.S_IMODE(audit_log.audit_dir().stat().st_mode) == 0o700
    assert not [p for p in run_dir.iterdir() if p.name.endswith(".tmp")]  # temp files replaced or removed


# -- loose, squatted, linked directories are refused with one line naming them -------------------------------


@pytest.mark.parametrize("mode", [0o770, 0o707, 0o777, 0o1777, 0o720])
def test_group_or_other_writable_run_dir_refused(run_dir, mode):
    run_dir.mkdir()
    run_dir.chmod(mode)
    for call in (lastrun.run_dir, lastrun.preflight, lambda: hostlock.acquire("op")):
        with pytest.raises(StateDirError) as err:
            call()
        msg = one_line(err.value)
        assert str(run_dir) in msg and "writable by group or others" in msg
    assert stat.S_IMODE(run_dir.stat().st_mode) == mode  # refused, never chmod-ed
    assert list(run_dir.iterdir()) == []


def test_symlinked_run_dir_refused(tmp_path, monkeypatch):
    real = tmp_path / "elsewhere"
    real.mkdir(mode=0o700)
    link = tmp_path / "run"
    link.symlink_to(real)
    monkeypatch.setenv(statedir.RUN_DIR_ENV, str(link))
    with pytest.raises(StateDirError) as err:
        lastrun.preflight()
    assert str(link) in one_line(err.value) and "symlink" in str(err.value)
    assert list(real.iterdir()) == []


def test_run_dir_squatted_by_second_user_refused_by_root(second_user, ps, monkeypatch):
    """The user creates the directory first (as with /tmp/gpu-pivot-0) and plants state in it."""
    squat = Path("/tmp") / f"gpu-pivot-squat-{secrets.token_hex(4)}"
    made = second_user.run(["sh", "-c", 'mkdir -m 755 "$1" && echo \'{"state": "running"}\' > "$1/last.json" '
                            '&& ln -s /etc/shadow "$1/audit.jsonl"', "sh", str(squat)], text=True)
    assert made.returncode == 0, made.stderr
    try:
        before = sorted(os.listdir(squat))
        monkeypatch.setenv(statedir.RUN_DIR_ENV, str(squat))
        with pytest.raises(StateDirError) as err:
            lastrun.preflight()
        msg = one_line(err.value)
        assert str(squat) in msg and f"owned by uid {second_user.uid}" in msg
        with pytest.raises(StateDirError):
            hostlock.acquire("root@test")
        # the real agent: exit 3, one line naming the directory, nothing signalled
        roles = scenario.start(ps, stubborn=False)
        h = scoped_host(ps)
        import dataclasses
        h = dataclasses.replace(h, run_dir=str(squat))
        result = run_agent(h, requests.Teardown(grace=1, timeout=2))
        assert result.code == 3, result.doc
        assert str(squat) in one_line(result.doc["error"])
        assert all(alive(pid) for pid in roles.values()), "something was signalled"
        assert sorted(os.listdir(squat)) == before
        assert all(os.lstat(squat / n).st_uid == second_user.uid for n in before)
    finally:
        second_user.run(["rm", "-rf", "--", str(squat)])


def test_control_dir_squatted_by_second_user_refused(second_user, hosts_env, monkeypatch):
    """ssh's ControlPath dir: a squatter's socket there would be taken for our master connection."""
    from scripts.reach import ssh

    squat = f"/tmp/gpvt-cm-{secrets.token_hex(3)}"  # short: used as it is, not hashed
    made = second_user.run(["mkdir", "-m", "700", squat])
    assert made.returncode == 0, made.stderr
    try:
        with pytest.raises(StateDirError) as err:
            ssh.control_dir(squat)
        assert squat in one_line(err.value) and f"uid {second_user.uid}" in str(err.value)
        hosts_env("GPU2_SSH=nobody@127.0.0.1\n")
        monkeypatch.setenv(ssh.CONTROL_DIR_ENV, squat)
        out = invoke("ping", "--host", "gpu2")
        assert out.returncode == 3, out.stderr
        assert squat in one_line(out.stderr.decode())
    finally:
        second_user.run(["rm", "-rf", "--", squat])


def test_loose_control_dir_refused():
    from scripts.reach import ssh

    loose = Path(f"/tmp/gpvt-cm-{secrets.token_hex(3)}")  # short: used as it is, not hashed
    loose.mkdir()
    try:
        loose.chmod(0o777)
        with pytest.raises(StateDirError) as err:
            ssh.control_dir(str(loose))
        assert str(loose) in one_line(err.value)
        assert stat.S_IMODE(loose.stat().st_mode) == 0o777
    finally:
        loose.rmdir()


def test_non_root_default_run_dir_is_private_under_state_home(second_user):
    """No XDG_RUNTIME_DIR: ~/.local/state/gpu-pivot/run, created 0700 (never /tmp/gpu-pivot-UID)."""
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from scripts.agent.state import lastrun; "
            "print(lastrun.preflight())")
    lib = _agent_lib(second_user)
    out = second_user.py(code, str(lib))
    assert out.returncode == 0, out.stderr
    path = Path(out.stdout.strip())
    assert path == Path(second_user.home) / ".local" / "state" / "gpu-pivot" / "run"
    st = path.stat()
    assert st.st_uid == second_user.uid and stat.S_IMODE(st.st_mode) == 0o700
    # a runtime dir that is not private is not used
    loose = Path(second_user.home) / "rt"
    second_user.run(["mkdir", "-m", "777", str(loose)])
    out = second_user.py(code, str(lib), env=second_user.env(XDG_RUNTIME_DIR=str(loose)))
    assert Path(out.stdout.strip()) == path, out.stderr


def _agent_lib(user):
    """A copy of scripts/agent the user can read (the checkout may sit in root's 0700 home)."""
    import shutil

    lib = Path(user.home) / "lib"
    shutil.copytree(REPO / "scripts" / "agent", lib / "scripts" / "agent",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (lib / "scripts" / "__init__.py").write_text("")
    subprocess.run(["chmod", "-R", "a+rX", str(lib)], check=True)
    return lib


# -- read-only or full state directory: preflight says so in one line; logging failures are collected ------


@pytest.mark.parametrize("opts,fill,why", [("ro,mode=0700", False, "Read-only file system"),
                                           ("size=64k,mode=0700", True, "No space left on device")])
def test_unwritable_state_dir_preflight_one_line(tmp_path, opts, fill, why):
    target = tmp_path / "run"
    target.mkdir(mode=0o700)
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from scripts.agent.state import lastrun\n"
            "try:\n    lastrun.preflight()\nexcept OSError as exc:\n    print('ERROR', exc); sys.exit(3)\n"
            "print('OK')")
    env = dict(os.environ, GPU_PIVOT_RUN_DIR=str(target))
    out = in_mount_ns(opts, target, [sys.executable, "-c", code, str(REPO)], fill=fill, env=env)
    assert out.returncode == 3, out.stdout + out.stderr
    line = one_line(out.stdout)
    assert str(target) in line and why in line
    assert "Traceback" not in out.stderr


def test_full_disk_during_teardown_audit_collects_errors(tmp_path):
    """The audit log never raises: a full disk is reported once, every record still kept."""
    target = tmp_path / "run"
    target.mkdir(mode=0o700)
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); from scripts.agent.state import auditlog\n"
            "a = auditlog.Audit('op')\n"
            "for n in range(50): a.log({'pid': n, 'cmdline': 'x' * 2000}, 'SIGTERM', 'sent')\n"
            "print(json.dumps({'records': len(a.records), 'errors': a.write_errors}))")
    env = dict(os.environ, GPU_PIVOT_RUN_DIR=str(target))
    out = in_mount_ns("size=64k,mode=0700", target, [sys.executable, "-c", code, str(REPO)], env=env)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["records"] == 50
    assert len(doc["errors"]) == 1 and "No space left on device" in doc["errors"][0]


def test_read_only_state_dir_teardown_exits_3_nothing_signalled(ps, hosts_env, tmp_path):
    """The CLI: one line naming the directory, exit 3, every process still alive.
    (Depends on the lead's teardown calling lastrun.preflight() before anything.)"""
    roles = scenario.start(ps, stubborn=False)
    env_file(ps, hosts_env)
    target = tmp_path / "rorun"
    target.mkdir(mode=0o700)
    env = dict(os.environ, GPU_PIVOT_RUN_DIR=str(target))
    out = in_mount_ns("ro,mode=0700", target, [sys.executable, "-m", "invoke", "teardown", "--host", "local", "--yes",
                                               "--grace", "1"], env=env, cwd=REPO)
    assert out.returncode == 3, out.stdout + out.stderr
    line = [ln for ln in (out.stdout + out.stderr).splitlines() if f"state directory {target}" in ln]
    assert len(line) == 1 and "Read-only file system" in line[0], out.stdout + out.stderr
    assert "Traceback" not in out.stderr
    assert all(alive(pid) for pid in roles.values()), "something was signalled"


# -- a record whose agent is gone reads "interrupted" -------------------------------------------------------


def _dead_process_identity():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    start = procfs.start_time(child.pid)
    child.wait()
    return {"pid": child.pid, "start_time": start}


def test_running_record_with_dead_agent_reads_interrupted(run_dir, ps):
    statedir.private_dir(str(run_dir))
    ident = dict(_dead_process_identity(), boot_id=lastrun.agent_identity()["boot_id"])
    statedir.write_json_atomic(str(run_dir / "last.json"), {"state": "running", "operator": "op@test",
                                                            "started": "then", "agent": ident})
    assert lastrun.load()["state"] == "interrupted"
    assert lastrun.load_summary()["state"] == "interrupted"
    # and through the real status path
    doc = run_agent(scoped_host(ps), requests.Scan()).doc
    assert doc["last_teardown"]["state"] == "interrupted"
    # a record without any agent identity cannot be proved alive either
    statedir.write_json_atomic(str(run_dir / "last.json"), {"state": "running"})
    assert lastrun.load()["state"] == "interrupted"
    # while the agent lives, it is running
    me = lastrun.agent_identity()
    statedir.write_json_atomic(str(run_dir / "last.json"), {"state": "running", "agent": me})
    assert lastrun.load()["state"] == "running"
    # same pid, another start time (a reused pid) is not the agent
    statedir.write_json_atomic(str(run_dir / "last.json"),
                               {"state": "running", "agent": dict(me, start_time=me["start_time"] - 1)})
    assert lastrun.load()["state"] == "interrupted"


def test_save_records_the_agent_and_raises_when_it_cannot_write(run_dir):
    lastrun.save({"state": "running"})
    doc = json.loads((run_dir / "last.json").read_text())
    assert doc["agent"]["pid"] == os.getpid() and doc["agent"]["start_time"] == procfs.start_time(os.getpid())
    (run_dir / "last.json").unlink()
    (run_dir / "last.json").mkdir()  # something that is not a file sits there
    with pytest.raises(OSError):
        lastrun.save({"state": "finished"})


# -- one teardown at a time, whoever runs it ---------------------------------------------------------------


HOLD_OLD_ROOT_LOCK = """
import fcntl, os, sys, time
fd = os.open("/run/lock/gpu-pivot.lock", os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
try:
    os.mkdir("/run/gpu-pivot")
    made = "made /run/gpu-pivot"
except OSError as exc:
    made = "mkdir /run/gpu-pivot: %s" % type(exc).__name__
print("holding;", made, flush=True)
time.sleep(60)
"""

ROOT_TAKES_LOCK = """
import json, os, subprocess, sys
user_argv, user_env, repo = json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3]
holder = subprocess.Popen(user_argv, env=user_env, stdout=subprocess.PIPE, text=True)
try:
    print(holder.stdout.readline().strip(), flush=True)
    os.environ.pop("GPU_PIVOT_RUN_DIR", None)
    sys.path.insert(0, repo)
    from scripts.agent.teardown import hostlock
    try:
        fd = hostlock.acquire("root@test")
        print("acquired", hostlock.lock_path(), flush=True)
        hostlock.release(fd)
    except hostlock.Locked as exc:
        print("LOCKED", exc, flush=True)
finally:
    holder.kill()
    holder.wait()
"""


def test_second_user_cannot_block_roots_lock(second_user):
    """In a private mount namespace with its own /run (the real one untouched): the user
    holds an flock where root's lock used to be (/run/lock, world-writable) and tries to
    create /run/gpu-pivot first; root's teardown lock is still taken at once."""
    user_argv = second_user.argv([second_user.python, "-c", HOLD_OLD_ROOT_LOCK])
    script = ('mount -t tmpfs -o mode=755 gpu-pivot-test /run || exit 99; mkdir -m 1777 /run/lock; exec "$@"')
    proc = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh",
                           sys.executable, "-c", ROOT_TAKES_LOCK, json.dumps(user_argv),
                           json.dumps(second_user.env()), str(REPO)], capture_output=True, text=True, timeout=60)
    if proc.returncode == 99:
        pytest.skip(f"cannot mount a tmpfs on /run in a private mount namespace: {proc.stderr.strip()}")
    lines = proc.stdout.splitlines()
    assert lines and lines[0] == "holding; mkdir /run/gpu-pivot: PermissionError", proc.stdout + proc.stderr
    assert lines[1] == "acquired /run/gpu-pivot/gpu-pivot.lock", proc.stdout + proc.stderr


def _fake_agent(argv_prefix, popen, **kw):
    """A process with a teardown agent's argv shape (`python3 - teardown ... --marker HEX`)
    that only sleeps; started through `popen` (as root, or as the second user)."""
    nonce = secrets.token_hex(8)
    proc = popen([*argv_prefix, "-", "teardown", "--devices", "/nonexistent/nvidia*", "--marker", nonce],
                 stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **kw)
    proc.stdin.write(b"import time\ntime.sleep(60)\n")
    proc.stdin.close()
    return proc


def test_second_user_teardown_refused_while_roots_runs(second_user):
    """The real agent, run as the second user, exits 4 naming root's running teardown."""
    root_agent = _fake_agent(["python3"], subprocess.Popen, executable=sys.executable)
    try:
        wait_for(lambda: any(a["pid"] == root_agent.pid for a in hostlock.teardown_agents()), "root's agent seen")
        devdir = Path(second_user.home) / "dev"
        second_user.run(["sh", "-c", 'mkdir "$1" && touch "$1/nvidia0" "$1/nvidia1"', "sh", str(devdir)])
        nonce = secrets.token_hex(8)
        argv = [second_user.python, "-", "teardown", "--devices", f"{devdir}/nvidia*", "--fake-devices",
                "--marker", nonce, "--target", r"gpvt-no-such-program", "--scope", str(devdir),
                "--scope-uid", str(second_user.uid), "--grace", "1", "--timeout", "1"]
        out = second_user.run(argv, input=agent_payload())
        assert out.returncode == 4, out.stdout.decode() + out.stderr.decode()
        doc = json.loads(frame.extract(out.stdout.decode(), nonce))
        assert doc["locked"] is True
        assert doc["holder"]["operator"] == "root's teardown"
        assert "root's teardown" in doc["error"]
    finally:
        root_agent.kill()
        root_agent.wait()


def test_roots_teardown_reports_second_users_running_teardown(second_user, ps):
    """A teardown beside root's is noticed: root lists it (concurrent_teardowns), and its
    teardown result carries it. (The result key depends on the lead wiring
    hostlock.concurrent_teardowns() into teardown.execute.)"""
    from scripts.agent.procs import procscan

    procscan._USER_NAMES.clear()  # this pytest process may have cached the uid of an earlier, deleted test user
    user_agent = _fake_agent([second_user.python], second_user.popen)
    try:
        seen = wait_for(lambda: [a for a in hostlock.concurrent_teardowns() if a["pid"] == user_agent.pid],
                        "the user's agent seen by root")
        assert seen[0]["user"] == second_user.name and "--marker" in seen[0]["cmdline"]
        assert all(set(a) == {"pid", "user", "cmdline"} for a in hostlock.concurrent_teardowns())
        result = run_agent(scoped_host(ps), requests.Teardown(grace=1, timeout=2))
        assert result.code == 0, result.doc
        reported = result.doc.get("concurrent_teardowns")
        assert reported is not None, "root's teardown result does not report concurrent teardowns"
        assert any(a["pid"] == user_agent.pid and a["user"] == second_user.name for a in reported)
    finally:
        second_user.end_processes()


def test_agent_shape_is_exact():
    ok = ["python3", "-", "teardown", "--devices", "/dev/nvidia*", "--marker", "0a1b2c"]
    assert hostlock.is_teardown_agent(ok)
    assert hostlock.is_teardown_agent(["/usr/bin/python3.11", *ok[1:]])
    assert not hostlock.is_teardown_agent(["python3", "-", "scan", *ok[3:]])
    assert not hostlock.is_teardown_agent(["bash", "-c", " ".join(ok)])
    assert not hostlock.is_teardown_agent(["python3", "-", "teardown", "--marker", "NOT-HEX"])
    assert not hostlock.is_teardown_agent(["pythonista", *ok[1:]])


# -- Ctrl-C during a local teardown: the agent finishes; the local side says so and exits 130 -----------------


def test_ctrl_c_during_local_teardown_agent_finishes(ps, hosts_env):
    roles = scenario.start(ps)  # with the SIGTERM-ignoring server
    env_file(ps, hosts_env)
    last = Path(lastrun.last_path())
    if last.exists():
        last.unlink()
    proc = subprocess.Popen([sys.executable, "-m", "invoke", "teardown", "--host", "local", "--yes", "--grace", "3",
                             "--timeout", "10"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)  # its own process group: the "terminal" we Ctrl-C
    try:
        seen = []
        for raw in proc.stdout:
            seen.append(raw.decode(errors="replace"))
            if "grace" in seen[-1]:
                break
        else:
            pytest.fail("no grace-period progress line: " + "".join(seen) + proc.stderr.read().decode())
        assert alive(roles["stubborn"])
        os.killpg(proc.pid, signal.SIGINT)  # what a Ctrl-C at the terminal sends
        rest, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out = "".join(seen) + rest.decode(errors="replace") + err.decode(errors="replace")
    assert proc.returncode == 130, out
    assert ("interrupted: the teardown continues on local; see its result with `invoke status --host local`"
            in out), out
    assert "Traceback" not in out
    doc = wait_for(lambda: _finished(last), "last.json to say finished", timeout=20)
    kills = {a["pid"] for a in doc["actions"] if a["signal"] == "SIGKILL" and a["result"] == "sent"}
    assert {roles["stubborn"], roles["stubborn_worker"]} <= kills
    assert doc["verdict"] == "free"
    assert_outcome(roles)


def _finished(path):
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return doc if doc.get("state") == "finished" else None


def test_statedir_refuses_non_regular_and_foreign_files(run_dir, second_user):
    statedir.private_dir(str(run_dir))
    fifo = run_dir / "audit.jsonl"
    os.mkfifo(fifo, 0o600)
    with pytest.raises(StateDirError) as err:  # a FIFO with no reader: an open that waited would never return
        statedir.append_line(str(fifo), "x")
    assert "not a regular file" in str(err.value)
    foreign = run_dir / "last.json"
    foreign.write_text("{}")
    os.chown(foreign, second_user.uid, second_user.gid)
    with pytest.raises(StateDirError) as err:
        lastrun.save({"state": "finished"})
    assert f"uid {second_user.uid}" in one_line(err.value)
    assert foreign.read_text() == "{}"


# -- the directories above a state directory ----------------------------------------------------
# Rule: every directory above a state directory (the run dir with the host's lock, the ssh
# control directory) is ours or root's, and one others may write in is sticky; else its owner
# renames our directory aside, a new one is made, and two teardowns hold "the" lock at once.


def test_a_run_dir_under_another_users_directory_is_refused_before_the_lock(tmp_path, monkeypatch, second_user):
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, second_user.uid, second_user.gid)
    monkeypatch.setenv(statedir.RUN_DIR_ENV, str(theirs / "run"))
    with pytest.raises(StateDirError, match=f"owned by uid {second_user.uid}"):
        hostlock.acquire("the operator")
    assert not (theirs / "run").exists()  # refused before anything was made there
    # the attack it stops: their rename of our directory, then a second holder of the lock
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o755)
    monkeypatch.setenv(statedir.RUN_DIR_ENV, str(mine / "run"))
    assert statedir.run_dir() == str(mine / "run")


@pytest.mark.parametrize(("mode", "refused"), [(0o777, True), (0o775, True), (0o1777, False), (0o755, False)])
def test_a_directory_above_others_may_write_in_must_be_sticky(tmp_path, monkeypatch, mode, refused):
    above = tmp_path / "above"
    above.mkdir()
    above.chmod(mode)
    monkeypatch.setenv(statedir.RUN_DIR_ENV, str(above / "run"))
    if refused:
        with pytest.raises(StateDirError, match="not sticky"):
            statedir.run_dir()
    else:
        assert statedir.run_dir() == str(above / "run")


def test_a_symlink_above_resolving_under_another_users_directory_is_refused(tmp_path, monkeypatch, second_user):
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, second_user.uid, second_user.gid)
    (tmp_path / "link").symlink_to(theirs)
    monkeypatch.setenv(statedir.RUN_DIR_ENV, str(tmp_path / "link" / "run"))
    with pytest.raises(StateDirError, match=f"owned by uid {second_user.uid}"):
        statedir.run_dir()


def test_an_ssh_control_dir_under_another_users_directory_is_refused(monkeypatch, second_user):
    import shutil
    import tempfile

    from scripts.reach import ssh

    short = Path(tempfile.mkdtemp(prefix="gp", dir="/tmp"))  # short: a long one is swapped for /tmp/gpu-pivot-ssh-*
    try:
        theirs = short / "t"
        theirs.mkdir(mode=0o755)
        os.chown(theirs, second_user.uid, second_user.gid)
        monkeypatch.setenv(ssh.CONTROL_DIR_ENV, str(theirs / "cm"))
        with pytest.raises(StateDirError, match=ssh.CONTROL_DIR_ENV):
            ssh.control_dir()
        assert not (theirs / "cm").exists()
    finally:
        shutil.rmtree(short)
