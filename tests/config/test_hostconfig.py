"""hosts.env validation: every bad value is one line naming key and value, exit 2, no ssh."""
import os
import re
import stat

import pytest

from scripts.config.hostconfig import ConfigError, build_host, load_hosts, select_hosts
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
    ("GPU1_SSH=root@h\nGPU1_SCOPE=", "GPU1_SCOPE"),  # a variable that expanded to nothing: not the whole host
    ("GPU1_SSH=root@h\nGPU1_SCOPE='   '", "GPU1_SCOPE"),
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


def test_good_file_builds_both_route_shapes(hosts_env):
    hosts_env("GPU1_SSH=root@10.1.230.174\n"
              "GPU2_SSH=root@10.1.2.6\nGPU2_CTID=129\nGPU2_SSH_OPTS='-p 2222 -i /k'\n"
              "GPU2_PYTHON=/opt/venv/bin/python3\n")
    from scripts.config import hosts as all_hosts

    hosts = all_hosts.load()  # hosts.env plus the built-ins (the sandbox is added above hostconfig)
    assert hosts["gpu1"].route.describe() == "ssh root@10.1.230.174"
    assert hosts["gpu2"].route.describe() == "ssh -p 2222 -i /k root@10.1.2.6 -> pct exec 129"
    assert hosts["gpu2"].python == "/opt/venv/bin/python3"
    assert hosts["local"].route.hops == ()
    assert hosts["sandbox"].sandbox


def test_local_overrides_and_unknown_alias(hosts_env):
    hosts_env("LOCAL_DEVICES=/tmp/x/nvidia*\n")
    from scripts.config import hosts as all_hosts

    hosts = all_hosts.load()
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
    assert lines == [f"gpu-pivot: GPU1_CTID='abc': a Proxmox container id is a number of 100 or more (at {path}:2)"]
    assert not marker.exists()


def test_cli_unknown_alias_exit2_no_ssh(hosts_env, ssh_spy):
    env, marker = ssh_spy
    env["GPU_PIVOT_HOSTS_FILE"] = str(hosts_env("GPU1_SSH=root@10.0.0.1\n"))
    out = invoke("ping", "--host", "gpu1,gpu2", env=env)
    assert out.returncode == 2
    assert b"unknown host alias 'gpu2'" in out.stderr
    assert not marker.exists()


# --- hosts.env parsed strictly -------------------------------------------------------------

from dotenv import dotenv_values  # noqa: E402

from scripts.config.envfile import parse_text  # noqa: E402
from tests.conftest import REPO  # noqa: E402

FORBIDDEN_SSH = [
    "-o ProxyCommand=nc\\ %h\\ %p",
    "-oProxyCommand=evil",
    "-o 'ProxyCommand evil'",
    "-o ' proxycommand = evil'",
    "-o '\"ProxyCommand\" evil'",
    "-vo ProxyCommand=evil",
    "-4oProxyCommand=evil",
    "-o LocalCommand=touch\\ /tmp/x",
    "-o PermitLocalCommand=yes",
    "-oPERMITLOCALCOMMAND=yes",
    "-o 'KnownHostsCommand /bin/sh -c x'",
    "-o XAuthLocation=/tmp/evil",
    "-o PKCS11Provider=/tmp/evil.so",
    "-o SmartcardDevice=/tmp/evil.so",
    "-o SecurityKeyProvider=/tmp/evil.so",
    "-I /tmp/evil.so",
    "-o 'Match exec \"touch /tmp/x\"'",
    "-o 'Include /tmp/evil.conf'",
    "-F /tmp/evil.conf",
    "-vF/tmp/evil.conf",
    "-p 22 -F /tmp/evil.conf",
]


def _dq(value: str) -> str:
    """`value` as a double-quoted hosts.env value (dotenv rules: \\ and \" are escapes)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


@pytest.mark.parametrize("text,where,shown", [
    ("GPU1_SSH=root@h\nGPU1_CTID 129\n", ":2: not KEY=VALUE", "'GPU1_CTID 129'"),
    ("GPU1_SSH=root@h\n\n\n# c\nGPU1_CTID\n", ":5: not KEY=VALUE", "'GPU1_CTID'"),
    ("GPU1_SSH='root@h\nGPU1_CTID=129\n", ":1: GPU1_SSH: unclosed ' quote", "\"'root@h\""),
    ('GPU1_SSH="root@h\n', ':1: GPU1_SSH: unclosed " quote', "'\"root@h'"),
    ("GPU1_SSH='root@h' trailing\n", ":1: GPU1_SSH: text after the closing quote", "trailing"),
    ("gpu1_ssh=root@h\n", ":1: key 'gpu1_ssh'", "upper-case"),
    ("GPU1-SSH=root@h\n", ":1: key 'GPU1-SSH'", "upper-case"),
    ("Gpu1_SSH=root@h\n", ":1: key 'Gpu1_SSH'", "upper-case"),
    ("GPU1_SSH='root@h\nGPU1_CTID=129'\n", ":1: GPU1_SSH: quoted value spans lines 1-2", "'root@h"),
    ('GPU1_SSH="root@h\\n"\n', ":1: GPU1_SSH: value has a newline", "'root@h\\n'"),
    ('GPU1_SSH="root@h\\r"\n', ":1: GPU1_SSH: value has a newline", "'root@h\\r'"),
    ('GPU1_SSH="root@h\\t"\n', ":1: GPU1_SSH: value has control character U+0009", "'root@h\\t'"),
    ("GPU1_SSH=root@h\x07\n", ":1: GPU1_SSH: value has control character U+0007", "'root@h\\x07'"),
    ("GPU1_SSH='root@\x1bh'\n", ":1: GPU1_SSH: value has control character U+001B", "'root@\\x1bh'"),
    ("GPU1_SSH=root@h\u202e\n", ":1: GPU1_SSH: value has control character U+202E", "'root@h\\u202e'"),
    ("GPU1_SSH=root@h\x00\n", ":1: GPU1_SSH: value has control character U+0000", "'root@h\\x00'"),
    ("# innocent\rGPU1_CTID=129\nGPU1_SSH=root@h\n", ":1: control character U+000D", "'# innocent\\rGPU1_CTID=129'"),
    ("GPU1_SSH=root@h\nGPU1_SSH=root@other\n", ":2: GPU1_SSH is set twice (first on line 1)", ""),
    ("GPU1_SSH=root@h\nGPU1_TARGETS=" + "a" * 5000 + "\n",
     ":2: GPU1_TARGETS: value is 5000 bytes, over the 4096-byte limit", "'aaaa"),
    ("GPU1_SSH=root@h\nGPU1_TARGETS='" + "b" * 200000 + "'\n",
     ":2: GPU1_TARGETS: value is 200000 bytes", "(200000 characters)"),
])
def test_strict_file_errors_name_file_line_and_value(hosts_env, text, where, shown):
    path = hosts_env("")
    path.write_bytes(text.encode())  # as given: no newline translation
    with pytest.raises(ConfigError) as err:
        load_hosts()
    msg = str(err.value)
    assert "\n" not in msg and "\r" not in msg and len(msg) < 400, msg
    assert msg.startswith(str(path) + where), msg
    assert shown in msg


def test_line_endings_bom_export_and_comments_are_read_like_dotenv(hosts_env):
    """Everything the strict reader accepts, it reads exactly as python-dotenv does."""
    text = ("\ufeff# comment\r\n"
            "\r\n"
            "GPU1_SSH=root@h\r\n"
            "export GPU1_PYTHON=/usr/bin/python3\n"
            "  GPU1_SSH_OPTS = '-p 2222 -i /k'  # a comment after the quote\n"
            "GPU1_TARGETS=sglang\\.launch_server|vllm serve # trailing comment\n"
            "GPU1_PROTECT=\"it's \\\"quoted\\\" \\\\ ok\"\n"
            "GPU1_DEVICES=/dev/nvidia#0\n"
            "GPU1_FAKE_DEVICES= # empty then a comment\n"
            "GPU2_SSH='a\\'b'\n"
            "GPU2_CTID=  129   \n"
            "\t# indented comment\n")
    path = hosts_env(text)
    mine, lines = parse_text(path.read_text(encoding="utf-8"), str(path))
    assert mine == dict(dotenv_values(path, interpolate=False))
    assert mine["GPU1_PROTECT"] == "it's \"quoted\" \\ ok" and mine["GPU2_SSH"] == "a'b"
    assert lines["GPU1_SSH"] == 3 and lines["GPU2_CTID"] == 11


def test_example_file_reads_like_dotenv():
    path = REPO / "hosts.env.example"
    assert parse_text(path.read_text(encoding="utf-8"), str(path))[0] == dict(dotenv_values(path, interpolate=False))


def test_not_utf8_and_unreadable(hosts_env, tmp_path, monkeypatch):
    path = hosts_env("")
    path.write_bytes(b"GPU1_SSH=root@h\xff\n")
    with pytest.raises(ConfigError, match=r"not UTF-8 text \(byte 0xff at offset 15\)"):
        load_hosts()
    monkeypatch.setenv("GPU_PIVOT_HOSTS_FILE", str(tmp_path))  # a directory
    with pytest.raises(ConfigError, match="cannot read"):
        load_hosts()


@pytest.mark.parametrize("opts", FORBIDDEN_SSH)
def test_ssh_opts_that_run_local_code_are_refused(hosts_env, opts):
    hosts_env(f"GPU1_SSH=root@h\nGPU1_SSH_OPTS={_dq(opts)}\n")
    assert parse_text(f"K={_dq(opts)}", "t")[0]["K"] == opts
    with pytest.raises(ConfigError) as err:
        load_hosts()
    msg = str(err.value)
    assert msg.startswith("GPU1_SSH_OPTS=") and "\n" not in msg
    assert "hosts.env may come from a shared repo" in msg and "~/.ssh/config" in msg


@pytest.mark.parametrize("opts,why", [
    ("otherhost -p 22", "'otherhost' is not an ssh option"),
    ("-- x", "'--' is not an ssh option"),
    ("-p", "-p needs a value"),
    ("-Z", "-Z is not an ssh option"),
])
def test_ssh_opts_must_be_options(hosts_env, opts, why):
    hosts_env(f"GPU1_SSH=root@h\nGPU1_SSH_OPTS='{opts}'\n")
    with pytest.raises(ConfigError, match=re.escape(why)):
        load_hosts()


def test_ssh_opts_that_stay_allowed(hosts_env):
    hosts_env("GPU1_SSH=root@h\nGPU1_SSH_OPTS='-p 2222 -o ProxyJump=jump@bastion -J a@b,c@d -o ControlPath=none "
              "-vi /k -o \"UserKnownHostsFile /tmp/kh\"'\n")
    assert load_hosts()["gpu1"].route.hops[0].opts[:2] == ("-p", "2222")


EMPTY_PATTERNS = ["", ".*", "x*", "^", "|foo", "foo|", "(?:)", "$", "(?!x)", "(sglang)?"]
EVERYTHING_PATTERNS = [".", "\\w", "[a-z]", "[^!]", "\\S"]


@pytest.mark.parametrize("key", ["TARGETS", "PROTECT"])
@pytest.mark.parametrize("pattern", EMPTY_PATTERNS + EVERYTHING_PATTERNS)
def test_patterns_matching_everything_are_refused(hosts_env, key, pattern):
    hosts_env(f"GPU1_SSH=root@h\nGPU1_{key}='{pattern}'\n")
    with pytest.raises(ConfigError) as err:
        load_hosts()
    msg = str(err.value)
    assert msg.startswith(f"GPU1_{key}='{pattern}': matches ") and "\n" not in msg  # as typed: no doubled \\
    assert ("protect" if key == "PROTECT" else "target") + " every process" in msg


def test_local_patterns_and_good_patterns(hosts_env):
    hosts_env("LOCAL_TARGETS=\n")
    with pytest.raises(ConfigError, match=r"^LOCAL_TARGETS='': matches the empty string"):
        load_hosts()
    hosts_env("GPU1_SSH=root@h\nGPU1_TARGETS='sglang::|VLLM::EngineCore'\nGPU1_PROTECT=my-metrics-agent\n")
    h = load_hosts()["gpu1"]
    assert h.targets == ("sglang::|VLLM::EngineCore",) and h.protect == ("my-metrics-agent",)


@pytest.mark.parametrize("value,expected", [("yes", True), ("no", False), ("true", True), ("false", False),
                                            ("1", True), ("0", False), ("YES", True)])
def test_fake_devices_key(hosts_env, value, expected):
    hosts_env(f"GPU1_SSH=root@h\nGPU1_FAKE_DEVICES={value}\nLOCAL_FAKE_DEVICES={value}\n")
    hosts = load_hosts()
    assert hosts["gpu1"].fake_devices is expected and hosts["local"].fake_devices is expected
    assert hosts["gpu1"].devices == "/dev/nvidia*"


@pytest.mark.parametrize("value", ["", "on", "y", "2", "yes please"])
def test_fake_devices_bad_value_and_default(hosts_env, value):
    hosts_env("GPU2_SSH=root@h2\n")
    assert load_hosts()["gpu2"].fake_devices is False
    hosts_env(f"GPU1_SSH=root@h\nGPU1_FAKE_DEVICES='{value}'\n")
    with pytest.raises(ConfigError, match=rf"^GPU1_FAKE_DEVICES={re.escape(repr(value))}: must be yes or no"):
        load_hosts()


# --- through the real CLI: one line on stderr, exit 2, ssh never started ------------------------

def _cli(hosts_env, ssh_spy, text, *args):
    env, marker = ssh_spy
    env["GPU_PIVOT_HOSTS_FILE"] = str(hosts_env(text))
    out = invoke(*args, env=env)
    lines = out.stderr.decode().strip().splitlines()
    assert out.returncode == 2, (out.returncode, lines)
    assert len(lines) == 1, lines
    assert not marker.exists(), "ssh was started"
    return env["GPU_PIVOT_HOSTS_FILE"], lines[0]


@pytest.mark.parametrize("task", [["ping"], ["run", "--", "true"], ["plan"]])
def test_cli_ctid_without_equals_is_exit2_and_never_reaches_ssh(hosts_env, ssh_spy, task):
    """The silent misroute this refuses: a dropped `GPU1_CTID 129` (no `=`) sends commands to the node."""
    path, line = _cli(hosts_env, ssh_spy, "GPU1_SSH=root@10.0.0.1\nGPU1_CTID 129\n",
                      task[0], "--host", "gpu1", *task[1:])
    assert line == f"gpu-pivot: {path}:2: not KEY=VALUE: 'GPU1_CTID 129'"


def test_cli_unclosed_quote_and_proxycommand(hosts_env, ssh_spy):
    path, line = _cli(hosts_env, ssh_spy, "GPU1_SSH=root@10.0.0.1\nGPU1_CTID='129\n", "ping", "--host", "gpu1")
    assert line == f"gpu-pivot: {path}:2: GPU1_CTID: unclosed ' quote: \"'129\""
    path, line = _cli(hosts_env, ssh_spy, "GPU1_SSH=root@10.0.0.1\nGPU1_SSH_OPTS='-oProxyCommand=touch /tmp/pwned'\n",
                      "ping", "--host", "gpu1")
    assert line == ("gpu-pivot: GPU1_SSH_OPTS='-oProxyCommand=touch /tmp/pwned': ProxyCommand runs a local command; "
                    f"hosts.env may come from a shared repo — put it in ~/.ssh/config (at {path}:2)")


@pytest.mark.parametrize("key,value", [("TARGETS", ""), ("PROTECT", ""), ("TARGETS", ".*")])
def test_cli_empty_patterns_in_file(hosts_env, ssh_spy, key, value):
    _, line = _cli(hosts_env, ssh_spy, f"GPU1_SSH=root@10.0.0.1\nGPU1_{key}='{value}'\n", "plan", "--host", "gpu1")
    assert line.startswith(f"gpu-pivot: GPU1_{key}={value!r}: matches the empty string")


@pytest.mark.parametrize("task", ["plan", "teardown"])
@pytest.mark.parametrize("pattern", ["", ".*", "|sglang", "."])
def test_cli_match_refuses_everything_patterns(hosts_env, ssh_spy, task, pattern):
    extra = ["--yes"] if task == "teardown" else []
    _, line = _cli(hosts_env, ssh_spy, "GPU1_SSH=root@10.0.0.1\n", task, "--host", "gpu1", "--match", "sglang",
                   "--match", pattern, *extra)
    assert line.startswith(f"gpu-pivot: --match {pattern!r}: matches "), line
    assert "every process" in line


def test_match_help_states_the_rule():
    out = invoke("plan", "--help")
    text = b" ".join(out.stdout.split()).decode()
    assert "PROGRAMS" in text and "never an argument of another program" in text and "empty string" in text


def test_gpu_baseline_is_read_and_checked():
    host = build_host("gpu1", {"SSH": "root@192.0.2.1", "GPU_BASELINE": '{"persistence": "on", "power_limit_w": 700}'},
                      "test")
    assert host.gpu_baseline == {"persistence": "on", "power_limit_w": 700}
    assert build_host("gpu1", {"SSH": "root@192.0.2.1"}, "test").gpu_baseline == {}
    for bad in ('{"mig": true}', '{"graphics_clock_mhz": -1}', '{"power_limit_w": NaN}', "[]", "{}"):
        with pytest.raises(ConfigError, match=r"^GPU1_GPU_BASELINE="):
            build_host("gpu1", {"SSH": "root@192.0.2.1", "GPU_BASELINE": bad}, "test")


def test_applying_gpu_settings_is_opt_in_and_a_phase_declares_its_own(hosts_env):
    hosts_env("GPU1_SSH=root@192.0.2.1\nGPU1_PHASE_TRAIN_ARGV='[\"train\"]'\n"
              "GPU1_PHASE_TRAIN_GPU_SETTINGS='{\"power_limit_w\": 500, \"compute_mode\": \"exclusive_process\"}'\n")
    host = load_hosts()["gpu1"]
    assert not host.apply_settings  # off unless the host says yes
    assert dict(host.phases["train"].gpu_settings) == {"power_limit_w": 500, "compute_mode": "exclusive_process"}
    hosts_env("GPU1_SSH=root@192.0.2.1\nGPU1_GPU_APPLY_SETTINGS=yes\n")
    assert load_hosts()["gpu1"].apply_settings
    for line, want in (("GPU1_GPU_APPLY_SETTINGS=maybe", "GPU1_GPU_APPLY_SETTINGS='maybe': must be yes or no"),
                       ("GPU1_PHASE_TRAIN_ARGV='[\"t\"]'\nGPU1_PHASE_TRAIN_GPU_SETTINGS='{\"power_limit_w\": \"max\"}'",
                        "GPU1_PHASE_TRAIN_GPU_SETTINGS="),
                       ("GPU1_PHASE_TRAIN_ARGV='[\"t\"]'\nGPU1_PHASE_TRAIN_GPU_SETTINGS='{\"fan\": 1}'",
                        "unknown setting 'fan'")):
        hosts_env(f"GPU1_SSH=root@192.0.2.1\n{line}\n")
        with pytest.raises(ConfigError, match=re.escape(want)):
            load_hosts()
    res = invoke("status", "--host", "gpu1")  # one line naming the key and value, exit 2, nothing run
    assert res.returncode == 2 and b"unknown setting 'fan'" in res.stdout + res.stderr
