"""A phase's checkpoint stop in hosts.env (config/phases.py): each bad value is one line naming
it, exit 2, before anything runs; a good one reaches every teardown and plan of the host, and
the wire's deadlines grow by its wait (reach/transport.py)."""
from __future__ import annotations

import dataclasses

import pytest

from scripts.agent.wire import frame, requests
from scripts.config.errors import ConfigError
from scripts.config.hostconfig import build_host
from scripts.config.phases import build_phase
from scripts.reach import transport
from tests.conftest import invoke

GOOD = {"CMD": "python3 train.py", "STOP_SIGNAL": "USR1", "STOP_CHECKPOINT": "/data/ckpt/step-*.pt"}


@pytest.mark.parametrize("keys,msg", [
    ({"STOP_SIGNAL": "USR9"}, "STOP_SIGNAL='USR9': not a signal name"),
    ({"STOP_SIGNAL": "KILL"}, "STOP_SIGNAL='KILL': not a signal name"),
    ({"STOP_SIGNAL_TO": "leader"}, "STOP_SIGNAL_TO='leader': must be top (what the launch command started) or all"),
    ({"STOP_CHECKPOINT": "ckpt/*.pt"}, "STOP_CHECKPOINT='ckpt/*.pt': must be an absolute path"),
    ({"STOP_DEADLINE": "soon"}, "STOP_DEADLINE='soon': must be a positive number of seconds"),
    ({"STOP_DEADLINE": "99999"}, "STOP_DEADLINE='99999': at most 3600 seconds"),
    ({"STOP_SIGNAL": None, "STOP_CHECKPOINT": None, "STOP_IDLE": "true"}, "STOP_IDLE='true': needs STOP_SIGNAL"),
    ({"STOP_CHECKPOINT": None}, "STOP_SIGNAL='USR1': needs STOP_CHECKPOINT (a glob) or STOP_IDLE"),
])
def test_a_bad_stop_field_is_one_line_naming_it(keys, msg):
    fields = {k: v for k, v in dict(GOOD, **keys).items() if v is not None}
    with pytest.raises(ConfigError) as err:
        build_phase("gpu1", "train", fields)
    assert str(err.value).startswith("GPU1_PHASE_TRAIN_") and msg in str(err.value)


def test_a_bad_stop_in_hosts_env_is_exit_2_before_anything(hosts_env):
    hosts_env("LOCAL_PHASE_X_CMD='true'\nLOCAL_PHASE_X_STOP_SIGNAL='USR9'\nLOCAL_PHASE_X_STOP_IDLE='true'\n")
    res = invoke("stop", "--host", "local", "--phase", "x")
    lines = res.stderr.decode().strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and "LOCAL_PHASE_X_STOP_SIGNAL='USR9'" in lines[0]


def test_every_teardown_and_plan_carries_the_stops_and_waits_for_them():
    train = build_phase("gpu1", "train", dict(GOOD, STOP_DEADLINE="600"))
    serve = build_phase("gpu1", "serve", {"CMD": "serve"})
    host = dataclasses.replace(build_host("gpu1", {}, "test"), phases={"train": train, "serve": serve})
    assert train.stop_deadline == 600 and serve.checkpoint_stop() is None
    stop = {"phase": "train", "signal": "USR1", "to": "top", "checkpoint": "/data/ckpt/step-*.pt", "idle": None,
            "deadline_s": 600.0}
    assert transport.checkpoint_stops(host) == (stop,)
    for request in (requests.Plan(), requests.Teardown()):
        argv = transport.agent_argv(host, transport.for_host(host, request), "ab12", False)
        assert argv.count("--checkpoint-stop=" + frame.encode_spec(stop)) == 1
    scan = transport.agent_argv(host, transport.for_host(host, requests.Scan()), "ab12", False)
    assert not any(a.startswith("--checkpoint-stop") for a in scan)
    plain = requests.Teardown()
    assert transport.for_host(host, plain).deadline_s() == plain.deadline_s() + 600
    stop_plain = requests.PhaseStop(spec=serve.spec(), operator="me").deadline_s()
    assert requests.PhaseStop(spec=train.spec(), operator="me").deadline_s() == stop_plain + 600
