"""A host's ssh options are read once, the way ssh's getopt reads them (sshopts.options): the
check that refuses an option and the line that names a refused host key's known_hosts file
see the same options, clustered flags (`-vo X`) included."""
import pytest

from scripts.config.errors import ConfigError
from scripts.config.sshopts import check_ssh_opts, known_hosts_files, options


def test_options_are_split_as_ssh_reads_them():
    assert list(options(("-vo", "BatchMode=yes", "-p2222", "-i", "/k", "-C"))) == [
        ("v", ""), ("o", "BatchMode=yes"), ("p", "2222"), ("i", "/k"), ("C", "")]
    assert list(options(("-o",))) == [("o", None)]
    assert list(options(("root@h", "--"))) == [("", "root@h"), ("", "--")]


def test_known_hosts_files_in_every_spelling_ssh_takes():
    opts = ("-o", "UserKnownHostsFile=/a /b", "-oUserKnownHostsFile /c", "-vo", "userknownhostsfile='/d'",
            "-o", "StrictHostKeyChecking=yes")
    assert known_hosts_files(opts) == ["/a", "/b", "/c", "/d"]
    assert known_hosts_files(("-p", "-oUserKnownHostsFile=/x")) == []  # -p's value, not an option


@pytest.mark.parametrize("text,why", [("-vE /tmp/log", "-E"), ("-o", "needs a value"), ("-vZ", "-Z is not"),
                                      ("root@h", "is not an ssh option"), ("-voProxyCommand=x", "ProxyCommand")])
def test_the_check_reads_the_same_options(text, why):
    with pytest.raises(ConfigError, match=why):
        check_ssh_opts("GPU1_SSH_OPTS", text, tuple(text.split()))
