"""A teardown across several hosts: node sets, fanout, one line per host, a summary, the
worst exit code, and an unreachable host that does not stop the others."""
import pytest

from tests import scenario
from tests.conftest import invoke
from tests.procs import ProcessSet, alive


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
        text += sshd.hosts_env(f"node{i}", extra=scenario.host_keys(ps))
    text += "NODE3_SSH=nobody@127.0.0.1\nNODE3_SSH_OPTS='-p 1 -o ConnectTimeout=3 -o ControlPath=none'\n"
    hosts_env(text)
    # node1 and node2 are two aliases of this machine (one sshd, one state dir): one lock, so
    # the second waits for the first (--wait-lock), as two teardowns of one host must
    res = invoke("teardown", "--host", "node[1-3]", "--yes", "--fanout", "3", "--grace", "2", "--wait-lock", "30")
    out = res.stdout.decode()
    assert res.returncode == 3, out + res.stderr.decode()
    assert "node1: freed" in out and "node2: freed" in out and "node3: UNREACHABLE" in out
    summary = out.split("Summary", 1)[1]
    assert [line.split()[0] for line in summary.strip().splitlines()[2:]] == ["node1", "node2", "node3"]
    for r in roles:
        assert not alive(r["server"]) and not alive(r["orphan"])
        assert alive(r["persistenced"]) and alive(r["monitor"]) and alive(r["unrelated"])
