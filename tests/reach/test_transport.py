"""Agent transport: one round trip, noise ignored, each failure its own clear error."""
import ast
import json
import subprocess

import pytest

from scripts.agent.wire import defaults, frame
from scripts.agent.wire.requests import Ping
from scripts.config.hostconfig import build_host
from scripts.reach import bundle
from scripts.reach.route import HostUnreachable, wrap
from scripts.reach.transport import AgentError, call_agent
from tests.conftest import REPO, invoke
from tests.support.loopback_sshd import free_port

STANDIN = REPO / "tests" / "support" / "standin"


def host_for(server, alias="gpu1", **extra):
    keys = {"SSH": server.dest(), "SSH_OPTS": server.ssh_opts}
    keys.update(extra)
    return build_host(alias, keys, "test")


def test_agent_sources_parse_as_python38():
    for name, src in bundle.agent_sources().items():
        ast.parse(src, filename=name, feature_version=(3, 8))


def test_direct_run_prints_json():
    out = subprocess.run(["python3", str(REPO / "scripts" / "gpuagent.py"), "ping", "--json"], capture_output=True,
                         check=True)
    doc = json.loads(out.stdout)
    assert doc["command"] == "ping" and doc["pid"] > 0


def test_ping_through_ssh_and_pct(sshd):
    for host in (host_for(sshd), host_for(sshd, "gpu2", CTID="129")):
        result = call_agent(host, Ping())
        assert result.code == 0
        assert result.doc["command"] == "ping"
        assert result.doc["python"].startswith("3.")


def test_motd_noise_and_fake_marker_ignored(noisy_sshd):
    probe = subprocess.run(wrap(host_for(noisy_sshd).route, ["true"]), capture_output=True)
    assert b"MOTD noise" in probe.stdout  # the noise is really there
    result = call_agent(host_for(noisy_sshd), Ping())
    assert result.doc["command"] == "ping"


def test_missing_markers(sshd):
    with pytest.raises(AgentError, match="no result marker.*exited 0"):
        call_agent(host_for(sshd, PYTHON="/bin/true"), Ping())


def test_remote_nonzero_exit_without_result(sshd):
    with pytest.raises(AgentError, match="exited 127.*not-a-python"):
        call_agent(host_for(sshd, PYTHON="not-a-python"), Ping())


def test_broken_json(sshd):
    with pytest.raises(AgentError, match="not valid JSON"):
        call_agent(host_for(sshd, PYTHON=str(STANDIN / "bad-json-agent")), Ping())


def test_ssh_255_is_host_unreachable(sshd):
    closed = free_port()
    host = build_host("gpu9", {"SSH": sshd.dest(), "SSH_OPTS": f"-p {closed} -o ConnectTimeout=3"}, "test")
    with pytest.raises(HostUnreachable, match="gpu9: host unreachable"):
        call_agent(host, Ping())


def test_cut_off_result_is_reported():
    text = "noise\n" + frame.begin("n1") + "\n{}\n"
    with pytest.raises(frame.MarkerError, match="cut off"):
        frame.extract(text, "n1")
    assert frame.extract("x\n" + frame.begin("n1") + "\n{}\n" + frame.end("n1") + "\n", "n1") == "{}"


def test_one_connection_per_ping(sshd, hosts_env):
    """Without a ControlMaster a ping opens exactly one ssh connection and one session."""
    hosts_env(f"GPU1_SSH={sshd.dest()}\nGPU1_SSH_OPTS='{sshd.ssh_opts} -o ControlPath=none'\n")
    before = sshd.connections()
    sessions = sshd.log.read_text().count("Starting session")
    out = invoke("ping", "--host", "gpu1")
    assert out.returncode == 0, out.stderr
    assert sshd.connections() - before == 1
    assert sshd.log.read_text().count("Starting session") - sessions == 1


def test_control_master_reuses_one_connection(sshd, hosts_env, tmp_path, monkeypatch):
    monkeypatch.setenv("GPU_PIVOT_CONTROL_DIR", str(tmp_path / "cm"))
    hosts_env(f"GPU1_SSH={sshd.dest()}\nGPU1_SSH_OPTS='{sshd.ssh_opts}'\n")
    before = sshd.connections()
    for _ in range(3):
        assert invoke("ping", "--host", "gpu1").returncode == 0
    assert invoke("run", "--host", "gpu1", "--", "true").returncode == 0
    assert sshd.connections() - before == 1
    from scripts.reach.ssh import control_path
    socket = control_path(sshd.dest(), sshd.ssh_opts.split())
    subprocess.run(["ssh", *sshd.ssh_opts.split(), "-o", f"ControlPath={socket}", "-O", "exit", sshd.dest()],
                   capture_output=True)


def test_a_teardown_request_builds_one_argv_and_reads_its_deadline_from_its_fields():
    """The CLI, a pivot, the Slurm epilog and the Ansible module send a requests.Teardown: its
    argv is the agent's flags, and its deadline comes from the fields, its checkpoint stops'
    included."""
    from scripts.agent.wire.requests import Teardown

    plain = Teardown()
    assert plain.argv() == ["--grace", plain.grace, "--timeout", plain.timeout, "--max-used-mib", 0]
    full = Teardown(grace=30, timeout=60, settle=2, wait_lock=5, max_used_mib=10, operator="me",
                           match=("-x", "vllm"), only_matching=True, disable=True, stop_starters=True,
                           mps_quit=True, approved="12:34")
    argv = full.argv()
    assert argv[:5] == ["--match=-x", "--match=vllm", "--only-matching", "--disable", "--stop-starters"]
    assert full.selection() == argv[:5] == full.plan().argv()
    assert argv[argv.index("--approved") + 1] == "12:34" and argv[argv.index("--mps") + 1] == "quit"
    assert full.deadline_s() == 60 + 30 + 2 * 60 + 5 + 2 + defaults.MPS_QUIT_TIMEOUT_S
    stopped = full.replace(checkpoint_stops=({"phase": "train", "deadline_s": 600.0},))
    assert stopped.deadline_s() == full.deadline_s() + 600 and stopped.plan().checkpoint_stops
    assert full.approved == "12:34" and stopped != full  # replace: a changed copy, the original kept


@pytest.mark.parametrize("pidfd", [True, False], ids=["pidfd", "popen-wait"])
def test_the_wait_for_a_command_gives_its_code_and_stops_at_the_deadline(monkeypatch, pidfd):
    """runner.wait_exit: woken by the exit through a pidfd (Popen's own wait polls, up to 50 ms
    late); where no pidfd can be opened, Popen's wait. Either way: the exit code, and at the
    deadline TimeoutExpired with the process left running for the caller to kill."""
    import os

    from scripts.reach import runner

    if not pidfd:
        def refused(pid):
            raise OSError("no pidfd")
        monkeypatch.setattr(os, "pidfd_open", refused)
    done = subprocess.Popen(["sh", "-c", "exit 3"])
    assert runner.wait_exit(done, 30) == 3
    slow = subprocess.Popen(["sleep", "30"])
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            runner.wait_exit(slow, 0.2)
        assert slow.poll() is None
    finally:
        slow.kill()
        slow.wait()
    assert runner.wait_exit(slow, 1) == -9  # already reaped: its code again


def test_the_wait_for_a_command_works_with_fds_numbered_past_fd_setsize(tmp_path):
    """A fleet's CLI may hold over 1024 fds (each host's pipes, files and ssh log): the wait
    still ends with the exit code, and at the deadline with the command killed (seen:
    select() refused the pidfd, raised, and left the command running with no deadline)."""
    import os

    from scripts.config.route import Route
    from scripts.reach import runner

    held = []
    try:
        while len(held) < 1100:
            held.append(os.open("/dev/null", os.O_RDONLY))
        assert runner.wait_exit(subprocess.Popen(["sh", "-c", "exit 3"]), 30) == 3
        pidfile = tmp_path / "pid"
        done = runner.run(Route(), ["sh", "-c", 'echo $$ > "$1"; exec sleep 30', "x", str(pidfile)], "n",
                          runner.How(capture=True, deadline_s=1.0))
        assert done.cut_off  # the 1 s deadline ended it, not the sleep's own 30 s
        assert not os.path.exists(f"/proc/{pidfile.read_text().strip()}/fd"), "the command outlived its deadline"
    finally:
        for fd in held:
            os.close(fd)


def test_keep_shm_reaches_the_agent_from_the_task():
    """`invoke teardown --keep-shm` asks the agent to keep the targets' shared-memory leftovers."""
    from scripts.agent.wire.requests import Teardown
    from scripts.cli import teardown_args as td

    assert "--keep-shm" in Teardown(keep_shm=True).argv()
    assert "--keep-shm" not in Teardown().argv()
    assert "--keep-shm" in td.request(keep_shm=True).argv()
