"""A pivot away from a training phase that declares a checkpoint stop (issue 44 item 5), through
`invoke`: the dry run's plan shows the stop, the pivot's teardown sends the job its signal and
waits for its checkpoint before SIGTERM, and the pivot's report and audit log say which
checkpoint arrived. The job is the test's own (tests/support/ckpt_job.py), the host scoped to
its temp dir."""
import json
import re
import sys

from tests.conftest import invoke
from tests.support.ckpt_job import JOB
from tests.support.procs import alive, wait_for


def test_pivot_lets_the_training_phase_checkpoint_first(ps, hosts_env):
    script, spec, ckdir = ps.base / "ckjob.py", ps.base / "ckjob.json", ps.base / "ckpt"
    script.write_text(JOB)
    ckdir.mkdir()
    log, ready = ps.base / "job.log", ps.base / "ckjob.ready"
    spec.write_text(json.dumps({"log": str(log), "device": str(ps.devdir / "nvidia0"), "mode": "quick",
                                "ready": str(ready), "ckpt": str(ckdir / "step-7.pt")}))
    hosts_env("".join(f"LOCAL_{k}='{v}'\n" for k, v in {
        "DEVICES": ps.glob, "TARGETS": re.escape(script.name), "FAKE_DEVICES": "yes", "SCOPE": str(ps.base),
        "PHASE_TRAIN_ARGV": json.dumps([sys.executable, str(script), str(spec)]), "PHASE_TRAIN_READY": "alive",
        "PHASE_TRAIN_STOP_SIGNAL": "USR1", "PHASE_TRAIN_STOP_CHECKPOINT": f"{ckdir}/step-*.pt",
        "PHASE_TRAIN_STOP_DEADLINE": "120", "PHASE_NEXT_CMD": f"sleep 600 # {ps.base}",
        "PHASE_NEXT_READY": "alive"}.items()))
    assert invoke("start", "--host", "local", "--phase", "train").returncode == 0
    pid = int(wait_for(lambda: ready.exists() and ready.read_text(), "the job is ready"))
    ps.adopt(pid)
    dry = invoke("pivot", "--host", "local", "--to", "next", "--dry-run")
    text = " ".join(dry.stdout.decode().split())
    assert dry.returncode == 0 and f"CHECKPOINT STOP phase train: SIGUSR1 to pid {pid} first, then wait up to " \
                                   f"120s for a new closed {ckdir}/step-*.pt" in text, text
    assert log.read_text() == "" and alive(pid)
    res = invoke("pivot", "--host", "local", "--to", "next", "--yes")
    text = " ".join(res.stdout.decode().split())
    assert res.returncode == 0, text + res.stderr.decode()
    assert f"phase train: SIGUSR1: checkpoint {ckdir}/step-7.pt arrived after" in text
    assert log.read_text().splitlines() == ["usr1", "open", "closed", "term"] and not alive(pid)
    audit = json.loads(invoke("audit", "--json", "--lines", "50").stdout)
    (rec,) = [a for a in audit if a.get("signal") == "checkpoint stop"]
    assert rec["arrived"] is True and rec["checkpoint"] == f"{ckdir}/step-7.pt"
    assert invoke("stop", "--host", "local", "--phase", "next").returncode == 0
