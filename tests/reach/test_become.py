"""A non-root operator who becomes root with sudo (`ALIAS_BECOME=sudo`).

Real parts: a throwaway user logs in to the loopback sshd with a key the test makes, real
sudo (Debian's) reads sudoers rules the test installs for that user alone (a drop-in with a
name of its own in /etc/sudoers.d, checked by `visudo -cf`, removed at the end), and the
GPU holder is a real process the test starts as root on fake device files in its own temp
dir (the host's SCOPE, so nothing else can be planned).
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from scripts.agent.wire import records
from scripts.config.errors import ConfigError
from scripts.config.hostconfig import build_host, load_hosts
from scripts.config.route import PctHop, Route, SshHop, SudoHop
from scripts.reach.route import SudoRefused, one_liner, wrap
from scripts.reach.ssh import CONNECT_TIMEOUT_S
from scripts.views.ping import ping_suffix, runs_as
from tests.conftest import invoke, need_tools
from tests.support import scenario
from tests.support.hostile_argv import HOSTILE, expected, far_side
from tests.support.loopback_sshd import STANDIN_DIR, LoopbackSshd
from tests.support.procs import alive, wait_for
from tests.support.second_user import SBIN_PATH, SecondUser, make_user, remove_user

SUDOERS_D = Path("/etc/sudoers.d")
NOPASSWD = "{u} ALL=(root) NOPASSWD: ALL"


# -- the route and the configuration ------------------------------------------------------------

def test_sudo_sits_between_ssh_and_pct_and_quotes_nothing_itself():
    route = Route((SshHop("ana@10.1.2.6"), SudoHop(), PctHop("129")))
    assert one_liner(route, ["bash", "-c", 'nvidia-smi | grep "0MiB"']) == (
        """ssh ana@10.1.2.6 'sudo -n -- pct exec 129 -- bash -c '"'"'nvidia-smi | grep "0MiB"'"'"''""")
    assert one_liner(Route((SshHop("ana@h"), SudoHop())), ["-x", "a b"]) == \
        "ssh ana@h 'sudo -n -- -x '\"'\"'a b'\"'\"''"
    assert route.describe() == "ssh ana@10.1.2.6 -> sudo -n -> pct exec 129"


def test_become_key_builds_the_hop_in_route_order():
    host = build_host("gpu1", {"CTID": "129", "BECOME": "sudo", "SSH": "ana@10.1.2.6"}, "test")
    assert [type(h) for h in host.route.hops] == [SshHop, SudoHop, PctHop]
    assert host.route.become == SudoHop()
    assert build_host("gpu2", {"SSH": "ana@h"}, "test").route.become is None


@pytest.mark.parametrize("keys, message", [
    ({"SSH": "ana@h", "BECOME": "su"}, r"^GPU1_BECOME='su': the one way to become root is 'sudo'"),
    ({"SSH": "ana@h", "BECOME": "Sudo -i"}, r"^GPU1_BECOME='Sudo -i': the one way"),
    ({"BECOME": "sudo"}, r"^GPU1_BECOME is set but GPU1_SSH is not"),
    ({"CTID": "129", "BECOME": "sudo"}, r"^GPU1_BECOME is set but GPU1_SSH is not"),
])
def test_bad_become_values_are_one_line(keys, message):
    with pytest.raises(ConfigError, match=message):
        build_host("gpu1", keys, "test")


def test_hosts_and_the_ansible_inventory_carry_become(hosts_env):
    from scripts.engines.ansible_task import inventory

    hosts_env("GPU1_SSH=ana@192.0.2.7\nGPU1_BECOME=sudo\nGPU2_SSH=root@192.0.2.8\n")
    out = invoke("hosts", "--json")
    assert out.returncode == 0, out.stderr
    docs = {d["alias"]: d for d in json.loads(out.stdout)}
    assert docs["gpu1"]["become"] == "sudo" and docs["gpu1"]["route"] == "ssh ana@192.0.2.7 -> sudo -n"
    assert docs["gpu2"]["become"] is None
    hostvars = inventory(load_hosts())["_meta"]["hostvars"]
    assert hostvars["gpu1"]["ansible_become"] is True and hostvars["gpu1"]["ansible_become_method"] == "sudo"
    assert "ansible_become" not in hostvars["gpu2"]


def test_local_become_is_refused(tmp_path):
    env = tmp_path / "hosts.env"
    env.write_text("LOCAL_BECOME=sudo\n")
    with pytest.raises(ConfigError, match=r"LOCAL_BECOME is not allowed"):
        load_hosts(env)


def _ping(uid: int, sudo_user: str | None = None) -> records.PingResult:
    return records.PingResult(hostname="h", pid=1, uid=uid, python="3.11", nvml=False, nvidia_smi=None, fuser=None,
                               devices=[], sudo_user=sudo_user)


def test_ping_says_how_the_agent_runs():
    assert runs_as(_ping(0, "ana"), None) == "root via sudo"  # `sudo invoke ...` on this machine
    assert runs_as(_ping(0), SudoHop()) == "root via sudo"  # pct exec after sudo: no SUDO_USER in the container
    assert runs_as(_ping(0), None) == "root"
    assert runs_as(_ping(1001), None) == "uid 1001"
    assert ping_suffix(_ping(1001), None) == "; as uid 1001, not root: other users' GPU processes are out of its reach"


def test_refusal_is_exit_1_without_the_proof_line_never_sudos_words():
    """sudo's text is translated; the rule reads the exit code and the line only."""
    from scripts.reach.route import become_failure, ran_line

    route = Route((SshHop("ana@10.1.2.6"), SudoHop()))
    refused = become_failure(route, "gpu1", 1, False, "sudo: Passwort wird benötigt\n")
    assert isinstance(refused, SudoRefused)
    assert str(refused).startswith("gpu1: sudo on 10.1.2.6 refused to run the agent as root without a password")
    assert "it said: sudo: Passwort wird benötigt" in str(refused) and "`ana ALL=(root) NOPASSWD: ALL`" in str(refused)
    assert "\n" not in str(refused)
    assert become_failure(route, "gpu1", 1, True, ran_line("x")) is None  # the command ran, and exited 1
    assert become_failure(route, "gpu1", 2, False, "") is None  # not sudo's code: the usual "no result" error
    assert become_failure(Route((SshHop("ana@h"),)), "gpu1", 1, False, "") is None  # no sudo hop


# -- a real operator, real sudo, the loopback sshd ------------------------------------------------

@dataclass
class Operator:
    user: SecondUser
    server: LoopbackSshd
    run_dir: Path  # where the agent keeps its state as root (sudo keeps GPU_PIVOT_RUN_DIR: rule_text)

    def hosts_env(self, alias: str = "gpu1", **keys) -> str:
        ctid = keys.pop("CTID", None)
        return self.server.hosts_env(alias, ctid=ctid, extra=keys, user=self.user.name)


@pytest.fixture(scope="module")
def operator(tmp_path_factory):
    """A user who logs in to the loopback sshd with the test's key; no sudo rule yet (sudoers)."""
    need_tools("sudo", "visudo", "sshd", why="an operator who becomes root with sudo")
    user = make_user()
    server = None
    try:
        # sshd without PAM refuses a locked account ("!", useradd's default); "*": no password, not locked
        subprocess.run(["usermod", "-p", "*", user.name], check=True, capture_output=True, env={"PATH": SBIN_PATH})
        base = tmp_path_factory.mktemp("become")
        run_dir = base / "remote-run"
        server = LoopbackSshd(base / "sshd", env={"GPU_PIVOT_RUN_DIR": str(run_dir)}, home_keys=True).start()
        ssh_dir = Path(user.home) / ".ssh"
        ssh_dir.mkdir(mode=0o700)
        shutil.copy(f"{server.client_key}.pub", ssh_dir / "authorized_keys")
        subprocess.run(["chown", "-R", f"{user.uid}:{user.gid}", str(ssh_dir)], check=True)
        yield Operator(user, server, run_dir)
    finally:
        if server is not None:
            _close_master(server, user)
            server.stop()
        remove_user(user)


def _close_master(server: LoopbackSshd, user: SecondUser) -> None:
    """End the ssh master (ControlPersist) the tests' calls shared, then wait until the user's
    sshd session is gone: userdel refuses a user who still has a process."""
    from scripts.reach.ssh import control_path

    dest, opts = server.dest(user.name), server.ssh_opts.split()
    subprocess.run(["ssh", *opts, "-S", control_path(dest, opts), "-O", "exit", dest], capture_output=True, timeout=30)

    def users_processes() -> list:
        return [p for p in os.listdir("/proc") if p.isdigit() and _owner(p) == user.uid]

    wait_for(lambda: not users_processes(), f"{user.name}'s ssh session to end", timeout=30)


def _owner(pid: str) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def rule_text(user: str, *rules: str) -> str:
    """The test's sudoers lines for `user` alone: the test's environment kept (the far side's
    state dir, the pct stand-in's log) and the stand-in pct found on sudo's secure_path."""
    path = f"{STANDIN_DIR}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    return "\n".join([f'Defaults:{user} env_keep += "GPU_PIVOT_RUN_DIR PCT_STANDIN_LOG"',
                      f'Defaults:{user} secure_path="{path}"', *(r.format(u=user) for r in rules)]) + "\n"


@pytest.fixture
def sudoers(operator):
    """install(*rules): this test's drop-in (rules formatted with u=the user), checked by
    `visudo -cf` before it is moved in place; removed at the end. Only its own file is touched."""
    path = SUDOERS_D / f"gpu-pivot-test-{secrets.token_hex(6)}"
    staged = SUDOERS_D / f".{path.name}"  # sudo skips names with a dot: never read half-written

    def install(*rules: str) -> None:
        staged.write_text(rule_text(operator.user.name, *rules))
        os.chmod(staged, 0o440)
        check = subprocess.run(["visudo", "-cf", str(staged)], capture_output=True, text=True,
                               env={"PATH": SBIN_PATH, "LANG": "C"})
        assert check.returncode == 0, check.stdout + check.stderr
        os.replace(staged, path)

    yield install
    for leftover in (path, staged):
        leftover.unlink(missing_ok=True)


def test_nopasswd_rule_frees_a_root_owned_holder(operator, sudoers, ps, hosts_env):
    server, workers = ps.server(tp=1)
    assert os.stat(f"/proc/{server}").st_uid == 0  # root's holder, which the operator cannot signal
    keys = dict(scenario.host_keys(ps), TARGETS=r"sandbox_roles\.py")
    hosts_env(operator.hosts_env("gpu0", **keys) + operator.hosts_env("gpu1", BECOME="sudo", **keys))
    sudoers(NOPASSWD)

    plain = invoke("ping", "--host", "gpu0")  # the same user without BECOME: not root, and says so
    assert plain.returncode == 0, plain.stderr
    assert f"; as uid {operator.user.uid}, not root" in plain.stdout.decode()

    ping = invoke("ping", "--host", "gpu1")
    assert ping.returncode == 0, ping.stderr
    assert " ".join(ping.stdout.decode().split()).endswith("; as root via sudo"), ping.stdout  # wrapped or not
    doc = json.loads(invoke("ping", "--host", "gpu1", "--json").stdout)[0]
    assert doc["uid"] == 0 and doc["sudo_user"] == operator.user.name and doc["runs_as"] == "root via sudo"

    out = invoke("teardown", "--host", "gpu1", "--yes", "--grace", "2")
    assert out.returncode == 0, out.stdout.decode() + out.stderr.decode()
    assert not alive(server) and not any(alive(w) for w in workers)
    last = json.loads((operator.run_dir / "last.json").read_text())  # written by root, where sudo kept it
    assert last["exit_code"] == 0 and server in {a["pid"] for a in last["actions"]}


@pytest.mark.parametrize("rules", [
    pytest.param(("{u} ALL=(root) ALL",), id="password"),
    pytest.param(("Defaults:{u} requiretty", NOPASSWD), id="requiretty"),
    pytest.param(("{u} ALL=(root) NOPASSWD: /usr/bin/id, /usr/bin/systemctl",), id="other-commands"),
    pytest.param((), id="no-rule"),
])
def test_sudo_that_would_ask_is_one_line_exit_3_and_nothing_runs(operator, sudoers, ps, hosts_env, rules):
    server, _ = ps.server(tp=1)
    hosts_env(operator.hosts_env("gpu1", BECOME="sudo", **dict(scenario.host_keys(ps), TARGETS=r"sandbox_roles\.py")))
    sudoers(*rules)
    before = sorted(os.listdir(operator.run_dir)) if operator.run_dir.exists() else None
    # ping within the connect deadline: a sudo that waited for an answer would exit 7 (timed out)
    for args, what in ((["teardown", "--yes", "--grace", "2"], "the agent"),
                       (["ping", "--timeout", str(CONNECT_TIMEOUT_S)], "the agent"), (["run", "--", "id", "-u"], "id")):
        out = invoke(*args[:1], "--host", "gpu1", *args[1:])
        err = out.stderr.decode()
        assert out.returncode == 3, f"{args}: exit {out.returncode}: {err}"
        assert len(err.strip().splitlines()) == 1, err
        assert (f"gpu1: sudo on 127.0.0.1 refused to run {what} as root without a password or a terminal "
                in err), err
        assert f"GPU1_BECOME=sudo needs a sudoers rule there such as `{operator.user.name} ALL=(root) NOPASSWD: ALL`" \
            in err and err.rstrip().endswith("nothing ran"), err
        assert out.stdout == b""
    assert alive(server)
    assert (sorted(os.listdir(operator.run_dir)) if operator.run_dir.exists() else None) == before  # no lock taken


def test_run_and_pct_go_through_sudo_as_root(operator, sudoers, hosts_env):
    hosts_env(operator.hosts_env("gpu1", BECOME="sudo") + operator.hosts_env("gpu2", BECOME="sudo", CTID="129"))
    sudoers(NOPASSWD)
    log = operator.server.pct_log
    before = log.read_text() if log.exists() else ""
    for alias in ("gpu1", "gpu2"):
        out = invoke("run", "--host", alias, "--", "sh", "-c", 'echo "$(id -u) $SUDO_USER"')
        assert out.returncode == 0, out.stderr
        assert out.stdout == f"0 {operator.user.name}\n".encode()
    assert log.read_text()[len(before):] == "129\n"  # gpu2 took the pct hop, after sudo
    missing = invoke("run", "--host", "gpu1", "--", "no-such-command-here")  # the command's own failure, not sudo's
    assert missing.returncode == 127 and b"no-such-command-here: command not found" in missing.stderr
    # exit 1 after the proof line: the command's own, though it is sudo's code for a refusal
    failed = invoke("run", "--host", "gpu1", "--", "sh", "-c", "echo own words >&2; exit 1")
    assert failed.returncode == 1 and failed.stderr == b"own words\n", failed.stderr


def test_hostile_argv_byte_exact_through_ssh_sudo_and_pct(operator, sudoers):
    sudoers(NOPASSWD)
    keys = {"SSH": operator.server.dest(operator.user.name), "SSH_OPTS": operator.server.ssh_opts, "BECOME": "sudo"}
    for host in (build_host("gpu1", keys, "test"), build_host("gpu2", dict(keys, CTID="129"), "test")):
        out = subprocess.run(wrap(host.route, far_side(HOSTILE)), capture_output=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert out.stdout == expected(HOSTILE)
        line = one_liner(host.route, far_side(HOSTILE))  # what an operator pastes: one more shell layer
        out = subprocess.run(["bash", "-c", line], capture_output=True, timeout=60)
        assert out.stdout == expected(HOSTILE), out.stderr


def test_ansible_module_runs_as_root_through_the_inventorys_become(operator, sudoers, ps, hosts_env, tmp_path):
    """The inventory sets ansible_become for a BECOME host: the module frees a root-owned holder."""
    from tests.support.ansible_play import ANSIBLE_PLAYBOOK, play

    if not os.path.exists(ANSIBLE_PLAYBOOK):
        pytest.skip("ansible-core is not installed (requirements-dev.txt)")
    server, workers = ps.server(tp=1)
    env_file = hosts_env(operator.hosts_env("gpa", BECOME="sudo", **dict(scenario.host_keys(ps),
                                                                         TARGETS=r"sandbox_roles\.py")))
    sudoers(NOPASSWD)
    # the become user's (root's) remote tmp in the test's dir: nothing is left in root's ~/.ansible
    env = dict(os.environ, GPU_PIVOT_HOSTS_FILE=str(env_file), ANSIBLE_HOME=str(tmp_path / "ansible-home"),
               ANSIBLE_REMOTE_TMP=str(tmp_path / "remote-tmp"),
               ANSIBLE_SSH_ARGS="-o ControlMaster=no", ANSIBLE_PIPELINING="true", ANSIBLE_HOST_KEY_CHECKING="true",
               ANSIBLE_NOCOLOR="1", ANSIBLE_LOCALHOST_WARNING="false", ANSIBLE_PYTHON_INTERPRETER="auto_silent")
    done, facts = play(env, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert facts["gpa"]["verdict"] == "free" and {t["pid"] for t in facts["gpa"]["targets"]} == {server, *workers}
    assert not alive(server)
