"""`make demo` next to real-looking servers that are not the sandbox's, in a PID namespace.

Run ONLY as `unshare --pid --fork --mount-proc sh -c '... python3 -m tests.support.sandbox_scene DIR'`
(see `namespace_command`): if the sandbox's scoping were broken, the demo's teardown (it
runs with --yes) could only reach this scene's processes, never the machine's.

What it does, writing DIR/scene.json:
  1. starts bystanders OUTSIDE the sandbox dir that look like real servers:
     `python3 -m sglang.launch_server --port P` (the sandbox's stand-in module on
     PYTHONPATH, in DIR/elsewhere) with its worker `sglang::scheduler_TP0`, a lone process
     titled `sglang::scheduler_TP0`, and a `torchrun` job; each holds its own fake device
     files in DIR/elsewhere/dev;
  2. runs the Makefile's `demo` recipe line by line ($(INVOKE) and $(PY) of this venv),
     with `invoke plan --host sandbox --json` recorded just before its teardown line;
  3. records which bystanders and sandbox processes are alive afterwards, then stops the
     sandbox and its own processes.
"""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

from tests.support.paths import REPO


def namespace_command(workdir: Path) -> list:
    py = shlex.quote(sys.executable)
    inner = f"cd {shlex.quote(str(REPO))} && {py} -m tests.support.sandbox_scene {shlex.quote(str(workdir))}; true"
    return ["unshare", "--pid", "--fork", "--mount-proc", "sh", "-c", inner]


def demo_recipe() -> list:
    """The `demo` target's command lines from the Makefile, ready to run (argv lists)."""
    lines, inside = [], False
    for line in (REPO / "Makefile").read_text().splitlines():
        if line.startswith("demo:"):
            inside = True
            continue
        if inside:
            if not line.startswith("\t"):
                break
            cmd = line.strip().lstrip("@")
            cmd = cmd.replace("$(INVOKE)", f"{shlex.quote(sys.executable)} -m invoke")
            cmd = cmd.replace("$(PY)", shlex.quote(sys.executable))
            lines.append(shlex.split(cmd))
    return lines


def _run(argv: list) -> dict:
    out = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120)
    return {"argv": argv, "rc": out.returncode, "stdout": out.stdout, "stderr": out.stderr}


def start_bystanders(ps) -> dict:
    from scripts.config.sandbox import ROLES
    from scripts.ops.sandbox import _server_shim
    from scripts.ops.sandbox_procs import free_port

    pkg = ps.base / "pkg"
    _server_shim(pkg)
    env = dict(os.environ, PYTHONPATH=str(pkg))
    ready = ps.base / f"ready{ps.n + 1}"
    server = ["python3", "-m", "sglang.launch_server", "--port", str(free_port()), "--tp", "1",
              "--devdir", str(ps.devdir)]
    roles = {"real_server": ps.start(server, executable=sys.executable, env=env)}
    roles["real_server_worker"] = int(ready.read_text().split()[0])
    ps.adopt(roles["real_server_worker"])
    roles["titled_scheduler"] = ps.role("worker", "--gpu", "1", title="sglang::scheduler_TP0")
    roles["torchrun_job"] = ps.start(["torchrun", str(ROLES), "job", "--devdir", str(ps.devdir), "--gpus", "1"],
                                     executable=sys.executable)
    return roles


def main(workdir: Path) -> None:
    from tests.support.procs import ProcessSet, alive

    os.environ["GPU_PIVOT_SANDBOX_DIR"] = str(workdir / "sandbox")
    ps = ProcessSet(workdir / "elsewhere")
    result: dict = {"steps": [], "plan": None}
    try:
        bystanders = start_bystanders(ps)
        result["bystanders"] = bystanders
        for argv in demo_recipe():
            if "teardown" in argv:
                plan = _run([sys.executable, "-m", "invoke", "plan", "--host", "sandbox", "--json"])
                try:
                    result["plan"] = json.loads(plan["stdout"])["sandbox"]["plan"]
                except (ValueError, KeyError):
                    result["plan_error"] = plan
            result["steps"].append(_run(argv))
        result["bystanders_alive"] = {r: alive(p) for r, p in bystanders.items()}
        status = _run([sys.executable, "-m", "invoke", "sandbox", "status", "--json"])
        result["sandbox"] = json.loads(status["stdout"]) if status["rc"] == 0 else status
    finally:
        _run([sys.executable, "-m", "invoke", "sandbox", "down"])
        ps.kill_all()
        (workdir / "scene.json").write_text(json.dumps(result, indent=1, sort_keys=True))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
