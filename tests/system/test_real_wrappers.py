"""Servers under a wrapper, on a real systemd host and a real docker daemon: stopped for good.

Why real: what brings a server back is systemd's Restart=always and docker's restart policy,
not ours to assume. Each shape came from a host where the teardown signalled the server
directly and the manager started it again within the settle window (NOT FREE, exit 1):
- a unit whose ExecStart is `/bin/bash -c "cd /srv && . ./env.sh && python3 -m
  sglang.launch_server ...; echo server exited"` (Restart=always);
- a unit running a bash script that loops `vllm serve ...; sleep 1` (Restart=always, and
  Restart=on-failure: the loop is the unit's main process, the unit is what restarts);
- `docker run --init --restart=always ... vllm serve ...` (docker-init is the container's PID 1).
Each must end FREED (exit 0) with the unit or container named, and still be down 5 s later.
"""
from __future__ import annotations

import json
import shlex
import time

import pytest

from tests.support.realhosts.docker_host import IMAGE, docker_host, import_image
from tests.support.realhosts.session import holders, hosted, invoke, text, wait_for
from tests.support.realhosts.systemd_host import INNER, SystemdHost

SGLANG_WRAPPED = f"""[Service]
ExecStart=/bin/bash -c "cd {INNER}/srv && . ./env.sh && python3 -m sglang.launch_server --port 30000; echo exited"
Restart=always
RestartSec=1
"""

VLLM_LOOP = f"""[Service]
ExecStart=/bin/bash {INNER}/srv/loop.sh
Restart=always
RestartSec=1
"""
# the same loop with Restart=on-failure: the unit holds the target, so it is the unit's stop, not
# a --stop-starters hint (the loop is the unit's main process)
VLLM_LOOP_ON_FAILURE = VLLM_LOOP.replace("Restart=always", "Restart=on-failure")
LOOP_SH = f"while true; do {INNER}/bin/vllm serve /models/looped; sleep 1; done\n"
# the stand-in server (tests/support/realhosts/gpu_holder.py) run as a module, as SGLang is
LAUNCH_SERVER = f"import runpy\nrunpy.run_path('{INNER}/bin/gpu-holder', run_name='__main__')\n"
AFTER_S = 5.0


def _files(workdir):
    srv = workdir / "srv"
    (srv / "sglang").mkdir(parents=True)
    (srv / "sglang" / "__init__.py").write_text("")
    (srv / "sglang" / "launch_server.py").write_text(LAUNCH_SERVER)
    (srv / "env.sh").write_text(f"export PYTHONPATH={INNER}/srv\n")
    (srv / "loop.sh").write_text(LOOP_SH)


@pytest.fixture(scope="session")
def wrapped_host(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("wrapped-host")
    _files(workdir)
    units = {"sglang-wrapped.service": SGLANG_WRAPPED, "vllm-loop.service": VLLM_LOOP,
             "vllm-loop-on-failure.service": VLLM_LOOP_ON_FAILURE}
    with hosted(SystemdHost(workdir, "wrapped-host", units=units)) as h:
        yield h


def _active(host, unit):
    return host.sh(f"systemctl is-active {unit}").stdout.strip()


def _restarts(host, unit):
    return host.sh(f"systemctl show -p NRestarts --value {unit}").stdout.strip()


@pytest.mark.parametrize("unit", ["sglang-wrapped.service", "vllm-loop.service", "vllm-loop-on-failure.service"])
def test_a_wrapped_server_in_a_restart_always_unit_is_stopped_through_systemd(wrapped_host, hosts_env, unit):
    host = wrapped_host
    hosts_env(host.hosts_env("gpu"))
    host.sh(f"systemctl daemon-reload && systemctl start {unit}", check=True)
    wait_for(lambda: len(holders(host)) >= 2, what=f"{unit} holding both GPUs")
    plan = invoke("plan", "--host", "gpu", "--json")
    assert plan.returncode == 0, text(plan)
    doc = json.loads(plan.stdout)["gpu"]["plan"]
    assert [u["unit"] for u in doc["units"]] == [unit], doc
    assert {t["via"] for t in doc["targets"]} == {f"systemctl stop {unit}"}, doc["targets"]
    assert any(t["reason"].startswith("wraps target(s)") for t in doc["targets"]), doc["targets"]
    assert [s for s in doc["starters"] if s["fate"] != "watch"] == []  # its wrappers go with the unit
    res = invoke("teardown", "--host", "gpu", "--yes", "--grace", "5")
    out = text(res)
    assert res.returncode == 0, out
    assert f"systemctl stop {unit}" in out and "FREED and verified" in out
    time.sleep(AFTER_S)  # what the incident saw come back: Restart=always within a second
    assert _active(host, unit) == "inactive", host.sh(f"journalctl -u {unit} -o cat | tail -5").stdout
    assert _restarts(host, unit) == "0"
    assert holders(host) == []


# a `vllm` for the busybox image: holds both GPUs, exits 0 on SIGTERM, sleeps in a child
VLLM_SH = "#!/bin/sh\nexec 3<>/dev/nvidia0 4<>/dev/nvidia1\ntrap 'exit 0' TERM\nwhile :; do sleep 1 & wait $!; done\n"


@pytest.fixture(scope="session")
def init_docker(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("docker-init-host")
    (workdir / "vllm.sh").write_text(VLLM_SH)
    (workdir / "vllm.sh").chmod(0o755)
    (workdir / "crash.sh").write_text("#!/bin/sh\nexit 1\n")
    (workdir / "crash.sh").chmod(0o755)
    tools = ("dockerd", "containerd", "docker", "busybox", "docker-init")
    with hosted(docker_host(workdir, "docker-init-host"), tools=tools) as host:
        import_image(host)
        yield host


def _docker(host, fmt, name="vllm-init"):
    return host.sh(f"docker inspect -f {shlex.quote(fmt)} {name}").stdout.strip()


def test_a_server_under_docker_init_with_restart_always_is_stopped_through_docker(init_docker, hosts_env):
    host = init_docker
    hosts_env(host.hosts_env("gpu"))
    vols = " ".join(f"-v /dev/nvidia{i}:/dev/nvidia{i}" for i in (0, 1))
    host.sh(f"docker rm -f vllm-init >/dev/null 2>&1; docker run -d --init --name vllm-init --restart=always "
            f"--network none {vols} -v {INNER}/vllm.sh:/bin/vllm:ro {IMAGE} vllm serve /models/x", check=True)
    wait_for(lambda: holders(host), what="the container holding the GPUs")
    cid = _docker(host, "{{.Id}}")
    plan = invoke("plan", "--host", "gpu", "--json")
    doc = json.loads(plan.stdout)["gpu"]["plan"]
    assert [(c["id"], c["name"]) for c in doc["containers"]] == [(cid, "vllm-init")], doc
    assert {t["via"] for t in doc["targets"]} == {f"docker stop vllm-init ({cid[:12]})"}, doc["targets"]
    assert any("an init that waits for them" in t["reason"] for t in doc["targets"]), doc["targets"]
    shown = text(invoke("plan", "--host", "gpu"))
    assert f"container vllm-init ({cid[:12]}) will be stopped with docker stop" in shown, shown
    restarts = _docker(host, "{{.RestartCount}}")
    res = invoke("teardown", "--host", "gpu", "--yes", "--grace", "5")
    out = text(res)
    assert res.returncode == 0, out
    assert "FREED and verified" in out and "vllm-init" in out, out
    time.sleep(AFTER_S)
    assert _docker(host, "{{.State.Status}}") == "exited"
    assert _docker(host, "{{.RestartCount}}") == restarts
    assert holders(host) == []


def test_a_container_docker_is_restarting_with_no_process_yet_is_stopped_not_freed(init_docker, hosts_env):
    """A `--restart=always` server that crashes at once: docker waits longer before each restart
    (0.1 s, doubling), and in that wait the container has no process. Its command is picked by
    the target patterns, so the plan stops it (docker stop ends the pending restart): FREED, and
    it is not started again."""
    host = init_docker
    hosts_env(host.hosts_env("gpu"))
    host.sh(f"docker rm -f vllm-crash >/dev/null 2>&1; docker run -d --name vllm-crash --restart=always "
            f"--network none -v {INNER}/crash.sh:/bin/vllm:ro {IMAGE} vllm serve /models/c", check=True)

    def backing_off():
        return _docker(host, "{{.State.Status}} {{.RestartCount}}", "vllm-crash").split()

    wait_for(lambda: (lambda s: s and s[0] == "restarting" and int(s[1]) >= 5)(backing_off()),
             what="docker restarting it with a wait of seconds", timeout=90)
    res = invoke("teardown", "--host", "gpu", "--yes", "--grace", "5")
    out = text(res)
    try:
        assert res.returncode == 0, out
        assert "docker stop" in out and "vllm-crash" in out, out
        restarts = backing_off()[1]
        time.sleep(8)  # longer than the wait docker had scheduled
        assert backing_off() == ["exited", restarts]
    finally:
        host.sh("docker rm -f vllm-crash >/dev/null 2>&1")
