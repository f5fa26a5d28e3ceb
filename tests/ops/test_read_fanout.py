"""The read-only commands (status, verify, plan, ping) read a fleet in one wave.

Rule: a command that signals nothing is bounded only by --fanout (default READ_FANOUT, 64), so
a fleet of more than the teardown's bound (16) is not read in two waves; `--fanout N` holds it
to N hosts at once. Each host here is an alias of this machine whose interpreter is a wrapper:
it marks its start in a shared directory, waits for a barrier (every host started, or 20 s),
records how many hosts had started when it went on, then runs the real agent. In one wave
every host sees all of them; in waves of 16 the first wave would see 16.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from scripts.config import defaults
from tests.conftest import invoke
from tests.support import scenario
from tests.support.procs import ProcessSet

HOSTS = defaults.FANOUT + 4  # more than the teardown's bound, fewer than the read bound

WRAPPER = """#!/bin/sh
# a host of the fleet: mark the start, wait for the barrier, record what was seen, run the agent
d={marks}; : > "$d/$$"; i=0
while [ "$(ls "$d" | wc -l)" -lt {barrier} ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done
ls "$d" | wc -l > "{seen}/$$"
exec python3 "$@"
"""


def _fleet(base: Path, hosts_env, ps: ProcessSet, barrier: int, n: int) -> Path:
    """n aliases n01.. of this machine, each through the barrier wrapper; returns the dir of
    what each host saw."""
    marks, seen = base / "marks", base / "seen"
    marks.mkdir()
    seen.mkdir()
    wrapper = base / "python3"
    wrapper.write_text(WRAPPER.format(marks=marks, seen=seen, barrier=barrier))
    wrapper.chmod(0o755)
    keys = dict(scenario.host_keys(ps), PYTHON=str(wrapper))
    hosts_env("".join(f"N{i:02d}_{k}='{v}'\n" for i in range(1, n + 1) for k, v in keys.items()))
    return seen


def _seen(seen: Path) -> list:
    return sorted(int(p.read_text()) for p in seen.iterdir())


@pytest.fixture
def idle(tmp_path):
    ps = ProcessSet(tmp_path / "idle")
    ps.role("hold", title="nvidia-persistenced")  # a protected holder: the scan has a GPU and a holder
    yield ps
    ps.kill_all()


@pytest.mark.parametrize("command", [["status", "--brief"], ["verify", "--brief"], ["plan"]],
                         ids=["status", "verify", "plan"])
def test_a_fleet_larger_than_the_teardown_bound_is_read_in_one_wave(tmp_path, hosts_env, idle, command):
    seen = _fleet(tmp_path, hosts_env, idle, barrier=HOSTS, n=HOSTS)
    res = invoke(*command, "--host", f"n[01-{HOSTS:02d}]", timeout=90)
    out = res.stdout.decode() + res.stderr.decode()
    assert res.returncode == 0, out
    # every host had started before any went on: none waited for a wave before it to end
    assert _seen(seen) == [HOSTS] * HOSTS, out


def test_fanout_holds_a_read_to_that_many_hosts_at_once(tmp_path, hosts_env, idle):
    n = 4
    seen = _fleet(tmp_path, hosts_env, idle, barrier=1, n=n)
    res = invoke("status", "--brief", "--fanout", "1", "--host", f"n[01-{n:02d}]")
    assert res.returncode == 0, res.stdout.decode() + res.stderr.decode()
    # one at a time: the k-th host started after the k-1 before it, and saw k marks
    assert _seen(seen) == list(range(1, n + 1))


@pytest.mark.parametrize(("command", "bad"), [("status", "0"), ("verify", "-3"), ("plan", "many"), ("ping", "1.5")])
def test_a_bad_fanout_is_one_line_and_exit_2_before_any_host(command, bad, hosts_env, tmp_path):
    mark, py = tmp_path / "ran", tmp_path / "python3"
    py.write_text(f"#!/bin/sh\n: > {mark}\nexec python3 \"$@\"\n")  # leaves a mark if the host is reached
    py.chmod(0o755)
    hosts_env(f"N01_PYTHON='{py}'\nN01_DEVICES='/proc/gpu-pivot-none/x'\n")
    res = invoke(command, "--host", "n01", f"--fanout={bad}")
    err = res.stderr.decode().strip()
    assert res.returncode == 2, err
    assert len(err.splitlines()) == 1 and f"'{bad}'" in err and "--fanout" in err
    assert not mark.exists() and not res.stdout.strip()
