"""Each agent subcommand's required flags, with values it accepts: what a test gives a
subcommand's parser to reach the rest of it (the wire's table and the typed options both)."""
from scripts.agent.wire import frame, requests

REQUIRED = {
    "phase-start": ["--spec", frame.encode_spec({"name": "x"})],
    "phase-ready": ["--spec", frame.encode_spec({"name": "x"})],
    "phase-stop": ["--spec", frame.encode_spec({"name": "x"})],
    "phase-logs": ["--spec", frame.encode_spec({"name": "x"})],
    "smoke": ["--spec", frame.encode_spec({"name": "x"})],
    "gates": ["--spec", frame.encode_spec({"name": "x"})],
    "deploy": ["--spec", frame.encode_spec({"name": "x"}), "--action", "apply"],
    "drain": ["--url", "http://127.0.0.1:9/metrics"],
    "lint": ["--argv", "[]"],
    "gpu-settings": ["--settings", '{"power_limit_w": 700}'],
    "release": ["--token", "0123456789abcdef"],
}

_SPEC = {"name": "x", "gates": ["true"], "stop_timeout": 1}
# One request per subcommand with every field given: each flag the local side can send.
FULL = {r.name: r for r in (
    requests.Ping(), requests.Scan(), requests.Verify(wait=1, max_used_mib=2, probe_mib=64),
    requests.Plan(match=("-x",), only_matching=True, disable=True, stop_starters=True, all_users=True,
                  checkpoint_stops=({"phase": "p", "signal": "USR1", "deadline_s": 5.0},)),
    requests.Teardown(match=("-x",), only_matching=True, disable=True, stop_starters=True, all_users=True,
                      checkpoint_stops=({"phase": "p", "signal": "USR1", "deadline_s": 5.0},), grace=1, timeout=2,
                      settle=0.5, wait_lock=1, max_used_mib=3, operator="me", mps_quit=True, keep_shm=True,
                      approved="1:2", hold=(30.0, "p", "0123456789abcdef")),
    requests.PhaseStart(spec=_SPEC), requests.PhaseReady(spec=_SPEC, wait=1, intruders=True),
    requests.PhaseStop(spec=_SPEC, operator="me"), requests.PhaseLogs(spec=_SPEC, lines=5, follow=True),
    requests.Smoke(spec=_SPEC), requests.Drain(url="http://127.0.0.1:9/metrics", timeout=1),
    requests.Gates(spec=_SPEC), requests.Lint(command="[]", gpus="0", max_used_mib=1),
    requests.Deploy(spec=_SPEC, action="apply"), requests.Reset(gpu=0, yes=True, quiesce=True),
    requests.GpuSettings(settings='{"power_limit_w": 700}', operator="me"), requests.Release(token="0123456789abcdef"))}
