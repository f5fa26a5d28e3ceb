"""Slurm epilog and prolog: free (epilog) or check (prolog) the GPUs of ONE job on this node.

Why scoped to the job: an epilog runs as root on a node other jobs may share. It may only
touch what the finished job left behind: processes of the job's user (SLURM_JOB_UID) that
hold the job's GPUs (SLURM_JOB_GPUS, else CUDA_VISIBLE_DEVICES) after Slurm ended the job
(a double-forked `setsid` worker survives proctrack/linuxproc). So the agent runs with
`--scope-uid` and a device set of exactly the job's GPU files, and with a target pattern
no program name can match, so no pattern-named server elsewhere on the node (the same
user's other job) is ever a target: only holders of the job's GPUs are. The agent's `plan` is read
first and only its targets on the job's GPUs are approved for the `teardown`: on a GPU node
NVML also lists the same user's processes on the node's other GPUs (another of its jobs).

The whole account: docs/design-notes.md (scripts/engines/slurm_job.py)."""
from __future__ import annotations

import dataclasses
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ..agent.wire import codes, defaults, records, requests
from ..config.envfile import read_env_file
from ..config.errors import ConfigError, show
from ..config.hostconfig import Host, build_host
from ..ops import teardown as teardown_op
from ..reach.transport import AgentError, call_agent, exit_code_for
from . import slurm_cgroup

if TYPE_CHECKING:
    from ..agent.wire.rows import GpuRow, Holder, ProcessRow

CONF_ENV = "GPU_PIVOT_SLURM_CONF"
DEFAULT_CONF = "/etc/gpu-pivot/slurm.env"
BUDGET_S = 9.5  # the whole run, agent start to drain; Slurm's epilog must be quick
DRAIN_S = 1.5  # kept back from the agent for sinfo + scontrol (a controller that does not answer must not hold it)
AGENT_S = BUDGET_S - DRAIN_S
SCONTROL_S = 3.0  # scontrol's own limit when more of the budget is left
DIGITS = re.compile(r"[0-9]+")  # ASCII only: str.isdigit() accepts '²', which int() refuses
HOST_KEYS = ("DEVICES", "FAKE_DEVICES", "PROTECT")
# Names of a program never contain NUL (argv words are NUL-separated), so this pattern
# names no program: the plan's targets are then only the holders of the job's GPUs.
NO_PROGRAM = r"\x00"
SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
REASON_MAX = 240


@dataclasses.dataclass(frozen=True)
class Settings:
    host: Host
    grace: float = 2.0
    timeout: float = 2.0
    settle: float = 0.5
    wait_lock: float = 1.0
    max_used_mib: int = defaults.MAX_USED_MIB


@dataclasses.dataclass(frozen=True)
class Job:
    id: str
    uid: int
    gpus: tuple  # GPU indices, as Slurm numbers them (the N of the gres File's nvidiaN)
    node: str | None  # SLURMD_NODENAME: None when run by hand (then nothing is drained)


def job_from_env(env) -> Job:
    """The job Slurm describes in the environment; ConfigError names a bad value."""
    job_id = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID") or ""
    if not DIGITS.fullmatch(job_id):
        raise ConfigError(f"SLURM_JOB_ID={show(job_id)}: not a job id (is this run by slurmd?)")
    uid = env.get("SLURM_JOB_UID", "")
    if not DIGITS.fullmatch(uid):
        raise ConfigError(f"SLURM_JOB_UID={show(uid)}: not a uid; without it the job's processes cannot be told "
                          "from others'")
    if int(uid) == 0:
        raise ConfigError("SLURM_JOB_UID='0': root's processes are the node's, never a job's leftovers; "
                          "gpu-pivot does not clean up after root's jobs")
    raw = env.get("SLURM_JOB_GPUS") or env.get("CUDA_VISIBLE_DEVICES") or ""
    gpus = []
    for word in filter(None, raw.split(",")):
        if not DIGITS.fullmatch(word):
            raise ConfigError(f"SLURM_JOB_GPUS={show(raw)}: expected GPU indices such as 0,1")
        gpus.append(int(word))
    return Job(job_id, int(uid), tuple(sorted(set(gpus))), env.get("SLURMD_NODENAME") or None)


def load_settings(env) -> Settings:
    """The node's settings file (absent: the defaults); ConfigError names a bad line or value."""
    path = Path(env.get(CONF_ENV) or DEFAULT_CONF)
    values: dict = {}
    if path.exists():
        _check_owner(path)
        values, _ = read_env_file(path)
    elif env.get(CONF_ENV):
        raise ConfigError(f"{CONF_ENV}={str(path)!r}: no such file")
    known = set(HOST_KEYS) | {"RUN_DIR", "GRACE", "TIMEOUT", "SETTLE", "MAX_USED_MIB"}
    for key in values:
        if key not in known:
            raise ConfigError(f"{path}: unknown key {key!r} (known: {', '.join(sorted(known))})")
    host = build_host("local", {k: values[k] for k in HOST_KEYS if k in values}, str(path))
    if values.get("RUN_DIR"):
        host = dataclasses.replace(host, run_dir=values["RUN_DIR"])
    default = Settings(host)
    settings = Settings(host, grace=_seconds(path, "GRACE", values.get("GRACE"), default.grace),
                        timeout=_seconds(path, "TIMEOUT", values.get("TIMEOUT"), default.timeout),
                        settle=_seconds(path, "SETTLE", values.get("SETTLE"), default.settle))
    if "MAX_USED_MIB" in values:
        if not DIGITS.fullmatch(values["MAX_USED_MIB"]):
            raise ConfigError(f"{path}: MAX_USED_MIB={show(values['MAX_USED_MIB'])}: not a whole number of MiB")
        settings = dataclasses.replace(settings, max_used_mib=int(values["MAX_USED_MIB"]))
    worst = settings.wait_lock + settings.grace + 2 * settings.timeout + settings.settle
    if worst > AGENT_S - 0.5:
        raise ConfigError(f"{path}: GRACE + 2*TIMEOUT + SETTLE + {settings.wait_lock:g} s lock wait = {worst:g} s; "
                          f"must stay under {AGENT_S - 0.5:g} s (an epilog must be quick)")
    return settings


def _check_owner(path: Path) -> None:
    """Root runs what this file says: it must be root's and writable by no one else."""
    st = path.stat()
    if st.st_uid != 0 or st.st_mode & 0o022:
        raise ConfigError(f"{path}: must be owned by root and not writable by group or others")


def _seconds(path: Path, key: str, value: str | None, default: float) -> float:
    if value is None:
        return default
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds <= BUDGET_S:
        raise ConfigError(f"{path}: {key}={show(value)}: seconds between 0 and {BUDGET_S:g}")
    return seconds


def job_devices(device_glob: str, gpus) -> dict:
    """{index: device file} for the job's GPUs among the node's device files (nvidiaN)."""
    by_index = {}
    for path in glob.glob(device_glob):
        m = re.fullmatch(r"nvidia(\d+)", os.path.basename(path))
        if m:
            by_index[int(m.group(1))] = path
    return {i: by_index.get(i) for i in gpus}


class DeviceView:
    """A private directory of links to the job's device files, so one glob (`DIR/*`) names
    exactly them: `nvidia[1]` and `nvidia[12]` cannot be one glob. The agent knows a device by
    identity (stat follows the link), so the links stand for the files; reports are mapped
    back to the real names. Made 0700 by mkdtemp: no other user can add to it."""

    def __init__(self, devices: dict):
        self.dir = tempfile.mkdtemp(prefix="gpu-pivot-job-")
        self.names = {}
        for path in devices.values():
            link = os.path.join(self.dir, os.path.basename(path))
            os.symlink(os.path.abspath(path), link)
            self.names[link] = path

    @property
    def glob(self) -> str:
        return os.path.join(self.dir, "*")

    def real(self, text: str) -> str:
        for link, path in self.names.items():
            text = text.replace(link, path)
        return text

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


# -- what went wrong, in one line for `sinfo -R` ---------------------------------------------

def _pid_line(row: ProcessRow, view: DeviceView, what: str) -> str:
    devices = ", ".join(os.path.basename(view.real(d)) for d in row.get("devices") or []) or "the GPU"
    who = f" user {row['user']}" if row.get("user") else ""
    return f"pid {row['pid']} ({_comm(row)}{who}, state {row.get('state', '?')}) {what} {devices}"


def _comm(row: ProcessRow) -> str:
    cmd = (row.get("cmdline") or row.get("comm") or "?").split()
    return os.path.basename(cmd[0]) if cmd else "?"


def epilog_problems(res, view: DeviceView, job: Job) -> list:
    """Specific lines, most telling first: stuck after SIGKILL, not the epilog's to kill,
    signals refused, respawned, then whatever still holds the job's GPUs; never what
    another job's cgroup holds (that job is running on a shared GPU)."""
    gpus = job.gpus
    out = [_pid_line(s, view, "still holds after SIGKILL:") + (" stuck in the driver" if s.get("state") == "D"
                                                                else "")
           for s in res.stuck]
    foreign = _foreign(res, job)
    out += [_pid_line(r, view, "is not the job's user's, not the epilog's to kill; holds") for r in foreign]
    out += [f"{f['signal']} to pid {f['pid']} failed: {f['result']}" for f in res.signal_failures]
    out += [f"pid {a.get('pid')} ({_comm(a)}) appeared on the GPU during the settle window"
            for a in _appeared(res, job)]
    seen = {s["pid"] for s in res.stuck} | {r["pid"] for r in foreign}
    out += [_pid_line(r, view, "still holds") for r in res.still_holding if r.get("pid") not in seen and (
        r.get("devices") or r.get("gpu") is None or r.get("gpu") in gpus) and not other_job(r, job.id)]
    return out or [view.real(p) for p in res.problems] or ["not free (no detail in the agent's result)"]


def _foreign(res, job: Job) -> list:
    """Holders of the job's GPUs outside the scope (another user's), not in another job's cgroup."""
    return [r for r in (res.plan.left_alone if res.plan else []) if on_job(r, job.gpus) and not other_job(r, job.id)]


def _appeared(res, job: Job) -> list:
    """The respawns that are this job's: all but those in another job's cgroup. One reparented
    to PID 1 at once and not holding a GPU yet counts too: it may be the job's own watchdog's
    restart, which opens the job's GPU a moment after the last look (excusing those would let
    the epilog exit 0 with the restart about to hold the GPU). The cost: on a shared
    node without proctrack cgroups, another job of the same user starting the same program
    during this epilog drains the node."""
    return [a for a in res.appeared if not other_job(a, job.id)]


def other_job(row: ProcessRow, job_id: str | None) -> bool:
    """Is this holder (a scan or plan row) in ANOTHER running job's cgroup? Then it is that
    job's, on a shared GPU: never this job's to signal or to blame. Only a cgroup Slurm
    itself made counts (slurm_cgroup.job_of): a `job_<N>` folder a user made names nothing."""
    if job_id is None:
        return False
    job = slurm_cgroup.job_of(row.get("pid"), row.get("start_time"))
    return job is not None and job != job_id


def on_job(row: ProcessRow, gpus: tuple) -> bool:
    """Does this holder (a scan or plan row) hold one of the job's GPUs: one of its device
    files (the agent looked at no others), or GPU memory on one of its GPUs (NVML rows)?"""
    return bool(row.get("devices")) or bool(set(row.get("gpu_mib") or {}) & {str(i) for i in gpus})


def job_problems(gpu_rows: list[GpuRow], holders: list[Holder], uninspected: bool, gpus: tuple,
                 max_used_mib: int, job_id: str | None = None) -> list:
    """What keeps THE JOB'S GPUs from being free, from the last scan of an agent verify or
    teardown (its GPU rows, its holders, and whether some process could not be inspected:
    _last_scan reads them from the record).

    Why here: the agent's verdict covers every GPU NVML reports, and on a node shared by
    several jobs another job's GPU is busy by design; judged whole, every epilog and prolog
    there would fail and drain the node. So the GPU rows are read for the job's GPUs only
    (NVML's index taken as the N of /dev/nvidiaN, which is also Slurm's gres index when
    gres.conf lists /dev/nvidia[0-N]), holders count when they hold one of the job's device
    files (the agent looked at no others) or GPU memory on one of its GPUs, and a process
    that could not be inspected still blocks: it might hold anything. With `job_id`, what
    another job's cgroup holds is that job's (a shared GPU), and so is the memory used on a
    GPU one of its processes is on."""
    wanted = {str(i) for i in gpus}
    others = {h["pid"] for h in holders if other_job(h, job_id)}
    out = []
    for g in gpu_rows:
        if str(g.get("index")) not in wanted:
            continue
        procs = g["processes"]
        out += [f"GPU {g['index']}: compute process pid {p['pid']} ({p['used_mib']} MiB)" for p in procs
                if p["pid"] not in others]
        shared = any(p["pid"] in others for p in procs)
        used = g.get("used_mib")
        if used is not None and used > max_used_mib and not shared:
            out.append(f"GPU {g['index']}: {used} MiB used > {max_used_mib} MiB")
    for h in holders:
        context = h.get("gpu_mib") or h.get("mapped_devices")
        if on_job(h, gpus) and h["pid"] not in others and (not h.get("protected") or context):
            held = ", ".join(h.get("devices") or []) or "memory on GPU " + ", ".join(sorted(h.get("gpu_mib") or {}))
            out.append(f"pid {h['pid']} (state {h.get('state', '?')}) holds {held}")
    if uninspected:
        out.append("not every process could be inspected, so nothing is called free")
    return out


def _last_scan(r: records.VerifyResult | records.TeardownResult) -> tuple[list[GpuRow],
                                                                            list[Holder], bool]:
    """(GPU rows, holders, not every process inspected) of the scan a verify or a teardown
    ended on, for job_problems: a verify's scan; a teardown's final scan (its GPU rows are
    `after`)."""
    if isinstance(r, records.TeardownResult):
        return r.after, r.holders, bool(r.denied or r.proc_hidden)
    return r.scan.gpus, r.scan.holders, bool(r.scan.denied or r.scan.proc_hidden)


def reason_text(kind: str, job: Job, problems: list) -> str:
    more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
    text = f"gpu-pivot {kind} job {job.id}: {problems[0]}{more}"
    text = " ".join(text.split())  # one line: a newline would split `sinfo -R`
    return text if len(text) <= REASON_MAX else text[:REASON_MAX - 3] + "..."


# -- epilog and prolog -----------------------------------------------------------------------

def _job_host(settings: Settings, job: Job, view: DeviceView, scoped: bool):
    host = dataclasses.replace(settings.host, devices=view.glob)
    if scoped:  # no PROTECT: in scope is only the job's user, whose leftovers no name may spare
        host = dataclasses.replace(host, targets=(NO_PROGRAM,), scope_uid=job.uid, protect=())
    return host


def _view(job: Job, settings: Settings) -> tuple:
    """(DeviceView of the job's GPUs, None), or (None, (code, problems)) when there is
    nothing to look at: no GPUs (free), or a GPU without its device file (not free)."""
    if not job.gpus:
        return None, (codes.EXIT_OK, [])
    devices = job_devices(settings.host.devices, job.gpus)
    missing = [f"GPU {i}: no device file nvidia{i} in {settings.host.devices}" for i, p in devices.items() if not p]
    if missing:
        return None, (codes.EXIT_NOT_FREE, missing)
    return DeviceView(devices), None


def epilog(job: Job, settings: Settings, started: float) -> tuple:
    """(exit code, problems): 0 and [] when the job's GPUs are free (nothing left, or freed)."""
    view, early = _view(job, settings)
    if view is None:
        return early
    try:
        host = _job_host(settings, job, view, scoped=True)
        planned = teardown_op.plan(host, deadline_s=AGENT_S - (time.monotonic() - started))
        if planned.code != codes.EXIT_OK:  # a plan has no problems to name, and a usage error is a ConfigError
            return planned.code, [f"the agent's plan exited {planned.code}"]
        # only what holds the job's GPUs (NVML also lists the same user's processes on the node's other
        # GPUs), and not what another job's cgroup holds (the same user's running job on a shared GPU)
        mine = [t for t in planned.result.plan.targets if on_job(t, job.gpus) and not other_job(t, job.id)]
        req = requests.Teardown(grace=settings.grace, timeout=settings.timeout, settle=settings.settle,
                                wait_lock=settings.wait_lock, max_used_mib=settings.max_used_mib,
                                approved=teardown_op.only_these(mine),
                                operator=f"slurm-epilog job {job.id} uid {job.uid}")
        # the epilog's own budget, not the request's deadline: Slurm's wait for the epilog is the limit;
        # no local audit copy: on this node the agent's own record is the log, root's home gathers no fleet
        res = teardown_op.on_host(host, req, deadline_s=AGENT_S - (time.monotonic() - started), audit=False)
        r = res.result
        if r.locked:
            return res.code, [f"another teardown holds the node's lock: {r.error}"]
        if r.state_error:
            return res.code, [f"agent state directory unusable: {r.state_error}"]
        if res.code == codes.EXIT_OK or (res.code == codes.EXIT_NOT_FREE and not (
                r.stuck or r.signal_failures or _appeared(r, job) or _foreign(r, job))
                and not job_problems(*_last_scan(r), job.gpus, settings.max_used_mib, job.id)):
            return codes.EXIT_OK, []
        return res.code, epilog_problems(r, view, job)
    finally:
        view.close()


def prolog(job: Job, settings: Settings, started: float) -> tuple:
    """(exit code, problems): the job's GPUs must be held by nobody and read free."""
    view, early = _view(job, settings)
    if view is None:
        return early
    try:
        req = requests.Verify(wait=min(1.0, BUDGET_S / 4), max_used_mib=settings.max_used_mib)
        res = call_agent(_job_host(settings, job, view, scoped=False), req,
                         deadline_s=AGENT_S - (time.monotonic() - started))
        if res.code == codes.EXIT_OK or (res.code == codes.EXIT_NOT_FREE and not job_problems(
                *_last_scan(res.result), job.gpus, settings.max_used_mib, job.id)):
            return codes.EXIT_OK, []
        holders = [h for h in res.result.scan.holders if not h["protected"] and not other_job(h, job.id)]
        lines = [_pid_line(h, view, "holds") for h in holders]
        return res.code, lines or [view.real(p) for p in res.result.problems]
    finally:
        view.close()


def drain(node: str, reason: str, until: float) -> str | None:
    """Set the node's drain reason; returns why it did not (the exit code still drains).
    Both Slurm calls end by `until` (monotonic): the epilog's budget covers them too.

    A reason gpu-pivot already set is kept: after a failed prolog Slurm runs the epilog for
    the same job, and the first cause (the prolog's "held by pid N") is the one to read."""
    def left(share: float) -> float:
        return max(0.1, min(SCONTROL_S, (until - time.monotonic()) * share))

    try:
        now = subprocess.run(["sinfo", "-h", "-N", "-n", node, "-o", "%T|%E"], capture_output=True, text=True,
                             timeout=left(0.5)).stdout.strip()
        state, _, current = now.partition("|")
        if state.startswith("drain") and current.startswith("gpu-pivot "):
            return f"kept the reason already set: {current}"
        done = subprocess.run(["scontrol", "update", f"nodename={node}", "state=drain", f"reason={reason}"],
                              capture_output=True, text=True, timeout=left(1.0))
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"scontrol: {exc}"
    return None if done.returncode == 0 else f"scontrol exited {done.returncode}: {done.stderr.strip()}"


def main(argv=None, env=None) -> int:
    """`slurm_job.py epilog|prolog`: the exit code Slurm acts on (non-zero drains the node)."""
    started = time.monotonic()
    env = os.environ if env is None else env
    env.setdefault("PATH", SAFE_PATH)  # slurmd runs prolog and epilog without one
    kind = (argv or sys.argv[1:] or [""])[0]
    if kind not in ("epilog", "prolog"):
        print(f"usage: slurm_job.py epilog|prolog (got {kind!r})", file=sys.stderr)
        return codes.EXIT_USAGE
    node = env.get("SLURMD_NODENAME") or None
    try:
        job = job_from_env(env)
        node = job.node
        settings = load_settings(env)
        code, problems = (epilog if kind == "epilog" else prolog)(job, settings, started)
    except ConfigError as exc:
        code, problems = codes.EXIT_USAGE, [str(exc)]
        job = Job(env.get("SLURM_JOB_ID") or "?", -1, (), node)
    except (AgentError, OSError, RuntimeError) as exc:  # HostTimedOut is a RuntimeError too
        # the tasks' one mapping (a timed-out host: 7); any other error here: the agent gave no result
        code = exit_code_for(exc) or codes.EXIT_UNREACHABLE
        problems = [f"the agent gave no result: {exc}"]
    wall = time.monotonic() - started
    if code == codes.EXIT_OK:
        print(f"gpu-pivot {kind} job {job.id}: GPUs {list(job.gpus)} free ({wall:.2f} s)")
        return code
    reason = reason_text(kind, job, problems)
    print(f"{reason} [{wall:.2f} s]", file=sys.stderr)
    if node:
        failed = drain(node, reason, started + BUDGET_S)
        if failed:
            print(f"gpu-pivot {kind}: drain reason not set: {failed}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
