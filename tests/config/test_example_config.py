"""hosts.env.example is a valid configuration, one host per route the incidents took, at
addresses no host answers; and the examples of README and docs/ name only hosts and phases it defines."""
import ipaddress
import re
import shlex

from scripts.config.hostconfig import load_hosts
from tests.conftest import REPO

EXAMPLE = REPO / "hosts.env.example"
BUILT_IN = {"local", "sandbox"}
# RFC 5737: addresses for documentation, routed nowhere
DOCUMENTATION = [ipaddress.ip_network(n) for n in ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24")]


def test_example_file_loads_one_host_per_route():
    hosts = load_hosts(EXAMPLE)
    assert hosts["gpu1"].route.describe().startswith("ssh -o ConnectTimeout=5 root@192.0.2.174")
    assert hosts["gpu1pct"].route.describe() == "ssh root@192.0.2.6 -> pct exec 129"
    assert hosts["gpu2"].route.describe() == "ssh ana@192.0.2.175 -> sudo -n"  # a non-root operator
    assert set(hosts["gpu1"].phases) == {"datagen"} and set(hosts["gpu1pct"].phases) == {"train", "deploy"}
    assert hosts["gpu1"].phases["datagen"].is_server and len(hosts["gpu1"].phases["datagen"].prep) == 2
    assert hosts["gpu1pct"].phases["deploy"].is_deploy
    assert hosts["gpu1pct"].phases["train"].argv[:2] == ("sh", "-c")


def test_example_addresses_reach_nobody():
    """A straight copy of the example must fail fast and clearly, not reach someone's host."""
    found = re.findall(r"^[A-Z0-9_]+_SSH=\S*@([0-9.]+)\s*$", EXAMPLE.read_text(), re.M)
    assert len(found) == 3
    for addr in found:
        assert any(ipaddress.ip_address(addr) in net for net in DOCUMENTATION), addr


def readme_commands() -> list:
    """Every `invoke ...` / `make ...` command README and docs/ show, in code spans or blocks."""
    text = "\n".join(p.read_text() for p in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))])
    spans = re.findall(r"`([^`\n]+)`", text) + [line for block in re.findall(r"```sh\n(.*?)```", text, re.S)
                                                  for line in block.splitlines()]
    return [s.split(" #", 1)[0].split(" -- ", 1)[0].strip() for s in spans if s.startswith(("invoke ", "make "))]


def test_readme_examples_name_hosts_and_phases_the_example_defines():
    hosts = load_hosts(EXAMPLE)
    checked = 0
    for command in readme_commands():
        words = shlex.split(command)
        host = phase = None
        for i, w in enumerate(words):
            if w in ("--host", "-H") and i + 1 < len(words):
                host = words[i + 1]
            elif w.startswith("HOST="):
                host = w.split("=", 1)[1]
            elif w in ("--to", "--phase", "-p") and i + 1 < len(words):
                phase = words[i + 1]
        if words[:2] == ["make", "pivot-datagen"] or words[:2] == ["make", "pivot-train"] or \
                words[:2] == ["make", "pivot-deploy"]:
            phase = words[1].split("-", 1)[1]
        if host is None or not re.fullmatch(r"[a-z][a-z0-9_]*", host):
            continue  # a node set or list is an example of syntax, not of a host
        checked += 1
        assert host in hosts or host in BUILT_IN, f"docs: {command!r} names host {host!r}, not in the example"
        if phase is not None and host not in BUILT_IN:
            assert phase in hosts[host].phases, f"docs: {command!r}: {host} has no phase {phase!r} in the example"
    assert checked >= 10
    make_hosts = {c.split("HOST=")[1].split()[0] for c in readme_commands() if c.startswith("make pivot-")
                  and "HOST=" in c}
    assert make_hosts == {"gpu1", "gpu1pct"}
