"""The sandbox only touches the sandbox.

- `make demo` beside real-looking servers outside the sandbox (in a PID namespace, so a
  broken scope could only ever reach this test's own processes): they are not planned and
  live on; the sandbox's server tree is gone; the demo's own check passes.
- The sandbox directory is private: one squatted, loose, linked or in another user's
  directory (made by a real second user) is refused with one line naming it, exit 3;
  nothing in it is executed, no PID from its state.json is signalled.
- Nothing is written or executed through a link in the sandbox's own directory.
- The sandbox host is scoped: its own dir in every command line it starts, its uid.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from scripts.agent.procs import procfs
from scripts.config import sandbox
from tests.conftest import checkout_copy, invoke
from tests.support.procs import alive, wait_for
from tests.support.sandbox_scene import namespace_command
from tests.support.second_user import make_user, remove_user

ROOT = os.geteuid() == 0


def _unshare_works() -> bool:
    try:
        probe = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True)
        return probe.returncode == 0
    except FileNotFoundError:
        return False


def _env(base: Path) -> dict:
    return dict(os.environ, GPU_PIVOT_SANDBOX_DIR=str(base))


def _one_line(res) -> str:
    lines = [ln for ln in (res.stdout + res.stderr).decode().splitlines() if ln.strip()]
    assert len(lines) == 1, lines
    return lines[0]


# -- make demo beside real-looking servers ------------------------------------------


@pytest.fixture(scope="module")
def scene(tmp_path_factory):
    if not _unshare_works():
        pytest.skip("needs unshare --pid: the demo's teardown is never run beside others' processes outside one")
    workdir = tmp_path_factory.mktemp("scene")
    out = subprocess.run(namespace_command(workdir), capture_output=True, text=True, timeout=300)
    assert (workdir / "scene.json").exists(), out.stdout + out.stderr
    return json.loads((workdir / "scene.json").read_text())


def test_demo_teardown_leaves_real_looking_servers_outside_the_sandbox(scene):
    bystanders = scene["bystanders"]
    assert scene["plan"] is not None, scene.get("plan_error")
    planned = {t["pid"] for t in scene["plan"]["targets"]}
    assert not planned & set(bystanders.values()), (planned, bystanders)
    assert all(scene["bystanders_alive"].values()), scene["bystanders_alive"]
    procs = scene["sandbox"]["processes"]
    assert planned == {procs[r]["pid"] for r in ("server", "worker0", "worker1")}
    assert not any(procs[r]["alive"] for r in ("server", "worker0", "worker1"))


def test_make_demo_steps_end_to_end(scene):
    steps = scene["steps"]
    assert len(steps) >= 6, steps
    for step in steps:
        assert step["rc"] == 0, step["stdout"][-3000:]
    teardown = next(s for s in steps if "teardown" in s["argv"])
    assert "FREED and verified" in teardown["stdout"]
    assert "SANDBOX demo done" in steps[-1]["stdout"]
    procs = scene["sandbox"]["processes"]
    assert all(procs[r]["alive"] for r in ("persistenced", "monitor", "bystander"))


# -- the sandbox directory is private -----------------------------------------------


@pytest.fixture
def other():
    """A throwaway real second user (tests/support/second_user.py; skips when not root)."""
    user = make_user()
    try:
        yield user
    finally:
        remove_user(user)


def as_user(user, script: str, env: dict | None = None) -> subprocess.CompletedProcess:
    out = user.run(["sh", "-c", script], env=env, text=True)
    assert out.returncode == 0, out.stderr
    return out


@pytest.fixture
def shared_tmp():
    """A directory like /tmp (1777, root's): the place a squatter gets to first."""
    path = Path(tempfile.mkdtemp(prefix="gpu-pivot-squat-", dir="/tmp"))
    path.chmod(0o1777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def victim():
    """A process of ours whose PID a squatter plants in state.json."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
    wait_for(lambda: procfs.start_time(proc.pid), "victim started")
    yield proc
    proc.kill()
    proc.wait()


def plant(user, base: Path, shared: Path, victim) -> None:
    """What a squatter leaves in the directory: a state.json naming our victim, programs the
    old sandbox executed (bin/*), a server shim, each touching a marker in `shared` if run."""
    start = procfs.start_time(victim.pid)
    state = json.dumps({"server": {"pid": victim.pid, "start_time": start},
                        "worker0": {"pid": victim.pid, "start_time": 0}})
    marker = f'touch "{shared}/executed-$(basename "$0")"'
    as_user(user, f"""set -e
        cd {base}
        mkdir -p bin pkg/sglang dev run ready gpumem
        printf '%s' '{state}' > state.json
        for p in nvidia-persistenced nvitop torchrun; do
            printf '#!/bin/sh\\n%s\\n' '{marker}' > bin/$p; chmod 755 bin/$p
        done
        : > pkg/sglang/__init__.py
        printf 'open("{shared}/executed-shim", "w")\\n' > pkg/sglang/launch_server.py
    """)


def assert_refused(base: Path, shared: Path, victim, what: str) -> None:
    before = sorted(p.name for p in shared.iterdir())
    for action in ("up", "down", "status"):
        res = invoke("sandbox", action, env=_env(base))
        assert res.returncode == 3, (action, res)
        line = _one_line(res)
        assert line.startswith("gpu-pivot: sandbox directory ") and str(base) in line and what in line, line
    assert alive(victim.pid), "a PID planted in the squatted state.json was signalled"
    assert sorted(p.name for p in shared.iterdir()) == before, "something in the squatted directory was executed"
    ours = [p for p in shared.rglob("*") if p != base and not p.is_symlink() and p.lstat().st_uid == os.geteuid()]
    assert not ours, f"we wrote into the squatted directory: {ours}"


def test_squatted_sandbox_dir_refused(other, shared_tmp, victim):
    base = shared_tmp / "sandbox"
    as_user(other, f"mkdir -m 0755 {base}")
    plant(other, base, shared_tmp, victim)
    assert_refused(base, shared_tmp, victim, f"owned by uid {other.uid}")


def test_world_writable_sandbox_dir_refused(other, shared_tmp, victim):
    base = shared_tmp / "sandbox"
    base.mkdir()
    base.chmod(0o777)  # ours, but anyone may have put things in it
    plant(other, base, shared_tmp, victim)
    assert_refused(base, shared_tmp, victim, "writable by group or others")


def test_sandbox_dir_that_is_a_link_refused(other, shared_tmp, victim):
    real, base = shared_tmp / "theirs", shared_tmp / "sandbox"
    as_user(other, f"mkdir -m 0755 {real} && ln -s {real} {base}")
    plant(other, real, shared_tmp, victim)
    assert_refused(base, shared_tmp, victim, "symlink")


def test_sandbox_dir_inside_another_users_dir_refused(other, shared_tmp):
    theirs = shared_tmp / "theirs"
    as_user(other, f"mkdir -m 0755 {theirs}")
    base = theirs / "sandbox"
    res = invoke("sandbox", "up", env=_env(base))
    assert res.returncode == 3, res
    line = _one_line(res)
    assert str(theirs) in line and f"owned by uid {other.uid}" in line, line
    assert not base.exists()


def test_default_dir_is_private_runtime_dir_not_tmp(monkeypatch):
    monkeypatch.delenv("GPU_PIVOT_SANDBOX_DIR", raising=False)
    where = sandbox.sandbox_dir()
    assert not str(where).startswith(tempfile.gettempdir() + "/")
    if ROOT:
        assert where == Path("/run/gpu-pivot/sandbox")


def test_default_dir_of_a_user_is_made_private(other):
    """As a real unprivileged user: $XDG_RUNTIME_DIR/gpu-pivot/sandbox, else
    $XDG_STATE_HOME/gpu-pivot/sandbox, each created 0700 by them. The user runs a copy of the
    code it can read (this checkout may sit under a 0700 directory)."""
    home = Path(other.home)
    repo = checkout_copy(home / "clone")
    as_user(other, f"mkdir -m 0700 -p {home}/runtime")
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from scripts.config.sandbox import checked_dir; "
            "print(checked_dir())")
    for extra, want in ((dict(XDG_RUNTIME_DIR=f"{home}/runtime"), home / "runtime" / "gpu-pivot" / "sandbox"),
                        (dict(XDG_STATE_HOME=f"{home}/state"), home / "state" / "gpu-pivot" / "sandbox")):
        out = other.py(code, str(repo), env=other.env(**extra))
        assert out.returncode == 0, out.stderr
        assert Path(out.stdout.strip()) == want
        for d in (want, want.parent):
            st = d.lstat()
            assert stat.S_ISDIR(st.st_mode) and st.st_uid == other.uid and stat.S_IMODE(st.st_mode) == 0o700


# -- nothing written or executed through a link in our own directory ----------------


@pytest.fixture
def own_base(tmp_path):
    base = tmp_path / "sandbox"
    base.mkdir(mode=0o700)
    yield base
    for link in [p for p in base.rglob("*") if p.is_symlink()]:
        link.unlink()
    invoke("sandbox", "down", env=_env(base))


@pytest.mark.parametrize("rel", ["state.json", "pkg/sglang/launch_server.py", "hidden_states/data_config.json",
                                 "fake-model/config.json", "dev/nvidia0"])
def test_link_in_sandbox_dir_is_refused_not_written_through(own_base, tmp_path, rel):
    target = tmp_path / "precious.json"
    target.write_text("{}\n")  # valid JSON: the old sandbox read it as its state, then overwrote it
    before = target.stat()
    link = own_base / rel
    link.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    link.symlink_to(target)
    res = invoke("sandbox", "up", env=_env(own_base))
    assert res.returncode == 3, res
    line = _one_line(res)
    assert str(link) in line and "symlink" in line, line
    assert target.read_text() == "{}\n" and target.stat().st_mtime_ns == before.st_mtime_ns
    assert not (own_base / "ready").exists() or not any((own_base / "ready").iterdir()), "processes were started"


def test_nothing_in_sandbox_is_a_link_and_daemons_are_named(own_base, tmp_path):
    """bin/torchrun planted as a link to a program: replaced by a fresh regular file; the
    daemons are python with argv[0] and comm set, not symlinks to python."""
    planted = tmp_path / "planted.sh"
    planted.write_text(f"#!/bin/sh\ntouch {tmp_path}/executed\n")
    planted.chmod(0o755)
    (own_base / "bin").mkdir(mode=0o700)
    (own_base / "bin" / "torchrun").symlink_to(planted)
    res = invoke("sandbox", "up", "--json", env=_env(own_base))
    assert res.returncode == 0, res
    state = json.loads(res.stdout)
    assert [str(p) for p in own_base.rglob("*") if p.is_symlink()] == []
    torchrun = (own_base / "bin" / "torchrun").lstat()
    assert stat.S_ISREG(torchrun.st_mode) and stat.S_IMODE(torchrun.st_mode) == 0o700
    assert planted.read_text().startswith("#!/bin/sh\ntouch")
    procs = state["processes"]
    comm = {r: Path(f"/proc/{p['pid']}/comm").read_text().strip() for r, p in procs.items()}
    assert comm["persistenced"] == "nvidia-persiste" and comm["monitor"] == "nvitop"
    assert comm["worker0"] == "sglang::schedul"
    for role, p in procs.items():  # every process: in the sandbox's scope, owned by us
        argv = Path(f"/proc/{p['pid']}/cmdline").read_bytes().split(b"\0")
        assert f"{own_base}/".encode() in b" ".join(argv), role
        assert Path(f"/proc/{p['pid']}").stat().st_uid == os.geteuid()
    # the train phase's job runs through that regular file as `torchrun`, with the sandbox dir in view
    job = subprocess.Popen([str(own_base / "bin" / "torchrun"), str(sandbox.ROLES), "idle", "--devdir",
                            str(own_base / "dev")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: Path(f"/proc/{job.pid}/cmdline").read_bytes().startswith(b"torchrun\0"), "torchrun exec")
        wait_for(lambda: Path(f"/proc/{job.pid}/comm").read_text().strip() == "torchrun", "torchrun named")
        assert os.path.realpath(f"/proc/{job.pid}/exe") == os.path.realpath(sys.executable)
    finally:
        job.send_signal(signal.SIGKILL)
        job.wait()
    assert not (tmp_path / "executed").exists()


def test_sandbox_host_is_scoped_to_its_dir_and_user(tmp_path, monkeypatch):
    base = tmp_path / "sandbox"
    monkeypatch.setenv("GPU_PIVOT_SANDBOX_DIR", str(base))
    host = sandbox.sandbox_host()
    assert host.fake_devices and host.scope == f"{base}/" and host.scope_uid == os.geteuid()
    for name, phase in host.phases.items():
        spec = phase.spec()
        assert f"{base}/" in " ".join(spec["argv"]), name
        for cmd in spec.get("prep") or []:
            assert str(base) in cmd, (name, cmd)
