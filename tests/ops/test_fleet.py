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
