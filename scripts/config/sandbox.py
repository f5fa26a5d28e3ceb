"""The built-in sandbox host: where its directory is, and the host it is (devices, scope, phases).

Why here, in the configuration: the sandbox is a host a task names like any in hosts.env
(`--host sandbox`), so every task builds it with the others (hosts.py); what starts and
stops its processes is scripts/ops/sandbox.py, above this.

Its directory: a path such as /tmp/gpu-pivot-sandbox-UID is one any local user can create
first, and a squatted directory makes root signal a PID from a planted state.json, write
through a planted symlink and execute a planted binary.

The whole account: docs/design-notes.md (scripts/config/sandbox.py)."""
from __future__ import annotations

import json
import os
import shlex
import stat
import sys
from pathlib import Path

from ..agent.state import statedir
from .errors import ConfigError, show
from .hostconfig import Host
from .route import Route

StateDirError = statedir.StateDirError
SANDBOX_DIR_ENV = "GPU_PIVOT_SANDBOX_DIR"
# the stand-ins the sandbox's processes run (a script, not imported: it runs as its own program)
ROLES = Path(__file__).resolve().parents[1] / "ops" / "sandbox_roles.py"
GPUS = 2


class SandboxDirError(StateDirError):
    """The sandbox directory (or a directory in it) is not ours to use. str() is one line."""

    what = "sandbox directory"


def sandbox_dir() -> Path:
    """The sandbox's path (nothing is created or checked here: `invoke hosts` reads it too)."""
    override = os.environ.get(SANDBOX_DIR_ENV)
    if override:
        if not os.path.isabs(override):  # relative: a sandbox in whatever directory a task runs from
            raise ConfigError(f"{SANDBOX_DIR_ENV}={show(override)}: must be an absolute path (relative, it would "
                              f"put the sandbox in the directory a task runs from: {os.path.abspath(override)})")
        return Path(os.path.normpath(override))
    if os.geteuid() == 0:
        return Path(statedir.ROOT_RUN_DIR) / "sandbox"
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isabs(runtime) and statedir.is_private(runtime):
        return Path(runtime) / "gpu-pivot" / "sandbox"
    return Path(statedir.state_home()) / "gpu-pivot" / "sandbox"


def _refuse(exc: StateDirError) -> SandboxDirError:
    problem = exc.problem.replace(statedir.RUN_DIR_ENV, SANDBOX_DIR_ENV)
    return SandboxDirError(exc.path, problem)


def private(path: Path, parents: bool = False) -> Path:
    """`path` created 0700 or checked (statedir.private_dir); SandboxDirError names it if not."""
    try:
        return Path(statedir.private_dir(str(path), parents=parents))
    except StateDirError as exc:
        raise _refuse(exc) from None


def _check_parent(path: Path) -> None:
    """The nearest existing ancestor of an override must be ours or root's, and if others
    may write in it, sticky (like /tmp): else its owner could rename our directory away."""
    while not os.path.lexists(path) and path != path.parent:
        path = path.parent
    try:
        st = os.stat(path)
    except OSError as exc:
        raise SandboxDirError(str(path), "cannot inspect it: %s" % (exc.strerror or exc)) from None
    if st.st_uid not in (0, os.geteuid()):
        raise SandboxDirError(str(path), "the directory holding the sandbox is owned by uid %d, not by us or "
                                         "root; choose another place with %s" % (st.st_uid, SANDBOX_DIR_ENV))
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        raise SandboxDirError(str(path), "the directory holding the sandbox is writable by others and not "
                                         "sticky (mode %04o); choose another place with %s"
                                         % (stat.S_IMODE(st.st_mode), SANDBOX_DIR_ENV))


def checked_dir() -> Path:
    """The sandbox directory, created 0700 or checked; SandboxDirError (one line) if not ours."""
    base = sandbox_dir()
    if os.environ.get(SANDBOX_DIR_ENV):
        _check_parent(base.parent)
        return private(base, parents=True)
    private(base.parent, parents=True)  # .../gpu-pivot: the same checks as the agent's run dir
    return private(base)


def existing_dir() -> Path | None:
    """The sandbox directory checked as in checked_dir(), or None when there is none yet."""
    return checked_dir() if os.path.lexists(sandbox_dir()) else None


# The ports of the sandbox's servers are picked free at `sandbox up` and recorded in
# ports.json (a fixed port fails whenever anything else holds it); these are shown
# only while no sandbox was ever started.
SERVER_PORT, DATAGEN_PORT = 30000, 30001
PORTS_FILE = "ports.json"
HIDDEN_STATES = 8  # the train phase's gate counts this many extracted files


def server_argv(base: Path, port: int, *extra: str) -> list:
    """`python3 -m sglang.launch_server ...` served by the sandbox stand-in on 127.0.0.1:port."""
    return [sys.executable, "-m", "sglang.launch_server", "--model-path", str(base / "fake-model"), "--tp", str(GPUS),
            "--port", str(port), "--http-port", str(port), "--devdir", str(base / "dev"), "--memdir",
            str(base / "gpumem"), *extra]


def ports(base: Path | None) -> tuple:
    """(server port, datagen port) recorded by the last `sandbox up`, else the defaults."""
    try:  # read through no link; no file yet: the defaults
        doc = statedir.read_json(str(base / PORTS_FILE)) if base is not None else None
    except (OSError, ValueError):
        doc = None
    if isinstance(doc, dict) and all(isinstance(doc.get(k), int) for k in ("server", "datagen")):
        return doc["server"], doc["datagen"]
    return SERVER_PORT, DATAGEN_PORT


# The sandbox's GPU settings (its fake GPUs keep them in DIR/gpu-settings.json): the host's
# baseline a pivot restores after its teardown, the training phase's own set before it starts,
# and what `sandbox up` leaves as the last job's drift, so a pivot has something to restore.
BASELINE = {"persistence": "on", "compute_mode": "default", "power_limit_w": 700}
TRAIN_SETTINGS = {"compute_mode": "exclusive_process", "power_limit_w": 600}
LEFT_BY_LAST_JOB = {"compute_mode": 3, "power_limit_mw": 450000}  # NVML's numbers: exclusive process, 450 W


def sandbox_phases(base: Path, port_pair: tuple | None = None) -> dict:
    """The three pivots gpu-pivot was built for, on the sandbox, in the same schema as hosts.env phases."""
    from .phases import build_phase  # only when the sandbox is the host: a status elsewhere needs no phase

    server_port, datagen_port = port_pair or (SERVER_PORT, DATAGEN_PORT)
    env = f"PYTHONPATH={base / 'pkg'}"
    py = shlex.quote(sys.executable)
    keys = {
        "datagen": {  # EAGLE3 data-generation pivot: EAGLE3 debug server -> baseline server + dataset preps in parallel
            "ARGV": json.dumps(server_argv(base, datagen_port, "--load-s", "1", "--mib", "30000")),
            "ENV": env, "READY": f"http://127.0.0.1:{datagen_port}/health", "READY_TIMEOUT": "60",
            "DRAIN_METRICS": f"http://127.0.0.1:{server_port}/metrics", "DRAIN_TIMEOUT": "30",
            # the sandbox dir in each prep's command line too: every process the sandbox starts is in its scope
            "PREP": json.dumps([f"{py} -c 'import sys, time; time.sleep(0.5); print(\"prepared \" + sys.argv[1])' "
                                f"{name} --sandbox {shlex.quote(str(base))}"
                                for name in ("sharegpt", "ultrachat", "code-alpaca")]),
        },
        "train": {  # extraction-to-training pivot: extraction finished -> training, gated on the extracted files
            "ARGV": json.dumps([str(base / "bin" / "torchrun"), str(ROLES), "job", "--devdir", str(base / "dev"),
                                "--memdir", str(base / "gpumem"), "--mib", "60000", "--gpus", str(GPUS)]),
            "READY": "holding", "READY_TIMEOUT": "30",
            "GPU_SETTINGS": json.dumps(TRAIN_SETTINGS),  # set before it starts, on the sandbox's settings file
            "GATES": json.dumps([{"glob": str(base / "hidden_states" / "*.pt"), "min": HIDDEN_STATES},
                                 f"test -s {shlex.quote(str(base / 'hidden_states' / 'data_config.json'))}"]),
        },
        "deploy": {  # patched-server deploy: old server -> patched server, rolled back if the new one is unhealthy
            "ARGV": json.dumps(server_argv(base, server_port, "--load-s", "1",
                                           "--code-dir", str(base / "server-code"))),
            "ENV": env, "DIR": str(base / "server-code"), "PATCH": str(base / "patches" / "dynamic-spec.patch"),
            "READY": f"http://127.0.0.1:{server_port}/health", "READY_TIMEOUT": "30",
            "SMOKE_URL": f"http://127.0.0.1:{server_port}/generate",
            "SMOKE_BODY": '{"text": "Hello", "max_new_tokens": 8}',
        },
    }
    return {name: build_phase("sandbox", name, k) for name, k in keys.items()}


def sandbox_host() -> Host:
    """The built-in SANDBOX host. Scoped: targets must also have `<sandbox dir>/` in their
    command line (every process the sandbox starts does, via --devdir/--model-path) and be
    owned by this user; its fake device files sit in the private dir, so only it holds them."""
    base = sandbox_dir()
    try:
        recorded = ports(existing_dir())
    except StateDirError:  # refused directory: `sandbox up` says so; the host still lists
        recorded = None
    return Host("sandbox", Route(()), devices=f"{base}/dev/nvidia*", sandbox=True, fake_gpus=str(base / "gpumem"),
                fake_devices=True, scope=f"{base}{os.sep}", scope_uid=os.geteuid(),
                run_dir=str(base / "run"), phases=sandbox_phases(base, recorded), gpu_baseline=dict(BASELINE),
                apply_settings=True)
