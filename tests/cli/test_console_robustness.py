"""The operator's console in an incident: it never hangs, never claims what did
not happen, and gives one line and a documented exit code instead of a traceback.

Real faults on loopback: a TCP tarpit (accepts, never speaks), a loopback sshd stopped with
SIGSTOP mid-call, HTTP servers that answer 500 or never answer, a remote command that exits
255 with no ControlMaster socket, a terminal that answers "n", Ctrl-C."""
from __future__ import annotations

import json
import os
import pty
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from scripts.agent.wire import codes, requests
from scripts.config.hostconfig import build_host
from scripts.config.route import SshHop
from scripts.reach.route import HostTimedOut, HostUnreachable
from scripts.reach.ssh import machine_opts
from scripts.reach.transport import AgentError, call_agent
from tests.conftest import REPO, invoke
from tests.support import fleet_faults
from tests.support.procs import alive, wait_for


def text_of(res) -> str:
    return res.stdout.decode() + res.stderr.decode()


# -- hangs: ssh defaults, deadlines, exit 7 ---------------------------------------------------

def test_ssh_gets_connect_and_keepalive_defaults_a_host_may_override():
    hop = SshHop("u@192.0.2.1", ("-o", "ConnectTimeout=30"))
    argv = ["ssh", *machine_opts(hop), "-G", hop.dest]
    seen = dict(line.split(" ", 1) for line in subprocess.run(argv, capture_output=True, text=True,
                                                               check=True).stdout.splitlines() if " " in line)
    assert seen["connecttimeout"] == "30"  # the host's own value wins (ssh keeps the first)
    assert seen["serveraliveinterval"] == "5" and seen["serveralivecountmax"] == "3"
    plain = SshHop("u@192.0.2.1")
    out = subprocess.run(["ssh", *machine_opts(plain), "-G", plain.dest], capture_output=True, text=True).stdout
    assert "connecttimeout 10" in out


def test_teardown_deadline_covers_its_waits():
    teardown = requests.Teardown(grace=30, timeout=60, wait_lock=5, settle=2)
    assert teardown.deadline_s() >= 30 + 2 * 60 + 5 + 2 + 30
    assert requests.Ping().deadline_s() < teardown.deadline_s()
    assert requests.PhaseReady(spec={"name": "x"}, wait=1800).deadline_s() > 1800


def test_tarpit_host_times_out_with_its_own_exit_code(sshd, hosts_env):
    pit = fleet_faults.Tarpit()
    try:
        hosts_env(f"GPU1_SSH={sshd.dest()}\nGPU1_SSH_OPTS='-p {pit.port} -o UserKnownHostsFile={sshd.known_hosts} "
                  "-o StrictHostKeyChecking=yes'\n")
        res = invoke("ping", "--host", "gpu1", "--timeout", "2")
    finally:
        pit.close()
    lines = res.stderr.decode().strip().splitlines()
    assert res.returncode == codes.EXIT_TIMED_OUT == 7, text_of(res)
    assert len(lines) == 1 and "gpu1: host timed out: no answer within 2s" in lines[0], lines
    assert "Traceback" not in text_of(res)  # the 2 s timeout's own words above: not a hang cut short


@pytest.mark.parametrize("how", ["deadline", "keepalive"])
def test_sshd_stopped_mid_call_times_out(own_sshd, ps, how):
    opts = "-o ControlPath=none" + (" -o ServerAliveInterval=1 -o ServerAliveCountMax=2" if how == "keepalive" else "")
    host = fleet_faults.gpu_host(own_sshd, opts=opts, **fleet_faults.held_devices(ps))
    caught: dict = {}
    progressing = threading.Event()

    # the deadline leaves room for ssh, the agent's start and its first progress on a loaded
    # 2-CPU machine (6 s did not, beside a 3,000-process run: the call timed out first)
    deadline = 10.0

    def call():
        try:
            call_agent(host, requests.Verify(wait=30), deadline_s=deadline if how == "deadline" else None,
                       on_progress=lambda fields: progressing.set())
        except Exception as exc:  # noqa: BLE001 (the test inspects it)
            caught["exc"] = exc

    worker = threading.Thread(target=call)
    worker.start()
    # mid-call: the agent's progress lines reach us, so it runs there (its proof line came first)
    assert progressing.wait(20), "the agent's progress never arrived"
    fleet_faults.stop_sshd(own_sshd)
    worker.join(60)
    exc = caught.get("exc")
    # what ended the call is named: the deadline, or 2 keep-alives 1 s apart (a verify left to its
    # --wait 30 would end in a verdict, not in HostTimedOut)
    assert not worker.is_alive() and isinstance(exc, HostTimedOut), repr(exc)
    if how == "deadline":
        assert "no answer within 10s; it had started on the host" in str(exc)
    else:
        assert "host timed out (ssh: Timeout, server" in str(exc) and "had started there" in str(exc)


def test_fleet_of_8_with_a_tarpit_and_a_stopped_sshd(sshd, tmp_path):
    # 9 s: the six good hosts answer within it on a loaded machine (their wall time, with the 4 s
    # of bench/RESULTS.md, is make bench's), and it ends before ssh's own ConnectTimeout (10 s)
    # would answer for the tarpit
    r = fleet_faults.fleet_run(sshd, tmp_path, timeout_s=9.0)
    assert r["rc"] == codes.EXIT_TIMED_OUT, r["text"]
    assert r["finished"] == [f"gpu{i}" for i in range(1, 7)], r["text"]
    assert "gpu-pivot: gpu7: host timed out" in r["text"] and "gpu-pivot: gpu8: host timed out" in r["text"]
    assert "gpu8: host timed out: no answer within 9s; it had started on the host" in r["text"]  # mid-call
    assert "gpu7: host timed out: no answer within 9s; no sign it started there" in r["text"]
    print(f"\nfleet of 8 (tarpit + stopped sshd): exit {r['rc']}, wall {r['wall_s']}s, finished {r['finished']}")


# -- 255: the remote command's, or ssh's -------------------------------------------------------

def test_remote_exit_255_is_not_unreachable_without_a_control_socket(sshd, hosts_env, tmp_path):
    hosts_env(f"GPU1_SSH={sshd.dest()}\nGPU1_SSH_OPTS='{sshd.ssh_opts} -o ControlPath=none'\n")
    res = invoke("run", "--host", "gpu1", "--", "sh", "-c", "echo out; echo err >&2; exit 255")
    assert res.returncode == 255, text_of(res)
    assert res.stdout == b"out\n" and res.stderr == b"err\n"  # the proof line is not shown
    fail = tmp_path / "exit255"
    fail.write_text("#!/bin/sh\necho agent died >&2\nexit 255\n")
    fail.chmod(0o755)
    with pytest.raises(AgentError, match="exited 255.*agent died"):
        call_agent(fleet_faults.gpu_host(sshd, opts="-o ControlPath=none", PYTHON=str(fail)), requests.Ping())


def test_unreachable_is_still_unreachable_without_a_control_socket(sshd, hosts_env):
    from tests.support.loopback_sshd import free_port

    hosts_env(f"GPU1_SSH={sshd.dest()}\nGPU1_SSH_OPTS='-p {free_port()} -o ControlPath=none'\n")
    res = invoke("run", "--host", "gpu1", "--", "true")
    assert res.returncode == codes.EXIT_UNREACHABLE, text_of(res)
    assert "gpu1: host unreachable" in res.stderr.decode()
    with pytest.raises(HostUnreachable, match="host unreachable"):
        call_agent(build_host("gpu1", {"SSH": sshd.dest(), "SSH_OPTS": f"-p {free_port()} -o ControlPath=none"},
                              "test"), requests.Ping())


def test_missing_command_is_127_and_one_line(hosts_env):
    hosts_env("")
    res = invoke("run", "--host", "local", "--", "no-such-command-gp11")
    assert res.returncode == 127, text_of(res)
    lines = res.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and "no-such-command-gp11" in lines[0] and "Traceback" not in text_of(res)


# -- drain, rollback, the verdict and the step table ------------------------------------------

class _Metrics(BaseHTTPRequestHandler):
    mode = "ok"

    def do_GET(self):
        if self.server.mode == "hang":  # type: ignore[attr-defined]
            time.sleep(30)
            return
        if self.server.mode == "500":  # type: ignore[attr-defined]
            self.send_response(500)
            self.end_headers()
            self.wfile.write(b"boom")
            return
        body = b'sglang:num_running_reqs{model_name="m"} 0\n'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


@pytest.fixture
def metrics():
    servers = []

    def start(mode: str) -> str:
        srv = ThreadingHTTPServer(("127.0.0.1", 0), _Metrics)
        srv.mode = mode  # type: ignore[attr-defined]
        srv.daemon_threads = True
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
        return f"http://127.0.0.1:{srv.server_address[1]}/metrics"

    yield start
    for srv in servers:
        srv.shutdown()
        srv.server_close()


def _local_phase(ps, hosts_env, **phase):
    keys = {"ARGV": json.dumps(["sleep", "30"]), "READY": "alive", "LINT": "off", "DRAIN_TIMEOUT": "2"}
    keys.update(phase)
    lines = [f"LOCAL_DEVICES='{ps.glob}'", "LOCAL_TARGETS='sandbox_roles\\.py'", "LOCAL_FAKE_DEVICES=yes",
             f"LOCAL_SCOPE='{ps.base}'"] + [f"LOCAL_PHASE_SERVE_{k}='{v}'" for k, v in keys.items()]
    hosts_env("\n".join(lines) + "\n")


@pytest.mark.parametrize("mode", ["500", "hang", "refused"])
def test_drain_error_stops_the_pivot_before_its_teardown(ps, hosts_env, metrics, mode):
    if mode == "refused":
        from tests.support.loopback_sshd import free_port
        url = f"http://127.0.0.1:{free_port()}/metrics"
    else:
        url = metrics(mode)
    server = ps.role("hold")  # what the teardown would stop
    _local_phase(ps, hosts_env, DRAIN_METRICS=url)
    res = invoke("pivot", "--host", "local", "--to", "serve", "--yes", "--settle", "0", "--json")
    doc = json.loads(res.stdout)
    assert res.returncode == codes.EXIT_GATE, text_of(res)
    assert [s["step"] for s in doc["steps"]] == ["drain"] and doc["steps"][0]["exit"] == codes.EXIT_FAILED
    assert "not drained" in doc["steps"][0]["result"] and doc["verdict"].startswith("not drained")
    assert doc["exit_code"] == codes.EXIT_GATE
    assert alive(server)  # nothing was torn down


def test_no_drain_goes_ahead_and_a_zero_reading_drains(ps, hosts_env, metrics):
    _local_phase(ps, hosts_env, DRAIN_METRICS=metrics("500"))
    res = invoke("pivot", "--host", "local", "--to", "serve", "--yes", "--settle", "0", "--no-drain")
    text = text_of(res)
    try:
        assert res.returncode == 0, text
        assert "drain: skipped (--no-drain)" in text
        assert re.search(r"^step\s+result\s+exit\s+seconds", text, re.M)  # the step table
        assert re.search(r"^drain\s+skipped \(--no-drain\)\s+0\s+\d+\.\d\d", text, re.M)
    finally:
        invoke("stop", "--host", "local", "--phase", "serve")
    _local_phase(ps, hosts_env, DRAIN_METRICS=metrics("ok"))
    res = invoke("pivot", "--host", "local", "--to", "serve", "--yes", "--settle", "0", "--json")
    try:
        doc = json.loads(res.stdout)
        assert res.returncode == 0, text_of(res)
        assert doc["steps"][0]["step"] == "drain" and doc["steps"][0]["result"].startswith("drained in")
        assert doc["verdict"] == "done" and all(s["exit"] == 0 for s in doc["steps"])
    finally:
        invoke("stop", "--host", "local", "--phase", "serve")


def test_a_failed_rollback_is_never_called_rolled_back(ps, hosts_env, tmp_path):
    from scripts.config.sandbox import ROLES
    from tests.support.loopback_sshd import free_port
    from tests.support.pivots import broken_deploy

    code, patch = broken_deploy(tmp_path)
    silent = free_port()  # READY points where nothing ever answers: neither new nor old server is ready
    argv = ["python3", str(ROLES), "server", "--devdir", str(ps.devdir), "--tp", "1", "--code-dir", str(code)]
    _local_phase(ps, hosts_env, ARGV=json.dumps(argv), DIR=str(code), PATCH=str(patch),
                 READY=f"http://127.0.0.1:{silent}/health", READY_TIMEOUT="1")
    res = invoke("pivot", "--host", "local", "--to", "serve", "--yes", "--settle", "0", "--json")
    try:
        doc = json.loads(res.stdout)
        assert res.returncode == codes.EXIT_FAILED, text_of(res)
        steps = {s["step"]: s for s in doc["steps"]}
        assert steps["rollback stop"]["exit"] == 0 and steps["rollback restore"]["exit"] == 0
        assert steps["rollback ready"]["exit"] != 0
        assert doc["verdict"].startswith("rollback FAILED at ready") and "rolled back" not in doc["verdict"]
        assert (code / "server_config.json").read_text() == '{"healthy": true}\n'
    finally:
        invoke("stop", "--host", "local", "--phase", "serve")


# -- exit codes: declined, Ctrl-C --------------------------------------------------------------

def test_declining_the_confirmation_is_its_own_exit_code(ps, hosts_env):
    server = ps.role("hold")
    hosts_env(f"LOCAL_DEVICES='{ps.glob}'\nLOCAL_TARGETS='sandbox_roles\\.py'\nLOCAL_FAKE_DEVICES=yes\n"
              f"LOCAL_SCOPE='{ps.base}'\n")
    pid, fd = pty.fork()
    if pid == 0:  # the child: invoke on a terminal
        os.chdir(REPO)
        os.execv(sys.executable, [sys.executable, "-m", "invoke", "teardown", "--host", "local", "--grace", "1"])
    out = b""
    deadline = time.monotonic() + 60
    answered = False
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
        if not answered and b"[y/N]" in out:
            os.write(fd, b"n\n")
            answered = True
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    assert answered, out.decode(errors="replace")
    assert os.waitstatus_to_exitcode(status) == codes.EXIT_DECLINED == 8, out.decode(errors="replace")
    assert b"declined: nothing was signalled" in out
    assert alive(server)


def test_a_cli_the_tests_start_takes_ctrl_c_as_a_terminal_gives_it():
    """However the suite was started (`make test &` in a script ignores SIGINT, and that stays
    across exec), a program a test starts gets SIGINT, SIGQUIT and SIGHUP at their defaults
    (conftest): else every Ctrl-C test below would wait for an exit 130 that never comes."""
    ignored = int(subprocess.run(["awk", "/^SigIgn:/ {print $2}", "/proc/self/status"], capture_output=True,
                                 text=True, timeout=30).stdout, 16)
    assert not ignored & (1 << (signal.SIGINT - 1) | 1 << (signal.SIGQUIT - 1) | 1 << (signal.SIGHUP - 1)), hex(ignored)


def test_ctrl_c_is_130_and_one_line(hosts_env):
    hosts_env("")
    proc = subprocess.Popen([sys.executable, "-m", "invoke", "run", "--host", "local", "--", "sleep", "30"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        wait_for(lambda: any(fleet_faults.comm(p) == "sleep" for p in fleet_faults.descendants(proc.pid)),
                 "the command to start", timeout=30)
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole foreground group
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, (out, err)
    lines = err.decode().strip().splitlines()
    assert len(lines) == 1 and "interrupted" in lines[0] and "Traceback" not in err.decode()


# -- the sandbox: a failed start, a directory removed by hand ---------------------------------

@pytest.fixture
def own_sandbox(tmp_path, monkeypatch):
    monkeypatch.setenv("GPU_PIVOT_SANDBOX_DIR", str(tmp_path / "sb"))
    from scripts.ops import sandbox
    yield tmp_path / "sb"
    sandbox.down()


def test_failed_sandbox_up_is_one_line_with_stderr_and_leaves_nothing(own_sandbox, monkeypatch):
    from scripts.ops import sandbox
    from scripts.ops.sandbox_procs import SandboxStartError, members

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        monkeypatch.setattr(sandbox, "free_port", lambda: taken)  # the server's port is taken when it binds
        with pytest.raises(SandboxStartError) as info:
            sandbox.up()
    line = str(info.value)
    assert "\n" not in line and "did not start" in line and "Address already in use" in line
    assert members(own_sandbox) == []  # the server's workers went with it (its whole process group)
    from scripts.cli.common import code_for
    assert code_for(info.value) == codes.EXIT_FAILED


def test_sandbox_down_finds_its_processes_after_the_directory_is_removed(tmp_path):
    env = dict(os.environ, GPU_PIVOT_SANDBOX_DIR=str(tmp_path / "sb"))
    assert invoke("sandbox", "up", env=env).returncode == 0
    state = json.loads(invoke("sandbox", "status", "--json", env=env).stdout)
    pids = [p["pid"] for p in state["processes"].values()]
    assert len(pids) == 6 and all(alive(p) for p in pids)
    shutil.rmtree(tmp_path / "sb")
    res = invoke("sandbox", "down", env=env)
    assert res.returncode == 0, text_of(res)
    for pid in pids:
        wait_for(lambda pid=pid: not alive(pid), f"sandbox process {pid} to be gone", timeout=10)


def test_sandbox_ports_are_picked_free_and_recorded(tmp_path):
    env = dict(os.environ, GPU_PIVOT_SANDBOX_DIR=str(tmp_path / "sb"))
    held = []
    for port in (30000, 30001):  # the old fixed ports, held by someone else
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", port))
            s.listen()
            held.append(s)
        except OSError:
            s.close()  # already held by something else: just as good
    try:
        res = invoke("sandbox", "up", env=env)
        assert res.returncode == 0, text_of(res)
        ports = json.loads(invoke("sandbox", "status", "--json", env=env).stdout)["ports"]
        assert ports["server"] not in (30000, 30001) and ports["datagen"] not in (30000, 30001)
        import urllib.request
        with urllib.request.urlopen(f"http://127.0.0.1:{ports['server']}/metrics", timeout=5) as r:
            assert b"sglang:num_running_reqs" in r.read()
        hosts = json.loads(invoke("pivot", "--host", "sandbox", "--to", "datagen", "--dry-run", "--json",
                                  env=env).stdout)
        assert f"127.0.0.1:{ports['server']}/metrics" in json.dumps(hosts)
    finally:
        invoke("sandbox", "down", env=env)
        for s in held:
            s.close()


# -- gates: the kind is the JSON type ----------------------------------------------------------

def test_a_gate_that_is_a_shell_group_runs_as_a_command(tmp_path):
    gates = json.dumps(["{ test -d /; }", {"glob": str(tmp_path / "*.pt"), "min": 0}, "{ false; }"])
    host = build_host("local", {}, "test")
    from scripts.config.phases import build_phase
    from scripts.ops import phase as phase_ops
    phase = build_phase("local", "train", {"CMD": "true", "GATES": gates})
    r = phase_ops.gates(host, phase)
    got = [(g["gate"], g["ok"]) for g in r.result.gates]
    assert got == [("{ test -d /; }", True), (f"at least 0 files match {tmp_path / '*.pt'}", True),
                   ("{ false; }", False)]
    assert r.code == codes.EXIT_GATE


# -- config lookup ----------------------------------------------------------------------------

def test_hosts_file_lookup_order(tmp_path, monkeypatch):
    from scripts.config import hostconfig
    from tests.conftest import checkout_copy

    assert hostconfig.REPO_HOSTS_FILE == REPO / "hosts.env"  # the real path, beside tasks.py
    clone = checkout_copy(tmp_path / "repo")
    beside = clone / "hosts.env"
    beside.write_text("GPU1_SSH=root@192.0.2.10\n")
    beside.chmod(0o600)
    (clone / "runbooks").mkdir()
    env = {k: v for k, v in os.environ.items() if k != "GPU_PIVOT_HOSTS_FILE"}
    # an operator in runbooks/, where Invoke still finds tasks.py: the clone's own code resolves it
    out = subprocess.run([sys.executable, "-m", "invoke", "hosts", "--names"], cwd=clone / "runbooks", env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "gpu1" in out.stdout.split(), out
    monkeypatch.delenv("GPU_PIVOT_HOSTS_FILE", raising=False)
    other = tmp_path / "other.env"
    other.write_text("GPU2_SSH=root@192.0.2.11\n")
    monkeypatch.setenv("GPU_PIVOT_HOSTS_FILE", str(other))
    assert set(hostconfig.load_hosts()) >= {"gpu2"} and "gpu1" not in hostconfig.load_hosts()
    monkeypatch.delenv("GPU_PIVOT_HOSTS_FILE")
    monkeypatch.setattr(hostconfig, "REPO_HOSTS_FILE", tmp_path / "absent" / "hosts.env")
    monkeypatch.chdir(tmp_path / "repo")
    assert hostconfig.hosts_file() == Path("hosts.env") and "gpu1" in hostconfig.load_hosts()


def test_new_exit_codes_are_documented():
    """In the docs' words, and in the --help of a task that gives them, from the one table."""
    readme = " ".join((REPO / "docs" / "verdicts-and-exit-codes.md").read_text().split())
    shown = " ".join(invoke("pivot", "-h").stdout.decode().split())
    for code, name in ((codes.EXIT_TIMED_OUT, "timed out"), (codes.EXIT_DECLINED, "answered no")):
        assert f"{code} the" in readme and name in readme
        meaning = next(words for number, _, words in codes.EXIT_CODES if number == code)
        assert f"{code} {meaning}" in shown
    assert "--no-drain" in (REPO / "docs" / "pivots.md").read_text()
    assert "GPU_PIVOT_HOSTS_FILE`, else `hosts.env`" in (REPO / "docs" / "hosts-env.md").read_text()
