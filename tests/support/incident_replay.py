"""Replay a teardown against the scenario inside a throwaway PID namespace.

The one-liners are the ones typed in two real incidents: the EAGLE3 data-generation pivot
(`pkill -f` / `pkill -9 -f python3` / `fuser -k`) and the patched-server deploy
(`ps aux | grep python3 | ... kill -9`, `fuser -k`).

Run ONLY as `unshare --pid --fork --mount-proc sh -c '...'` (see `namespace_command`): the
one-liners' `pkill -f` / `fuser -k` then see nothing but this scenario's processes. Steps:
  python3 -m tests.support.incident_replay start DIR    start the scenario, write DIR/roles.json
  <the sequence under test>                     an incident's one-liner, or gpu-pivot's agent (output
                                                and exit code kept in DIR/seq.out and DIR/seq.rc)
  python3 -m tests.support.incident_replay check DIR    print which roles survived, as JSON
"""
from __future__ import annotations

import json
import shlex
import sys
import time
from pathlib import Path

from tests.support.paths import REPO

# The EAGLE3 data-generation pivot: free the GPUs for the baseline server and the dataset preps.
DATAGEN_ONELINER = ('pkill -f "sglang.launch_server" 2>/dev/null; sleep 2; pkill -9 -f python3 2>/dev/null; '
                    'sleep 3; fuser -k {devices} 2>/dev/null; echo "Server killed"')
# The patched-server deploy: stop the old server before starting the patched one.
DEPLOY_ONELINER = ('ps aux | grep python3 | grep -v grep | awk "{{print \\$2}}" | xargs -r kill -9; '
                   'fuser -k {devices} 2>/dev/null; sleep 2; nvidia-smi 2>/dev/null | grep "0MiB" | wc -l')


def sequences(workdir: Path) -> dict:
    """The sequences to compare, as shell text run inside the namespace."""
    devices = f"{workdir}/dev/nvidia*"
    datagen = DATAGEN_ONELINER.format(devices=devices)
    script = workdir / "datagen-oneliner.sh"
    script.write_text(datagen + "\n")
    from tests.support.procs import ProcessSet  # noqa: F401  (import check: the driver needs the repo)
    agent = [sys.executable, str(REPO / "scripts" / "gpuagent.py"), "teardown", "--json", "--devices", devices,
             "--fake-devices", "--target", r"sglang\.launch_server", "--scope", str(workdir), "--grace", "1",
             "--timeout", "10", "--fake-gpus", str(workdir / "gpumem")]
    return dict(zip(NAMES, [
        "bash -c " + shlex.quote(datagen),
        f"bash {shlex.quote(str(script))}",
        "bash -c " + shlex.quote(DEPLOY_ONELINER.format(devices=devices)),
        shlex.join(agent),
    ], strict=True))


# Row names in bench/RESULTS.md; the first word names the replay's work dir.
NAMES = ("datagen one-liner as ssh sends it (bash -c)", "datagen one-liner from a script file",
         "deploy one-liner", "gpu-pivot")
DATAGEN_SCRIPT = NAMES[1]


def namespace_command(workdir: Path, sequence: str) -> list:
    py = shlex.quote(sys.executable)
    inner = (f"cd {shlex.quote(str(REPO))} && "
             f"{py} -m tests.support.incident_replay start {shlex.quote(str(workdir))} && "
             f"t0=$(date +%s.%N); {sequence} >{shlex.quote(str(workdir / 'seq.out'))} 2>&1; "
             f"echo $? >{shlex.quote(str(workdir / 'seq.rc'))}; t1=$(date +%s.%N); "
             f"{py} -m tests.support.incident_replay check {shlex.quote(str(workdir))} \"$t0\" \"$t1\"")
    return ["unshare", "--pid", "--fork", "--mount-proc", "sh", "-c", inner]


def start(workdir: Path) -> None:
    from tests.support import scenario
    from tests.support.procs import ProcessSet

    ps = ProcessSet(workdir)
    roles = scenario.start(ps)
    (workdir / "roles.json").write_text(json.dumps(roles))


def check(workdir: Path, t0: str, t1: str) -> None:
    from scripts.agent.procs import procscan
    from scripts.agent.procs.devices import DeviceSet
    from tests.support.procs import alive

    roles = json.loads((workdir / "roles.json").read_text())
    holders = procscan.snapshot(DeviceSet(f"{workdir}/dev/nvidia*", fake=True))["holders"]
    said = (workdir / "seq.out").read_text().strip().splitlines()
    try:  # gpu-pivot's agent prints one JSON document: keep its verdict
        said = ["verdict: %s (exit %s)" % (json.loads(said[-1])["verdict"], json.loads(said[-1])["exit_code"])]
    except (ValueError, KeyError, IndexError):
        pass
    print(json.dumps({"alive": {r: alive(p) for r, p in roles.items()}, "wall_s": float(t1) - float(t0),
                      "gpu_holders_left": sorted(holders), "rc": int((workdir / "seq.rc").read_text()),
                      "said": said[-1][-60:] if said else ""}))


if __name__ == "__main__":
    cmd, workdir = sys.argv[1], Path(sys.argv[2])
    if cmd == "start":
        start(workdir)
    elif cmd == "check":
        check(workdir, sys.argv[3], sys.argv[4])
    else:
        sys.exit(f"unknown step {cmd!r}")
    time.sleep(0)
