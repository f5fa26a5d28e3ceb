"""The inventory gives Ansible a host's ssh options as ssh itself reads them (the one parser,
config/sshopts.options): a port or key written joined (`-p2222`) or clustered (`-Cp 2222`)
is still the port or key, never an option handed to sftp and scp, whose -p means something
else (preserve times), so Ansible would reach another port than gpu-pivot does."""
from __future__ import annotations

import shlex

import pytest

from scripts.config.hostconfig import build_host
from scripts.config.sshopts import options
from scripts.engines.ansible_task import inventory


def _vars(opts: str) -> dict:
    host = build_host("gpa", {"SSH": "ops@10.0.0.7", "SSH_OPTS": opts}, "test")
    return inventory({"gpa": host})["_meta"]["hostvars"]["gpa"]


@pytest.mark.parametrize("opts", ["-p 2222 -i /keys/a", "-p2222 -i/keys/a", "-Cp 2222 -i /keys/a"])
def test_port_and_key_are_read_as_ssh_reads_them(opts):
    v = _vars(opts + " -o StrictHostKeyChecking=yes")
    assert v["ansible_port"] == 2222 and v["ansible_ssh_private_key_file"] == "/keys/a"
    common = shlex.split(v["ansible_ssh_common_args"])
    assert not any(w.startswith(("-p", "-i")) for w in common), common
    assert common[-2:] == ["-o", "StrictHostKeyChecking=yes"]


def test_options_other_than_port_and_key_go_to_every_ssh_as_given():
    v = _vars("-oConnectTimeout=5 -C -o ServerAliveInterval=3")
    assert "ansible_port" not in v and "ansible_ssh_private_key_file" not in v
    given = list(options(shlex.split(v["ansible_ssh_common_args"])))
    assert given == [("o", "ConnectTimeout=5"), ("C", ""), ("o", "ServerAliveInterval=3")]
