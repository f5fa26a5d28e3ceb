"""A login the host refuses (`Permission denied (publickey)`) has its own words, never "host
unreachable": the host answered and refused the user and key gpu-pivot tried. The line names
both, the hosts.env keys that set them and the `ssh-copy-id` that authorizes the key. Exit 3,
as a refused host key and sudo's refusal: nothing ran there (README, exit codes).

Real: the loopback sshd, with a key made here that it was never told about.
"""
from __future__ import annotations

import json
import os

from scripts.agent.wire import codes
from tests.conftest import invoke
from tests.support.loopback_sshd import _keygen


def _stranger_key(sshd, tmp_path):
    """hosts.env options for the sshd with a key of this test's own, which it does not authorize."""
    key = tmp_path / "not-authorized"
    _keygen(key)
    return key, sshd.ssh_opts.replace(f"-i {sshd.client_key}", f"-i {key}")


def test_a_refused_key_says_login_refused_naming_user_key_and_fix(sshd, hosts_env, tmp_path, monkeypatch):
    monkeypatch.setenv("GPU_PIVOT_CONTROL_DIR", str(tmp_path / "cm"))
    key, opts = _stranger_key(sshd, tmp_path)
    hosts_env(f"GPU7_SSH={sshd.dest()}\nGPU7_SSH_OPTS='{opts}'\n")
    res = invoke("ping", "--host", "gpu7")
    lines = res.stderr.decode().splitlines()
    assert res.returncode == codes.EXIT_UNREACHABLE, lines
    assert len(lines) == 1, lines
    line = lines[0]
    user = sshd.dest().split("@")[0]
    assert line.startswith(f"gpu-pivot: gpu7: login refused: 127.0.0.1 answered, and refused the login of {user} "
                           f"with key {key} "), line
    assert "unreachable" not in line, line
    assert "Permission denied (publickey)" in line, line
    assert "GPU7_SSH=USER@HOST" in line and "GPU7_SSH_OPTS='-i KEY'" in line, line
    assert f"ssh-copy-id -i {key} -p {sshd.port} {sshd.dest()}" in line, line
    assert "nothing ran there" in line, line
    print(line)


def test_a_fleet_names_the_refused_login_in_its_summary_and_json(sshd, hosts_env, tmp_path, monkeypatch):
    """gpu1 logs in, gpu7 (the same sshd, a key it does not know) is refused: the summary row
    and the JSON document say login refused; the fleet's code is 3."""
    monkeypatch.setenv("GPU_PIVOT_CONTROL_DIR", str(tmp_path / "cm"))
    _key, opts = _stranger_key(sshd, tmp_path)
    hosts_env(sshd.hosts_env("gpu1", extra={"DEVICES": "/proc/gpu-pivot-none/nvidia*", "FAKE_DEVICES": "yes"})
              + f"GPU7_SSH={sshd.dest()}\nGPU7_SSH_OPTS='{opts}'\n")
    res = invoke("status", "--host", "gpu1,gpu7", "--brief", env=dict(os.environ, COLUMNS="200"))
    text = res.stdout.decode()
    assert res.returncode == codes.EXIT_UNREACHABLE, text + res.stderr.decode()
    row = next(line for line in text.splitlines() if line.startswith("gpu7 "))
    assert row.split()[3:7] == ["3", "LOGIN", "REFUSED:", "login"], row  # its exit column, then its verdict
    assert "LOGIN REFUSED: login refused: 127.0.0.1 answered" in row, text
    assert "UNREACHABLE" not in row, row
    doc = json.loads(invoke("status", "--host", "gpu1,gpu7", "--json").stdout)
    assert doc["gpu7"]["exit_code"] == codes.EXIT_UNREACHABLE
    assert doc["gpu7"]["error"].startswith("gpu7: login refused: 127.0.0.1 answered"), doc["gpu7"]
    assert "exit_code" in doc["gpu1"] and "error" not in doc["gpu1"], doc["gpu1"]


def test_the_user_and_key_come_from_ssh_and_the_hosts_options():
    """ssh names the user it tried; the key comes from -i or -o IdentityFile (else ssh's own
    defaults); the port for ssh-copy-id from -p or -o Port. A server that hung up on too many
    keys is a refused login too; ssh's other failures stay unreachable."""
    from scripts.config.route import SshHop
    from scripts.reach.route import LoginRefused, unreachable

    hop = SshHop("gpu.example", ("-o", "IdentityFile=/keys/ops", "-oPort=2200"))
    err = unreachable("gpu3", "ops@gpu.example: Permission denied (publickey,password).\n", hop=hop)
    assert isinstance(err, LoginRefused), err
    assert str(err).startswith("gpu3: login refused: gpu.example answered, and refused the login of ops with key "
                               "/keys/ops (ssh: ops@gpu.example: Permission denied (publickey,password).)"), err
    assert str(err).endswith("ssh-copy-id -i /keys/ops -p 2200 gpu.example"), err
    err = unreachable("gpu3", "Received disconnect from 10.0.0.3 port 22:2: Too many authentication failures\n",
                      hop=SshHop("root@gpu.example"))
    assert isinstance(err, LoginRefused) and "of root with ssh's default keys" in str(err), err
    assert str(err).endswith("ssh-copy-id root@gpu.example"), err
    err = unreachable("gpu3", "ssh: connect to host gpu.example port 22: Connection refused\n", hop=hop)
    assert not isinstance(err, LoginRefused) and "host unreachable" in str(err), err
