"""Routes: exact strings, and hostile argv byte-exact through local, ssh, ssh -> pct."""
import subprocess

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from scripts.config.hostconfig import build_host
from scripts.config.route import PctHop, Route, SshHop
from scripts.reach.route import one_liner, wrap
from tests.support.hostile_argv import HOSTILE, expected, far_side

ARG = st.one_of(st.sampled_from(HOSTILE),
                st.text(alphabet=st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=20))
ARGV = st.lists(ARG, min_size=1, max_size=6)


def test_exact_ssh_then_pct_string():
    route = Route((SshHop("root@10.1.2.6"), PctHop("129")))
    line = one_liner(route, ["bash", "-c", 'nvidia-smi | grep "0MiB"'])
    assert line == """ssh root@10.1.2.6 'pct exec 129 -- bash -c '"'"'nvidia-smi | grep "0MiB"'"'"''"""


def test_exact_direct_ssh_and_local():
    assert one_liner(Route((SshHop("root@10.1.230.174", ("-p", "2222")),)), ["fuser", "-v", "/dev/nvidia0"]) == \
        "ssh -p 2222 root@10.1.230.174 'fuser -v /dev/nvidia0'"
    assert one_liner(Route(()), ["echo", "a b", "$x"]) == "echo 'a b' '$x'"
    assert wrap(Route((PctHop("129"),)), ["python3", "-", "ping"]) == \
        ["pct", "exec", "129", "--", "python3", "-", "ping"]


def test_wrap_adds_batchmode_and_control_socket_but_user_opts_first():
    argv = wrap(Route((SshHop("gpu1", ("-o", "ControlMaster=no")),)), ["true"])
    assert argv[:3] == ["ssh", "-o", "ControlMaster=no"]
    assert "BatchMode=yes" in argv and any(a.startswith("ControlPath=") for a in argv)
    assert not any("StrictHostKeyChecking=no" in a for a in argv)


@given(ARGV)
@settings(max_examples=60, deadline=None)
def test_local_roundtrip(argv):
    out = subprocess.run(wrap(Route(()), far_side(argv)), capture_output=True, check=True)
    assert out.stdout == expected(argv)


@pytest.fixture(scope="module")
def ssh_hosts(sshd):
    opts = sshd.ssh_opts
    keys = {"SSH": sshd.dest(), "SSH_OPTS": opts}
    return build_host("gpu1", keys, "test"), build_host("gpu2", dict(keys, CTID="129"), "test")


# Few examples over real ssh: each is two ssh connections (the local round trip above takes many);
# HOSTILE below is the fixed set every run sends.
@given(argv=ARGV)
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_ssh_and_pct_roundtrip(ssh_hosts, argv):
    for host in ssh_hosts:
        out = subprocess.run(wrap(host.route, far_side(argv)), capture_output=True)
        assert out.returncode == 0, out.stderr
        assert out.stdout == expected(argv)


@given(argv=ARGV)
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_pasted_one_liner_gives_same_bytes(ssh_hosts, argv):
    line = one_liner(ssh_hosts[1].route, far_side(argv))
    out = subprocess.run(["bash", "-c", line], capture_output=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout == expected(argv)


def test_pct_hop_really_taken(sshd, ssh_hosts):
    before = sshd.pct_log.read_text() if sshd.pct_log.exists() else ""
    subprocess.run(wrap(ssh_hosts[1].route, ["true"]), check=True)
    assert sshd.pct_log.read_text()[len(before):] == "129\n"


def test_bash_c_layer_inside_pct(ssh_hosts):
    """The deploy one-liner's third layer: a script for bash -c is one argument; its own args stay exact."""
    script = 'printf "%s\\0" "$0" "$@"'
    argv = ["bash", "-c", script, "it's", "$(id)", "a b"]
    out = subprocess.run(wrap(ssh_hosts[1].route, argv), capture_output=True, check=True)
    assert out.stdout == expected(["it's", "$(id)", "a b"])
