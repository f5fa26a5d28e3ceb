"""A task loads what its hosts need: the sandbox host is built only when a task names it (or lists
every host), the phases' module only for a hosts.env that has a phase, and a call to a host
never imports tempfile (with shutil, random, bz2 and lzma behind it)."""
import json
import os
import subprocess
import sys

import pytest

from scripts.config import hosts
from scripts.config.errors import ConfigError
from tests.conftest import REPO

HEAVY = ("scripts.config.sandbox", "scripts.ops.sandbox", "scripts.ops.sandbox_procs", "scripts.config.phases",
         "tempfile", "shutil")


def loaded_by(code: str) -> list:
    """The HEAVY modules a fresh interpreter has loaded after `code` (this test's hosts.env)."""
    probe = ("import json, sys; sys.path.insert(0, sys.argv[1]); " + code + "; "
             f"print(json.dumps([m for m in {list(HEAVY)!r} if m in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", probe, str(REPO)], capture_output=True, text=True, env=os.environ,
                         check=True)
    return json.loads(out.stdout)


def test_a_status_of_a_host_builds_no_sandbox_and_no_phase(hosts_env):
    hosts_env("GPU1_SSH=root@192.0.2.1\n")
    assert loaded_by("from scripts.config import hosts; hosts.select('gpu1,local'); "
                     "import scripts.reach.transport, scripts.views.status") == []


def test_the_sandbox_and_phases_load_when_named(hosts_env):
    hosts_env("GPU1_SSH=root@192.0.2.1\nGPU1_PHASE_TRAIN_CMD='sleep 1'\n")
    assert "scripts.config.phases" in loaded_by("from scripts.config import hosts; hosts.select('gpu1')")
    assert {"scripts.config.sandbox", "scripts.config.phases"} <= set(
        loaded_by("from scripts.config import hosts; hosts.select('sandbox')"))


def test_the_sandbox_is_known_before_it_is_built(hosts_env):
    hosts_env("GPU1_SSH=root@192.0.2.1\n")
    with pytest.raises(ConfigError, match=r"unknown host alias 'gpu9'; known: gpu1, local, sandbox; "):
        hosts.select("gpu9")
    chosen = hosts.select("sandbox,gpu1")
    assert [h.alias for h in chosen] == ["sandbox", "gpu1"] and chosen[0].sandbox
    assert list(hosts.load()) == ["local", "sandbox", "gpu1"]
