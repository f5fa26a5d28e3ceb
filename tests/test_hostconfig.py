"""hosts.env validation: every bad value is one line naming key and value, exit 2, no ssh."""
import os
import stat

import pytest

from scripts.hostconfig import ConfigError, load_hosts, select_hosts
from tests.conftest import invoke

BAD = [
    ("GPU1_SSH='root@host;rm -rf /'", "GPU1_SSH"),
    ("GPU1_SSH='root@host name'", "GPU1_SSH"),
    ("GPU1_SSH=-oProxyCommand=evil", "GPU1_SSH"),
    ("GPU1_SSH='$(reboot)'", "GPU1_SSH"),
    ("GPU1_SSH=root@h\nGPU1_CTID=12a", "GPU1_CTID"),
    ("GPU1_SSH=root@h\nGPU1_CTID=42", "GPU1_CTID"),
    ("GPU1_SSH=root@h\nGPU1_SSH_OPTS='-p \"2222'", "GPU1_SSH_OPTS"),
    ("GPU1_SSH=root@h\nGPU1_PYTHON='python3; id'", "GPU1_PYTHON"),
    ("GPU1_SSH=root@h\nGPU1_DEVICES=dev/nvidia*", "GPU1_DEVICES"),
    ("GPU1_SSH=root@h\nGPU1_TARGETS='sglang(('", "GPU1_TARGETS"),
    ("GPU1_SHH=root@h", "GPU1_SHH"),
    ("LOCAL_SSH=root@h", "LOCAL_SSH"),
]


@pytest.mark.parametrize("text,key", BAD)
def test_bad_value_is_rejected_naming_key(hosts_env, text, key):
    hosts_env(text + "\n")
    with pytest.raises(ConfigError) as err:
        load_hosts()
    assert key in str(err.value)
    assert "\n" not in str(err.value)


def test_good_file_builds_both_seed_shapes(hosts_env):
    hosts_env("GPU1_SSH=root@10.1.230.174\n"
              "GPU2_SSH=root@10.1.2.6\nGPU2_CTID=129\nGPU2_SSH_OPTS='-p 2222 -i /k'\nGPU2_PYTHON=/opt/venv/bin/python3\n")
    hosts = load_hosts()
    assert hosts["gpu1"].route.describe() == "ssh root@10.1.230.174"
    assert hosts["gpu2"].route.describe() == "ssh -p 2222 -i /k root@10.1.2.6 -> pct exec 129"
    assert hosts["gpu2"].python == "/opt/venv/bin/python3"
    assert hosts["local"].route.hops == ()
    assert hosts["sandbox"].sandbox


def test_local_overrides_and_unknown_alias(hosts_env):
    hosts_env("LOCAL_DEVICES=/tmp/x/nvidia*\n")
    hosts = load_hosts()
    assert hosts["local"].devices == "/tmp/x/nvidia*"
    with pytest.raises(ConfigError, match="unknown host alias 'gpu9'"):
        select_hosts("local,gpu9", hosts)


def test_node_set_expansion(hosts_env):
    hosts_env("".join(f"GPU{i:02d}_SSH=root@10.0.0.{i}\n" for i in range(1, 17)) + "BIG1_SSH=root@big\n")
    hosts = load_hosts()
    names = [h.alias for h in select_hosts("gpu[01-16],big1", hosts)]
    assert names == [f"gpu{i:02d}" for i in range(1, 17)] + ["big1"]
    with pytest.raises(ConfigError, match="bad node set"):
        select_hosts("gpu[3-", hosts)


@pytest.fixture
def ssh_spy(tmp_path):
    """An `ssh` first on PATH that only records that it was started."""
    bindir = tmp_path / "spybin"
    bindir.mkdir()
    marker = tmp_path / "ssh-was-started"
    spy = bindir / "ssh"
    spy.write_text(f"#!/bin/sh\ntouch {marker}\nexit 255\n")
    spy.chmod(spy.stat().st_mode | stat.S_IEXEC)
    env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}")
    return env, marker


@pytest.mark.parametrize("task", [["ping"], ["run", "--", "true"], ["hosts"]])
def test_cli_bad_file_one_line_exit2_no_ssh(hosts_env, ssh_spy, task):
    env, marker = ssh_spy
    path = hosts_env("GPU1_SSH=root@10.0.0.1\nGPU1_CTID=abc\n")
    env["GPU_PIVOT_HOSTS_FILE"] = str(path)
    args = task[:1] + (["--host", "gpu1"] if task[0] != "hosts" else []) + task[1:]
    out = invoke(*args, env=env)
    assert out.returncode == 2
    lines = out.stderr.decode().strip().splitlines()
    assert lines == ["gpu-pivot: GPU1_CTID='abc': a Proxmox container id is a number of 100 or more"]
    assert not marker.exists()


def test_cli_unknown_alias_exit2_no_ssh(hosts_env, ssh_spy):
    env, marker = ssh_spy
    env["GPU_PIVOT_HOSTS_FILE"] = str(hosts_env("GPU1_SSH=root@10.0.0.1\n"))
    out = invoke("ping", "--host", "gpu1,gpu2", env=env)
    assert out.returncode == 2
    assert b"unknown host alias 'gpu2'" in out.stderr
    assert not marker.exists()
