"""A Proxmox-like node with a real LXC container: the routes users take, and a teardown from
the node that finds the container's processes and stops its unit through `pct exec`.

Why real: `pct exec` is `lxc-attach`, which passes argv with no shell; from the node a
container's process has two pids and a cgroup under /lxc/CTID/, and the unit that owns it
belongs to the container's systemd (tests/support/realhosts/pve_node.py)."""
from __future__ import annotations

import subprocess

import pytest

from scripts.config.hostconfig import build_host
from scripts.reach.route import one_liner, wrap
from tests.support.hostile_argv import HOSTILE, expected, far_side
from tests.support.realhosts.pve_node import CTID, PveNode
from tests.support.realhosts.session import hosted, invoke, text, wait_for

VLLM_UNIT = """[Unit]
Description=vLLM server inside the container
[Service]
ExecStart=/srv/bin/vllm serve /models/llama --workers 1
Restart=always
RestartSec=1
"""


@pytest.fixture(scope="session")
def node(tmp_path_factory):
    with hosted(PveNode(tmp_path_factory.mktemp("pve-node"), ct_units={"vllm.service": VLLM_UNIT}),
                tools=("lxc-start", "lxc-attach")) as host:
        wait_for(host.ct_ready, timeout=120, what=f"CT {CTID}'s systemd to say running or degraded "
                 f"(`lxc-attach -n {CTID} -- systemctl is-system-running`; lxc@{CTID}.service on the node)")
        yield host


def routes(node):
    keys = {"SSH": "root@127.0.0.1", "SSH_OPTS": node.ssh_opts}
    return {"ssh node pct exec": build_host("viapct", dict(keys, CTID=CTID), "test"),
            "ssh into the container": build_host("direct", dict(keys, SSH_OPTS=node.ct_ssh_opts), "test")}


def test_both_routes_pass_hostile_argv_byte_exact(node):
    for name, host in routes(node).items():
        out = subprocess.run(wrap(host.route, ["sh", "-c", 'hostname; printf "%s\\0" "$@"', "sh", *HOSTILE]),
                             capture_output=True, timeout=30)
        assert out.returncode == 0, (name, out.stderr)
        first, _, rest = out.stdout.partition(b"\n")
        assert first == f"ct{CTID}".encode(), (name, out.stdout)  # it ran inside the container
        assert rest == expected(HOSTILE), name
        line = one_liner(host.route, far_side(HOSTILE))  # and the line a person pastes
        pasted = subprocess.run(["bash", "-c", line], capture_output=True, timeout=30)
        assert pasted.stdout == expected(HOSTILE), (name, pasted.stderr)


def test_pct_refuses_a_stopped_or_unknown_ct(node):
    out = subprocess.run(node.ssh_argv("pct", "exec", "999", "--", "true"), capture_output=True, text=True)
    assert out.returncode == 255 and "CT 999 not running" in out.stderr


def node_holders(node) -> list[str]:
    return node.sh("fuser /dev/nvidia0 /dev/nvidia1 2>/dev/null").stdout.split()


def test_teardown_from_the_node_finds_ct_processes_and_stops_the_ct_unit(node, hosts_env):
    node.ct_sh("systemctl start vllm.service", check=True)
    node.ct_sh("setsid -f /srv/bin/gpu-holder --loose </dev/null >/dev/null 2>&1", check=True)
    wait_for(lambda: len(node_holders(node)) >= 6, what="the unit's server, its worker and the loose job holding")
    ct_pid = int(node.ct_sh("pgrep -f 'gpu-holder --loose'").stdout.split()[0])
    node_pid = int(node.sh("pgrep -f 'gpu-holder --loose'").stdout.split()[0])
    assert ct_pid != node_pid
    hosts_env(node.hosts_env("node"))
    plan = invoke("plan", "--host", "node")
    out = text(plan)
    assert plan.returncode == 0, out
    assert f"ct {CTID} pid {ct_pid} (node pid {node_pid})" in out, out
    assert "unit vllm.service will be stopped with pct exec 129 -- systemctl" in out, out
    res = invoke("teardown", "--host", "node", "--yes", "--grace", "5", "--settle", "1.5")
    out = text(res)
    assert res.returncode == 0, out
    assert f"pct exec {CTID} -- systemctl stop vllm.service" in out, out
    assert node.ct_sh("systemctl is-active vllm.service").stdout.strip() == "inactive"
    assert node.ct_sh("systemctl show -p NRestarts --value vllm.service").stdout.strip() == "0"
    assert node_holders(node) == []
