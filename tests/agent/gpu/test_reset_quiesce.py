"""`reset --quiesce` (issue 44, item 4): the real agent, run as a subprocess, with stand-ins for
what must never be touched here (a GPU reset, the machine's own systemd units, GPU settings):
the NVML stand-in, and a stand-in `systemctl` and `nvidia-smi` first on PATH
(tests/support/standin/reset) that write each call to one log with the NVML stand-in's set
calls, so the order of the whole sequence is read from that log. A daemon outside systemd is
a real process, named and never signalled.
"""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys

import pytest

from scripts.agent.wire import codes, records
from scripts.views import reset as reset_view
from tests.support import pidns
from tests.support.gpu_standins import AGENT, mps_program
from tests.support.paths import REPO, STANDIN

PIDNS = pidns.__file__

GPU = {"uuid": "GPU-0", "name": "NVIDIA H200", "bus": "00000000:19:00.0", "used": 0, "total": 150754820096,
       "processes": [], "recovery_action": 0, "remapped_rows": [0, 0, 0, 0], "mig_mode": [0, 0], "persistence": 1,
       "compute_mode": 0, "power_limit_mw": 700000}
UNITS = ("nvidia-persistenced.service", "nvidia-dcgm.service", "dcgm-exporter.service")


@pytest.fixture
def host(tmp_path):
    """Fake device files, active stand-in units, the log, and the agent run against them in a
    PID namespace of its own: the daemons it looks for are those of that namespace (this
    machine's other tests start processes named nvidia-persistenced)."""
    why = pidns.usable()
    if why:
        pytest.skip(f"needs a PID namespace of its own: {why}")
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "nvidia0").write_bytes(b"")
    units = tmp_path / "units"
    units.mkdir()
    for unit in UNITS:
        (units / unit).write_bytes(b"")
    log = tmp_path / "calls.jsonl"
    rec = tmp_path / "recording.json"
    env = dict(os.environ, PATH=f"{STANDIN / 'reset'}{os.pathsep}{os.environ['PATH']}", GPU_PIVOT_STANDIN_LOG=str(log),
               GPU_PIVOT_STANDIN_UNITS=str(units), GPU_PIVOT_NVML_RECORDING=str(rec),
               PYTHONPATH=os.pathsep.join([str(STANDIN / "nvml"), os.environ.get("PYTHONPATH", "")]))

    def run(*args, reset_exit=0, daemon=None, cgroups=(), **extra):
        """(exit, document, calls); `daemon`: a program started first in the namespace, whose
        pid inside it and whether it outlived the agent are in run.daemon; `cgroups`: the
        cgroup directories it moves into first."""
        rec.write_text(json.dumps({"gpus": [dict(GPU)], "calls_log": str(log)}))
        agent_argv = [sys.executable, str(AGENT), "reset", "--json", "--gpu", "0", f"--devices={tmp_path}/dev/nvidia*",
                      "--fake-devices", *args]
        script = " ".join(map(shlex.quote, agent_argv)) + f" > {tmp_path}/out.json; echo $? > {tmp_path}/rc"
        if daemon:
            move = "".join(f"echo $! > {shlex.quote(str(d))}/cgroup.procs; " for d in cgroups)
            script = (f"{shlex.quote(daemon)} -c 'import time; time.sleep(120)' & echo $! > {tmp_path}/daemon; "
                      f"{move}{script}; kill -0 $(cat {tmp_path}/daemon) && touch {tmp_path}/daemon-alive")
        subprocess.run([sys.executable, str(PIDNS), "--", "/bin/sh", "-c", script], check=True, timeout=120,
                       env=dict(env, GPU_PIVOT_STANDIN_RESET_EXIT=str(reset_exit), **extra), cwd=REPO)
        calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
        log.unlink(missing_ok=True)
        if daemon:
            run.daemon = (int((tmp_path / "daemon").read_text()), (tmp_path / "daemon-alive").exists())
        return (int((tmp_path / "rc").read_text()), json.loads((tmp_path / "out.json").read_text()),
                [_short(c) for c in calls])

    run.units = units
    return run


def _short(c):
    if c["call"] in ("systemctl", "nvidia-smi"):
        return " ".join([c["call"], *c["args"]])
    return "%s(%s)" % (c["call"], ", ".join(map(str, c["args"])))


STOP_AND_OFF = ["systemctl stop nvidia-persistenced.service", "systemctl stop nvidia-dcgm.service",
                "systemctl stop dcgm-exporter.service", "nvmlDeviceSetPersistenceMode(0)",
                "nvidia-smi --gpu-reset -i 0"]
START_AND_ON = ["systemctl start dcgm-exporter.service", "systemctl start nvidia-dcgm.service",
                "systemctl start nvidia-persistenced.service", "nvmlDeviceSetPersistenceMode(1)"]


def test_quiesce_stops_resets_and_puts_back_in_that_order(host):
    code, doc, calls = host("--yes", "--quiesce")
    assert code == 0, (doc["note"], doc["checks"], doc["quiesce"], calls)
    assert calls == STOP_AND_OFF + START_AND_ON
    q = records.read("reset", code, doc).quiesce
    assert q and [d["unit"] for d in q["daemons"]] == list(UNITS) and all(d["restored"] for d in q["daemons"])
    assert q["health"]["verdict"] == "ok"
    assert sorted(os.listdir(host.units)) == sorted(UNITS)
    shown = reset_view.report("gpu1", records.read("reset", code, doc))
    assert "stop nvidia-dcgm.service (nv-hostengine (DCGM))" in shown and "health after: ok" in shown


def test_a_failed_reset_still_puts_back_every_daemon_and_persistence_and_exits_12(host):
    code, doc, calls = host("--yes", "--quiesce", reset_exit=255)
    assert code == codes.EXIT_REBOOT_NEEDED == 12
    assert calls == STOP_AND_OFF + START_AND_ON
    assert "reboot needed" in doc["note"] and "every daemon and setting put back" in doc["note"]
    assert sorted(os.listdir(host.units)) == sorted(UNITS)
    shown = reset_view.report("gpu1", records.read("reset", code, doc))
    assert "REBOOT NEEDED" in shown and "In use by another client" in shown


def test_a_daemon_that_does_not_start_again_is_named_and_exits_1(host):
    code, doc, calls = host("--yes", "--quiesce", GPU_PIVOT_STANDIN_FAIL_START="nvidia-dcgm.service")
    assert code == codes.EXIT_FAILED
    assert calls == STOP_AND_OFF + START_AND_ON  # the others are still put back
    assert "NOT put back: systemctl start nvidia-dcgm.service exited 1" in doc["note"]


def test_a_dry_run_names_the_daemons_and_runs_nothing_and_the_flag_is_never_a_default(host):
    code, doc, calls = host("--quiesce")
    assert code == 0 and not calls and not doc["ran"]
    assert [d["unit"] for d in doc["quiesce"]["daemons"]] == list(UNITS)
    shown = reset_view.report("gpu1", records.read("reset", code, doc))
    assert "would stop: nvidia-persistenced.service" in shown
    code, doc, calls = host("--yes")  # no --quiesce: no daemon is touched
    assert code == 0 and calls == ["nvidia-smi --gpu-reset -i 0"] and doc["quiesce"] is None


def test_a_daemon_outside_systemd_is_named_and_refused_never_signalled(host, tmp_path):
    exe = mps_program(tmp_path, "nv-hostengine")  # a root-owned program of that name, as DCGM installs it
    code, doc, calls = host("--yes", "--quiesce", daemon=exe)
    pid, alive = host.daemon
    assert alive, "the daemon was signalled"
    assert code == codes.EXIT_FAILED and not doc["ran"] and not calls
    assert f"nv-hostengine (DCGM) (pid {pid}) is not run by a systemd service" in doc["note"]
    assert "nothing was stopped or reset" in doc["note"]


def test_a_daemon_in_a_users_own_unit_is_refused_and_no_system_unit_of_that_name_is_stopped(host, tmp_path, layout):
    """A process of a daemon's name in a unit of a user's manager (systemd-run --user
    --unit=ssh): its unit's name is not the system manager's; `systemctl stop ssh.service`
    would stop the host's sshd."""
    exe = mps_program(tmp_path, "nv-hostengine")
    user_unit = layout.prepare("user.slice/user-1000.slice/user@1000.service/app.slice/ssh.service")
    code, doc, calls = host("--yes", "--quiesce", daemon=exe, cgroups=user_unit)
    assert not any("ssh.service" in c for c in calls), calls
    pid, alive = host.daemon
    assert alive and code == codes.EXIT_FAILED and not doc["ran"]
    assert f"nv-hostengine (DCGM) (pid {pid}) is not run by a systemd service" in doc["note"]
