"""Shared fixtures: a real loopback sshd (plain and noisy), hosts.env files, invoke runner."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import cli_zygote
from tests.support.loopback_sshd import LoopbackSshd
from tests.support.paths import FIXTURES, REPO  # noqa: F401  (FIXTURES: imported from here by test modules)
from tests.support.procs import ProcessSet
from tests.support.second_user import second_user  # noqa: F401  (fixture: a real second user, for every test module)

VENV_BIN = Path(sys.executable).parent
MOTD = "echo 'Welcome to gpu-node (MOTD noise)'; echo '=====gpu-pivot-result fake begin====='\n"



def _keep_hangups_from_this_process(signum, frame):
    """SIGHUP and SIGQUIT, ignored when the suite started so: still nothing here."""


def _children_start_with_default_signals():
    """A suite started in the background of a script (`make test &`, nohup) inherits SIGINT,
    SIGQUIT and SIGHUP ignored, and an ignored signal stays ignored across exec: every CLI a
    test starts would then shrug off the Ctrl-C the test sends as a terminal would (exit 130
    never comes). A signal caught here is reset to its default in every program started
    from here, so each is caught: SIGINT as Python does by default, the others by a handler
    that does nothing, so this process still ignores them in effect."""
    import signal

    for sig, handler in ((signal.SIGINT, signal.default_int_handler),
                         (signal.SIGQUIT, _keep_hangups_from_this_process),
                         (signal.SIGHUP, _keep_hangups_from_this_process)):
        if signal.getsignal(sig) is signal.SIG_IGN:
            signal.signal(sig, handler)


def pytest_configure(config):
    _children_start_with_default_signals()
    config.addinivalue_line("markers", "host_pid_ns: needs the machine's own PID and network namespace (the "
                            "kernel's fork events); runs on the one xdist worker left there (tests/support/workers.py)")
    if not config.pluginmanager.hasplugin("xdist"):  # not installed, or -p no:xdist
        return
    from tests.support import workers

    if not config.pluginmanager.has_plugin("gpu-pivot-workers"):
        config.pluginmanager.register(workers, "gpu-pivot-workers")


TEST_DEADLINE_S = 600  # no test needs minutes: one that hangs fails with its stack, the run goes on


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    """A test still running after TEST_DEADLINE_S fails (SIGALRM interrupts a blocked read or
    wait in the test's own thread) instead of holding its worker, and the whole run, forever."""
    import signal

    def expired(signum, frame):
        raise TimeoutError(f"{item.nodeid} still running after {TEST_DEADLINE_S} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(TEST_DEADLINE_S)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


# What a test may not find in the machine's environment: state dirs, a hosts.env, ssh sockets,
# and the variables of the `make test` that started it (a nested make prints "Entering directory").
_NOT_INHERITED = ("GPU_PIVOT_HOSTS_FILE", "GPU_PIVOT_HOST", "XDG_RUNTIME_DIR", "XDG_CONFIG_HOME", "XDG_DATA_HOME",
                  "XDG_CACHE_HOME", "SSH_AUTH_SOCK", "ANSIBLE_CONFIG", "MAKEFLAGS", "MAKELEVEL", "MFLAGS",
                  "MAKEOVERRIDES", "MAKE_TERMERR", "MAKE_TERMOUT")


@pytest.fixture(scope="session", autouse=True)
def _isolated_state(tmp_path_factory):
    """Keep ssh sockets, audit logs and the sandbox of the test run in its own temp dirs, and
    nothing of the machine's gpu-pivot environment in the tests'."""
    base = tmp_path_factory.mktemp("state")
    saved = dict(os.environ)
    for key in _NOT_INHERITED:
        os.environ.pop(key, None)
    os.environ["GPU_PIVOT_CONTROL_DIR"] = str(base / "cm")
    os.environ["XDG_STATE_HOME"] = str(base / "xdg")
    os.environ["GPU_PIVOT_SANDBOX_DIR"] = str(base / "sandbox")
    os.environ["GPU_PIVOT_RUN_DIR"] = str(base / "run")
    os.environ["PATH"] = f"{VENV_BIN}:{os.environ['PATH']}"
    # an empty hosts file of the run's own: no test reads the checkout's hosts.env (the user's
    # hosts, beside tasks.py) unless it says so
    empty = base / "hosts.env"
    empty.write_text("")
    empty.chmod(0o600)
    os.environ["GPU_PIVOT_HOSTS_FILE"] = str(empty)
    yield base
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture(autouse=True)
def _private_state(tmp_path_factory):
    """State private to each test: the local agent's run dir (lock, last.json, audit log, phase
    state) and XDG state (the local audit log). The ssh control dir, the sandbox dir and the far
    side of the loopback sshd are the worker's: module-scoped fixtures start a sandbox or open
    ssh masters that its tests share (tests in one worker run one after another)."""
    base = tmp_path_factory.mktemp("st", numbered=True)
    saved = {k: os.environ.get(k) for k in ("GPU_PIVOT_RUN_DIR", "XDG_STATE_HOME")}
    os.environ["GPU_PIVOT_RUN_DIR"] = str(base / "run")
    os.environ["XDG_STATE_HOME"] = str(base / "xdg")
    yield base
    for key, value in saved.items():  # not monkeypatch: a test's own monkeypatch must be undone first
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


_STATE_SEEN: dict = {}


def _snapshot(path: str):
    """None for an absent path, else every entry under it with its size and mtime."""
    if not os.path.lexists(path):
        return None
    entries = []
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            st = os.lstat(os.path.join(root, name))
            entries.append((os.path.join(root, name), st.st_size, st.st_mtime_ns))
    return sorted(entries)


@pytest.fixture(autouse=True)
def _machine_state_untouched():
    """In a sandboxed worker (tests/support/pidns.py) the machine's gpu-pivot state is hidden: /run is
    the worker's own tmpfs, /var/lib/gpu-pivot and ~/.local/state/gpu-pivot are empty tmpfs (or
    absent). A test that writes there wrote where only a real operator may: it fails, naming
    the path, and what it wrote in the worker's own mounts is removed."""
    from tests.support import pidns

    paths = [p for p in os.environ.get(pidns.STATE_ENV, "").split(":") if p] if os.environ.get(pidns.ENV) else []
    for path in paths:
        _STATE_SEEN.setdefault(path, _snapshot(path))
    yield
    wrote = [path for path in paths if _snapshot(path) != _STATE_SEEN[path]]
    for path in wrote:
        if path.startswith("/run/"):
            subprocess.run(["rm", "-rf", "--one-file-system", "--", path])
        elif os.path.ismount(path):
            subprocess.run(["rm", "-rf", "--one-file-system", "--", *(os.path.join(path, n) for n in os.listdir(path))])
        _STATE_SEEN[path] = _snapshot(path)
    assert not wrote, f"the test wrote into the machine's gpu-pivot state: {', '.join(wrote)}"


def need_tools(*tools: str, why: str) -> None:
    """Skip when a tool is missing (the package that brings it could not be installed: `make
    test` installs .ci/packages first), saying which; under CI=true, where .ci/run installs them
    all, fail instead."""
    import shutil

    missing = [t for t in tools if not (shutil.which(t) or shutil.which(t, path="/usr/sbin:/sbin"))]
    if missing:
        reason = f"{why} needs {', '.join(missing)} (.ci/packages; `make system-deps` installs them)"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)


@pytest.fixture(scope="session")
def sshd(tmp_path_factory, _isolated_state):
    need_tools("sshd", "ssh", "ssh-keygen", why="the loopback sshd")
    # The far side's agent keeps last.json, its audit log and its lock in the test's dir.
    server = LoopbackSshd(tmp_path_factory.mktemp("sshd"),
                          env={"GPU_PIVOT_RUN_DIR": str(_isolated_state / "remote-run")}).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def noisy_sshd(tmp_path_factory, sshd):
    # a host as it comes: a MOTD, and OpenSSH's default key exchanges (the other servers offer a cheaper one)
    server = LoopbackSshd(tmp_path_factory.mktemp("noisy"), noise=MOTD, keys_from=sshd, kex=None).start()
    yield server
    server.stop()


@pytest.fixture
def hosts_env(tmp_path, monkeypatch):
    """Write a hosts.env and point GPU_PIVOT_HOSTS_FILE at it; returns the writer."""
    path = tmp_path / "hosts.env"

    def write(text: str) -> Path:
        path.write_text(text)
        monkeypatch.setenv("GPU_PIVOT_HOSTS_FILE", str(path))
        return path

    return write


def checkout_copy(dest: Path) -> Path:
    """A copy of this checkout's code (tasks.py, invoke.json, scripts/) at dest, readable by every
    user, with no hosts.env: what a fresh clone has, wherever this one sits (a 0700 home, a
    hosts.env beside tasks.py)."""
    import shutil

    dest.mkdir(parents=True, exist_ok=True)
    for name in ("tasks.py", "invoke.json"):
        if (REPO / name).exists():
            shutil.copy2(REPO / name, dest / name)
    shutil.copytree(REPO / "scripts", dest / "scripts", ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(["chmod", "-R", "a+rX", str(dest)], check=True)
    return dest


def invoke(*args, env=None, input=None, timeout=120) -> subprocess.CompletedProcess:
    """Run the real `invoke` CLI of this repo (`python -m invoke ARGS` in the checkout); bytes in,
    bytes out. Forked from an interpreter with Invoke imported (tests/support/cli_zygote.py says
    why and when it starts a real one instead)."""
    return cli_zygote.run_cli(args, REPO, env or os.environ.copy(), input, timeout)


def sandbox_session():
    """`yield from sandbox_session()` in a fixture: the sandbox up (its `sandbox up --json`
    document yielded), and down after; the fixture chooses its scope."""
    out = invoke("sandbox", "up", "--json")
    assert out.returncode == 0, out.stderr
    yield json.loads(out.stdout)
    invoke("sandbox", "down")


@pytest.fixture
def ps(tmp_path):
    """A set of processes the test starts in its own temp dir; ended by PID at the end."""
    procs = ProcessSet(tmp_path)
    yield procs
    procs.kill_all()


@pytest.fixture
def shared_ps():
    """A process set in a directory another user can read and open the devices in (a test's
    tmp_path is 0700): for the cases about a second user."""
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="gp-shared-", dir="/tmp"))
    os.chmod(base, 0o755)
    procs = ProcessSet(base)
    os.chmod(procs.devdir, 0o755)
    for f in procs.devdir.iterdir():
        os.chmod(f, 0o666)
    yield procs
    procs.kill_all()
    subprocess.run(["rm", "-rf", str(base)])


# -- fixtures the manager tests share (tests/support/managers_fixtures.py has the managers themselves) -----

@pytest.fixture
def podman(tmp_path):
    """A real podman of the test's own (its storage and run roots in tmp_path), ended after."""
    from tests.support.managers_fixtures import NoRuntime, podman_usable

    need_tools("podman", "conmon", why="a server in a real podman container")
    try:
        pm, why = podman_usable(tmp_path)
    except NoRuntime as exc:
        pytest.skip(str(exc))
    if pm is None:
        pytest.fail(f"podman cannot import a local image here: {why}")
    try:
        yield pm
    finally:
        pm.down()


@pytest.fixture
def layout():
    """Real cgroup directories under the test's own cgroup (managers_fixtures.CgroupLayout), removed after."""
    from tests.support.managers_fixtures import CgroupLayout

    made = CgroupLayout()
    try:
        yield made
    finally:
        made.down()


def pytest_unconfigure(config):
    cli_zygote.stop()  # the worker's CLI server (it also ends by itself when the worker is gone)
