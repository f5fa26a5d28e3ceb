"""Teardowns kept to a test's own processes, and servers that come back, for the teardown tests.

`host` is a local host scoped to the ProcessSet: its fake device files, its temp dir as the
scope, the fake GPU memory it declares, and targets naming only the programs tests start
(the sandbox's roles and the scenario's server), so a teardown can never match a process the
test did not start. `server_cmd` runs a module `xsrv.launch_server` from the test's own
PYTHONPATH (a server that may hold a device, fork a child or leave a helper in its group);
`shell` starts a restarting loop in a session of its own.
"""
from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

from scripts.agent.wire import requests
from scripts.config.hostconfig import build_host
from tests.support import scenario
from tests.support.agent_inproc import run_agent
from tests.support.procs import alive, wait_for


def host(ps, **keys):
    """A local host that only sees and signals what the test started (see above)."""
    base = dict(scenario.host_keys(ps), TARGETS=r"sandbox_roles\.py|sglang\.launch_server")
    base.update(keys)
    return dataclasses.replace(build_host("local", base, "test"), fake_gpus=str(ps.memdir))


def scenario_host(ps, alias="local", **keys):
    """A host scoped like `host`, its targets the scenario's server only (tests/support/scenario.py)."""
    base = scenario.host_keys(ps)
    base.update(keys)
    return dataclasses.replace(build_host(alias, base, "test"), fake_gpus=str(ps.memdir))


def env_file(ps, hosts_env, extra=""):
    """hosts.env for the alias `local`, scoped to the scenario (and `extra` lines)."""
    return hosts_env(scenario.env_lines(ps) + extra)


def assert_outcome(roles):
    """The scenario's rule: every target is gone, every bystander alive."""
    for role in scenario.TARGET_ROLES:
        if role in roles:
            assert not alive(roles[role]), f"target {role} survived"
    for role in scenario.BYSTANDER_ROLES:
        assert alive(roles[role]), f"bystander {role} was killed"


SERVER = """\
import os, signal, sys, time
args = sys.argv[1:]
def opt(name):
    return args[args.index(name) + 1] if name in args else None
if "--term-exit" in args:  # a real server's shutdown: SIGTERM ends it with exit 0
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
if opt("--hold"):
    fd = os.open(opt("--hold"), os.O_RDWR)
if "--child" in args and os.fork() == 0:
    time.sleep(600)
    os._exit(0)
if opt("--helper-after"):
    time.sleep(float(opt("--helper-after")))
    if os.fork() == 0:
        if os.fork() == 0:
            with open(opt("--ready") + ".helper", "w") as f:
                f.write(str(os.getpid()))
            os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(600)", opt("--ready")])
        os._exit(0)
    os.wait()
with open(opt("--ready") + ".tmp", "w") as f:
    f.write(str(os.getpid()))
os.rename(opt("--ready") + ".tmp", opt("--ready"))
time.sleep(600)
"""


def server_pkg(ps) -> Path:
    """A module `xsrv.launch_server` on a PYTHONPATH of the test's own."""
    pkg = ps.base / "pkg"
    (pkg / "xsrv").mkdir(parents=True, exist_ok=True)
    (pkg / "xsrv" / "__init__.py").write_text("")
    (pkg / "xsrv" / "launch_server.py").write_text(SERVER)
    return pkg


def server_cmd(ps, ready: Path, *flags: str) -> str:
    return f"PYTHONPATH={server_pkg(ps)} {sys.executable} -m xsrv.launch_server --ready {ready} {' '.join(flags)}"


def shell(ps, script: str) -> int:
    """`bash -c SCRIPT` in a session of its own; its pid (ended by the ProcessSet)."""
    proc = subprocess.Popen(["bash", "-c", script], start_new_session=True, stdin=subprocess.DEVNULL)
    ps.adopt(proc.pid)
    return proc.pid


def ready_pid(path: Path) -> int:
    """The pid a process wrote to `path`, once written: the file exists before its pid is in it."""
    return int(wait_for(lambda: path.exists() and path.read_text().strip(), f"{path.name} written"))


TEARDOWN = requests.Teardown(grace=2, timeout=10)


def teardown(ps, **given):
    """A teardown (grace 2 s, timeout 10 s) of the test's host: lowercase keywords are the
    request's fields (requests.Teardown: settle=1, stop_starters=True), uppercase ones the host's
    hosts.env keys (TARGETS=...)."""
    fields = {k: v for k, v in given.items() if k.islower()}
    keys = {k: v for k, v in given.items() if not k.islower()}
    return run_agent(host(ps, **keys), TEARDOWN.replace(**fields))
