"""The invoke CLI as users meet it: --list, --help, `run` byte for byte, exit codes."""
import pytest

from tests.conftest import invoke

TASKS = ["hosts", "ping", "run", "oneliner", "sandbox"]


def test_list_names_every_task():
    out = invoke("--list")
    assert out.returncode == 0
    for name in TASKS:
        assert f"  {name} " in out.stdout.decode()


@pytest.mark.parametrize("name", TASKS)
def test_help_explains(name):
    out = invoke(name, "--help")
    assert out.returncode == 0
    text = out.stdout.decode()
    assert "Docstring:" in text and len(text.split("Docstring:")[1].strip()) > 20


@pytest.fixture
def gpu1(sshd, hosts_env):
    hosts_env(sshd.hosts_env("gpu1") + sshd.hosts_env("gpu2", ctid="129"))


@pytest.mark.parametrize("host", ["local", "gpu1", "gpu2"])
def test_run_passes_bytes_and_exit_code(gpu1, host):
    script = "printf 'out\\0\\377\\n'; printf 'err \\001\\n' >&2; exit 7"
    out = invoke("run", "--host", host, "--", "sh", "-c", script)
    assert out.returncode == 7
    assert out.stdout == b"out\x00\xff\n"
    assert out.stderr == b"err \x01\n"


def test_remote_exit_255_is_not_unreachable(gpu1):
    out = invoke("run", "--host", "gpu1", "--", "sh", "-c", "exit 255")
    assert out.returncode == 255
    assert b"unreachable" not in out.stderr


def test_unreachable_host_exit3(hosts_env):
    hosts_env("GPU9_SSH=nobody@127.0.0.1\nGPU9_SSH_OPTS='-p 1 -o ConnectTimeout=3 -o ControlPath=none'\n")
    out = invoke("run", "--host", "gpu9", "--", "true")
    assert out.returncode == 3
    assert b"gpu9: host unreachable" in out.stderr


def test_several_hosts_worst_exit(gpu1):
    out = invoke("run", "--host", "local,gpu1", "--", "sh", "-c", "echo hi; exit 3")
    assert out.returncode == 3
    assert out.stdout.decode().count("hi") == 2
    assert "===== gpu1 =====" in out.stdout.decode()


def test_oneliner_prints_route(gpu1):
    out = invoke("oneliner", "--host", "gpu2", "--", "echo", "it's")
    line = out.stdout.decode().strip()
    assert line.endswith("""'pct exec 129 -- echo '"'"'it'"'"'"'"'"'"'"'"'s'"'"''""")
    assert out.returncode == 0


def test_run_without_command_is_bad_input():
    out = invoke("run", "--host", "local")
    assert out.returncode == 2
    assert b"needs a command after `--`" in out.stderr
