"""A real systemd host over ssh: the auto-started vLLM unit, and phases under systemd-run.

Why real: `systemctl stop` versus a kill that `Restart=always` undoes, `is-enabled`,
`systemd-run` properties, `journalctl -u` and `reset-failed` behave as systemd makes them
behave; argv checks agreed with whatever the code assumed (tests/support/realhosts/)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO
from tests.support.realhosts import cgroups
from tests.support.realhosts.session import holders, hosted, invoke, require, text, wait_for
from tests.support.realhosts.systemd_host import INNER, SystemdHost, sweep

VLLM_UNIT = f"""[Unit]
Description=vLLM server (auto-started at boot)
[Service]
ExecStart={INNER}/bin/vllm serve /models/llama --workers 2
Restart=always
RestartSec=1
[Install]
WantedBy=multi-user.target
"""


# KillMode=process: `systemctl stop` ends the main process only; its worker stays, holding the GPUs
LEGACY_UNIT = f"""[Service]
ExecStart={INNER}/bin/vllm serve /models/old --workers 1
KillMode=process
"""


# crashes a second after each start; systemd starts it again 8 s later: between the two, no process
CRASHING_UNIT = f"""[Service]
ExecStart={INNER}/bin/vllm serve /models/crashing --exit-after 1
Restart=on-failure
RestartSec=8
"""
# the same through a shell and a launcher: what the unit will run is what the patterns see
CRASHING_SH_UNIT = CRASHING_UNIT.replace(f"ExecStart={INNER}/bin/vllm serve /models/crashing --exit-after 1",
                                         f'ExecStart=/bin/sh -c "exec /usr/bin/env A=1 {INNER}/bin/vllm serve '
                                         f'/models/crashing --exit-after 1"')


@pytest.fixture(scope="session")
def sd_host(tmp_path_factory):
    units = {"vllm.service": VLLM_UNIT, "legacy.service": LEGACY_UNIT, "crashing.service": CRASHING_UNIT,
             "crashing-sh.service": CRASHING_SH_UNIT}
    with hosted(SystemdHost(tmp_path_factory.mktemp("sd-host"), "sd-host", units=units)) as h:
        yield h


@pytest.fixture
def gpu(sd_host, hosts_env):
    hosts_env(sd_host.hosts_env("gpu"))
    return sd_host


def start_vllm(host):
    host.sh("systemctl daemon-reload && systemctl enable --now vllm.service", check=True)
    wait_for(lambda: len(holders(host)) >= 6, what="vllm and 2 workers holding both GPUs")


def test_restart_always_unit_is_stopped_through_systemd(gpu):
    start_vllm(gpu)
    plan = invoke("plan", "--host", "gpu")
    assert plan.returncode == 0, text(plan)
    assert "unit vllm.service will be stopped with systemctl" in text(plan), text(plan)
    res = invoke("teardown", "--host", "gpu", "--yes", "--grace", "5", "--settle", "1.5")
    out = text(res)
    assert res.returncode == 0, out
    assert "FREED and verified" in out
    assert "still enabled" in out and "--disable" in out
    assert gpu.sh("systemctl is-active vllm.service").stdout.strip() == "inactive"
    assert gpu.sh("systemctl show -p NRestarts --value vllm.service").stdout.strip() == "0"
    assert gpu.sh("systemctl is-enabled vllm.service").stdout.strip() == "enabled"
    assert holders(gpu) == []
    start_vllm(gpu)
    res = invoke("teardown", "--host", "gpu", "--yes", "--grace", "5", "--settle", "1.5", "--disable")
    assert res.returncode == 0, text(res)
    assert "systemctl disable --now vllm.service" in text(res)
    assert gpu.sh("systemctl is-enabled vllm.service").stdout.strip() == "disabled"
    assert gpu.sh("systemctl is-active vllm.service").stdout.strip() == "inactive"


def _sub(host, unit):
    return host.sh(f"systemctl show -p SubState --value {unit}").stdout.strip()


@pytest.mark.parametrize("unit", ["crashing.service", "crashing-sh.service"])
def test_a_restart_systemd_scheduled_with_no_process_yet_is_cancelled_not_freed(gpu, unit):
    """A server crashed a moment ago under Restart=on-failure: no process, the GPUs read free,
    and systemd starts it again in RestartSec. Its unit runs a target (its ExecStart is picked
    by the target patterns), so the plan stops it: FREED, and nothing comes back."""
    gpu.sh(f"systemctl daemon-reload && systemctl reset-failed {unit}; systemctl start {unit}",
           check=True)
    wait_for(lambda: _sub(gpu, unit) == "auto-restart", what="the unit between crash and restart")
    plan = invoke("plan", "--host", "gpu")
    assert f"unit {unit} will be stopped with systemctl" in text(plan), text(plan)
    assert "auto-restart" in text(plan)
    res = invoke("teardown", "--host", "gpu", "--yes", "--grace", "5", "--settle", "1.5")
    out = text(res)
    assert res.returncode == 0, out
    assert f"systemctl stop {unit}" in out, out
    assert _sub(gpu, unit) in ("dead", "failed"), _sub(gpu, unit)
    time.sleep(9)  # past RestartSec: nothing was scheduled any more
    assert gpu.sh(f"systemctl is-active {unit}").stdout.strip() in ("inactive", "failed")
    assert holders(gpu) == []


def test_what_systemctl_stop_leaves_alive_is_signalled_and_audited(gpu):
    gpu.sh("systemctl start legacy.service", check=True)
    wait_for(lambda: len(holders(gpu)) == 4, what="the legacy server and its worker holding both GPUs")
    worker = int(gpu.sh("systemctl show -p MainPID --value legacy.service").stdout)
    worker = [int(p) for p in gpu.sh(f"pgrep -P {worker}").stdout.split()][0]
    # a 600 s grace: had the teardown waited it out, invoke() would have passed its deadline; the
    # worker got SIGTERM when the stop had ended
    res = invoke("teardown", "--host", "gpu", "--yes", "--grace", "600", "--settle", "0.5", "--json")
    assert res.returncode == 0, text(res)
    actions = [(a["signal"], a["pid"], a["result"]) for a in json.loads(res.stdout)["gpu"]["actions"]]
    assert ("SIGTERM", worker, "sent") in actions, actions
    assert [a for a in actions if a[0] == "systemctl stop legacy.service" and a[2] == "exit 0"], actions
    assert holders(gpu) == []


def phase_keys(name: str, argv: list, **fields) -> dict:
    keys = {f"PHASE_{name}_ARGV": json.dumps(argv), f"PHASE_{name}_READY": "holding"}
    keys.update({f"PHASE_{name}_{k}": v for k, v in fields.items()})
    return keys


HOLDER = f"{INNER}/bin/gpu-holder"
PHASES = {
    # a trainer whose worker ignores SIGTERM (stuck in a CUDA call), with a CPU prep job beside it
    **phase_keys("TRAIN", [HOLDER, "--workers", "1", "--child-ignores-term"], STOP_TIMEOUT="3",
                 PREP='["exec sleep 301"]'),
    # alive but never holding a GPU: "holding" must not read as ready
    **phase_keys("IDLE", ["sleep", "302"], READY_TIMEOUT="1", STOP_TIMEOUT="3"),
    # ignores SIGTERM altogether: systemd SIGKILLs it after TimeoutStopSec and the unit ends failed
    **phase_keys("STUCK", [HOLDER, "--ignore-term"], STOP_TIMEOUT="1"),
}


def unit_state(host, unit: str) -> str:
    return host.sh(f"systemctl show -p ActiveState --value {unit}").stdout.strip()


def test_phases_under_systemd_run(sd_host, hosts_env):
    hosts_env(sd_host.hosts_env("gpu", extra=PHASES))
    pivot = ["pivot", "--host", "gpu", "--yes", "--grace", "3", "--settle", "0.5"]
    res = invoke(*pivot, "--to", "idle")
    assert res.returncode == 1, text(res)  # alive, never holding: not ready
    assert "not yet holding a GPU" in text(res)
    assert invoke("stop", "--host", "gpu", "--phase", "idle").returncode == 0
    assert unit_state(sd_host, "gpu-pivot-idle") == "inactive"

    res = invoke("start", "--host", "gpu", "--phase", "train")  # start: a pivot would wait for the prep job
    assert res.returncode == 0, text(res)
    assert unit_state(sd_host, "gpu-pivot-train") == "active"
    wait_for(lambda: len(holders(sd_host)) == 4, what="the trainer and its worker holding both GPUs")
    assert sd_host.sh("pgrep -x -f 'sleep 301'").returncode == 0  # the prep job runs
    logs = invoke("logs", "--host", "gpu", "--phase", "train")
    assert logs.returncode == 0 and "holding /dev/nvidia0" in text(logs), text(logs)
    res = invoke("stop", "--host", "gpu", "--phase", "train")
    assert res.returncode == 0, text(res)
    # KillMode=mixed: the SIGTERM-ignoring worker is SIGKILLed when main exits; a stop that had run
    # into its STOP_TIMEOUT would leave the unit failed, not inactive
    assert unit_state(sd_host, "gpu-pivot-train") == "inactive"
    assert sd_host.sh("pgrep -x -f 'sleep 301'").returncode == 1, "the prep job outlived the phase stop"
    assert holders(sd_host) == []

    for _ in range(2):  # it ends failed each time; the next start must still work (reset-failed)
        res = invoke(*pivot, "--to", "stuck")
        assert res.returncode == 0, text(res)
        assert "holding a GPU" in text(res)
        res = invoke("stop", "--host", "gpu", "--phase", "stuck")
        assert res.returncode == 0, text(res)
        assert "ended failed" in text(res) and "reset-failed" in text(res), text(res)
        assert "timed out. Killing" in sd_host.sh("journalctl -u gpu-pivot-stuck -o cat").stdout
        assert holders(sd_host) == [] and unit_state(sd_host, "gpu-pivot-stuck") == "inactive"


def test_units_never_stopped_through_systemd():
    """sshd, a login session's scope and a user's own manager are never the plan's to stop."""
    from scripts.agent.teardown.plan import stoppable_unit as _unit_to_stop

    assert _unit_to_stop("vllm.service") == "vllm.service"
    assert _unit_to_stop("session-3.scope") is None and _unit_to_stop("user@0.service") is None
    assert _unit_to_stop("sshd.service") is None and _unit_to_stop("ssh.service") is None


def test_a_crashed_runs_leftovers_are_swept_and_a_live_runs_are_not():
    """A run killed mid-session leaves its host's cgroups (and whatever is in them); the next
    session's sweep ends those processes and removes them, but never another live run's."""
    require()
    crashed = cgroups.make(f"crashed-{os.getpid()}", owner="999999999-1")  # no such pid: its owner is gone
    live = cgroups.make("live")
    proc = subprocess.Popen(["sleep", "600"])
    try:
        for d in crashed:
            (d / "cgroup.procs").write_text(str(proc.pid))
        # another test process booting a host meanwhile sweeps too: it must leave this test's
        # made-up crashed run to this test (CI: a parallel worker's sweep removed it mid-test)
        other = subprocess.run([sys.executable, "-c",
                                "from tests.support.realhosts.systemd_host import sweep; print(sweep())"],
                               cwd=REPO, capture_output=True, text=True, timeout=60)
        assert other.returncode == 0 and all(d.exists() for d in crashed), other.stdout + other.stderr
        swept = sweep()
        assert {str(d) for d in crashed} <= set(swept)
        assert proc.wait(5) == -signal.SIGKILL
        assert not any(d.exists() for d in crashed)
        assert all(d.exists() for d in live)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        assert cgroups.kill_and_remove(live) == []
