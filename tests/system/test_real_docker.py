"""A real docker daemon over ssh: a `--restart=always` container holding the GPUs.

Why real: `docker stop` versus a kill the restart policy undoes, and whether a stopped
container comes back when the daemon restarts, are docker's behaviour, not ours to assume
(tests/support/realhosts/docker_host.py)."""
from __future__ import annotations

import shlex

import pytest

from tests.support.realhosts.docker_host import IMAGE, docker_host, import_image
from tests.support.realhosts.session import holders, hosted, invoke, text, wait_for

# busybox sh as the container's PID 1: it acts on SIGTERM only through a trap
HOLD = "trap 'exit 0' TERM; exec 3<>/dev/nvidia0 4<>/dev/nvidia1; while :; do sleep 1 & wait $!; done"


@pytest.fixture(scope="session")
def dk_host(tmp_path_factory):
    tools = ("dockerd", "containerd", "docker", "busybox")
    with hosted(docker_host(tmp_path_factory.mktemp("docker-host")), tools=tools) as host:
        import_image(host)
        yield host


def state(host, name="vllm") -> str:
    return host.sh(f"docker inspect -f '{{{{.State.Status}}}}' {name}").stdout.strip()


def test_restart_always_container_is_stopped_through_docker(dk_host, hosts_env):
    hosts_env(dk_host.hosts_env("gpu"))
    vols = " ".join(f"-v /dev/nvidia{i}:/dev/nvidia{i}" for i in (0, 1))
    dk_host.sh(f"docker rm -f vllm >/dev/null 2>&1; docker run -d --name vllm --restart=always --network none {vols} "
               f"{IMAGE} sh -c {shlex.quote(HOLD)}", check=True)
    wait_for(lambda: holders(dk_host), what="the container holding the GPUs")
    res = invoke("teardown", "--host", "gpu", "--yes", "--grace", "5", "--settle", "1")
    out = text(res)
    assert res.returncode == 0, out
    assert "docker stop" in out and "comes back when docker restarts unless its policy changes" in out, out
    assert state(dk_host) == "exited" and holders(dk_host) == []
    dk_host.sh("systemctl restart docker", check=True)  # what the report warned of
    wait_for(lambda: state(dk_host) == "running", what="the container back after a docker restart")
    wait_for(lambda: holders(dk_host), what="the container holding the GPUs again")

    res = invoke("teardown", "--host", "gpu", "--yes", "--grace", "5", "--settle", "1", "--disable")
    out = text(res)
    assert res.returncode == 0, out
    assert "docker update --restart=no" in out and "restart policy no: it stays stopped" in out, out
    dk_host.sh("systemctl restart docker", check=True)
    assert dk_host.sh("docker inspect -f '{{.HostConfig.RestartPolicy.Name}}' vllm").stdout.strip() == "no"
    assert state(dk_host) == "exited" and holders(dk_host) == []
