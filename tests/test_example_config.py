"""hosts.env.example is a valid configuration: every documented key parses."""
from scripts.hostconfig import load_hosts
from tests.conftest import REPO


def test_example_file_loads():
    hosts = load_hosts(REPO / "hosts.env.example")
    assert hosts["gpu1"].route.describe().startswith("ssh -o ConnectTimeout=10 root@10.1.230.174")
    assert hosts["gpu1pct"].route.describe() == "ssh root@10.1.2.6 -> pct exec 129"
    assert set(hosts["gpu1"].phases) == {"datagen"} and set(hosts["gpu1pct"].phases) == {"train", "deploy"}
    assert hosts["gpu1"].phases["datagen"].is_server and len(hosts["gpu1"].phases["datagen"].prep) == 2
    assert hosts["gpu1pct"].phases["deploy"].is_deploy
    assert hosts["gpu1pct"].phases["train"].argv[:2] == ("sh", "-c")
