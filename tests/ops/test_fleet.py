"""A teardown across several hosts: node sets, fanout, one line per host, a summary, the
worst exit code, and an unreachable host that does not stop the others."""
import pytest

from tests.conftest import invoke
from tests.support import scenario
from tests.support.fleet_faults import python_with_run_dir
from tests.support.procs import ProcessSet, alive


@pytest.fixture
def two_hosts(tmp_path, sshd):
    sets = [ProcessSet(tmp_path / f"h{i}") for i in (1, 2)]
    yield sets
    for ps in sets:
        ps.kill_all()


def test_fleet_teardown_with_an_unreachable_host(two_hosts, sshd, hosts_env):
    roles = []
    text = ""
    for i, ps in enumerate(two_hosts, 1):
        roles.append(scenario.start(ps, stubborn=False))
        # each "host" its own agent state dir (lock, last.json), as two machines would have
        py = python_with_run_dir(ps.base / "py", ps.base / "run")
        text += sshd.hosts_env(f"node{i}", extra=dict(scenario.host_keys(ps), PYTHON=str(py)))
    text += "NODE3_SSH=nobody@127.0.0.1\nNODE3_SSH_OPTS='-p 1 -o ConnectTimeout=3 -o ControlPath=none'\n"
    hosts_env(text)
    res = invoke("teardown", "--host", "node[1-3]", "--yes", "--fanout", "3", "--grace", "2")
    out = res.stdout.decode()
    assert res.returncode == 3, out + res.stderr.decode()
    assert "node1: freed" in out and "node2: freed" in out and "node3: UNREACHABLE" in out
    rows = out.split("Summary", 1)[1].strip("\n").splitlines()[2:]
    # a long result cell wraps onto indented lines of its own: a row starts near the margin
    assert [line.split()[0] for line in rows if line[:3].strip()] == ["node1", "node2", "node3"]
    for r in roles:
        assert not alive(r["server"]) and not alive(r["orphan"])
        assert alive(r["persistenced"]) and alive(r["monitor"]) and alive(r["unrelated"])


def test_each_failed_host_carries_its_kind_and_exit_code(sshd, hosts_env, tmp_path):
    """The fleet reads what each failure was from reach's errors, so a view need not: real
    calls through the loopback sshd: a closed port, a tarpit, a key the sshd never authorized,
    a host key nobody knows, an agent that gives no document; the answering host has none."""
    from scripts.agent.wire import codes
    from scripts.agent.wire.requests import Ping
    from scripts.config import hosts
    from scripts.ops.fleet import each_host
    from scripts.reach.transport import call_agent
    from tests.support.fleet_faults import Tarpit
    from tests.support.loopback_sshd import _keygen

    stranger = tmp_path / "stranger"
    _keygen(stranger)
    (tmp_path / "known_hosts").write_text("")
    tarpit = Tarpit()
    refused = sshd.ssh_opts.replace(str(sshd.client_key), str(stranger))
    opts = "-o ControlPath=none -o StrictHostKeyChecking=yes"
    hosts_env(sshd.hosts_env("ok", extra={"DEVICES": "/proc/gpu-pivot-none/nvidia*", "FAKE_DEVICES": "yes"})
              + f"SHUT_SSH=nobody@127.0.0.1\nSHUT_SSH_OPTS='-p 1 -o ConnectTimeout=3 {opts}'\n"
              + f"SLOW_SSH={sshd.dest()}\nSLOW_SSH_OPTS='-p {tarpit.port} -o ConnectTimeout=2 {opts} "
                f"-o UserKnownHostsFile={sshd.known_hosts}'\n"
              + f"REFUSED_SSH={sshd.dest()}\nREFUSED_SSH_OPTS='{refused}'\n"
              + f"UNKNOWN_SSH={sshd.dest()}\nUNKNOWN_SSH_OPTS='-p {sshd.port} -i {sshd.client_key} {opts} "
                f"-o UserKnownHostsFile={tmp_path / 'known_hosts'}'\n"
              + "MUTE_PYTHON=/bin/true\n")
    try:
        outcomes = each_host(hosts.select("ok,shut,slow,refused,unknown,mute"), lambda h: call_agent(h, Ping()), 6)
    finally:
        tarpit.close()
    got = {o.host.alias: o.failure and (o.failure.kind, o.failure.code) for o in outcomes}
    assert got == {"ok": None, "shut": ("unreachable", codes.EXIT_UNREACHABLE),
                   "slow": ("timed out", codes.EXIT_TIMED_OUT),
                   "refused": ("login refused", codes.EXIT_UNREACHABLE),
                   "unknown": ("host key", codes.EXIT_UNREACHABLE),
                   "mute": ("agent error", codes.EXIT_UNREACHABLE)}, [o.failure for o in outcomes]
    assert all(o.failure is None or o.failure.said == str(o.error) for o in outcomes)


def test_a_failure_no_code_documents_is_an_error_without_a_code():
    """A bug in the function a host runs is kept as that host's outcome, with no exit code: the
    task lets it end in a traceback instead of calling the host unreachable."""
    from scripts.ops.fleet import each_host

    def broken(host):
        raise ValueError(f"bug on {host}")

    outcomes = each_host(["a", "b"], broken, 2)
    assert [(o.failure.kind, o.failure.code, o.failure.said) for o in outcomes] == [
        ("error", None, "bug on a"), ("error", None, "bug on b")]
