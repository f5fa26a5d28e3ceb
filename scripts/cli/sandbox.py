"""The `sandbox` task: the built-in SANDBOX host (fake GPUs on this machine)."""
from __future__ import annotations

from .common import dumps, guarded
from .flags import task


@task(positional=["action"], exit_codes=(
    ("not-free", "a sandbox process did not start (those that did are stopped)"),
    ("unreachable", "the sandbox directory is unsafe (a link, another user's, writable by others): nothing run")),
      help={"action": "up, down or status", "json": "print JSON"})
@guarded
def sandbox(c, action, json=False):
    """The SANDBOX host: fake GPU device files on this machine held by a fake server tree.

    `up` starts `python3 -m sglang.launch_server` (a SANDBOX stand-in) with two workers
    titled sglang::scheduler_TP0/1, a process named nvidia-persistenced, an `nvitop`
    monitor and an unrelated job. `down` stops exactly those (by pid + start time).
    Its directory ($GPU_PIVOT_SANDBOX_DIR, else /run/gpu-pivot/sandbox as root,
    $XDG_RUNTIME_DIR/gpu-pivot/sandbox or $XDG_STATE_HOME/gpu-pivot/sandbox) is created 0700;
    one that is a link, not ours or writable by others is refused (unreachable), nothing run;
    a process that does not start is not free, and the ones that did are stopped.
    """
    if action in ("--help", "-h"):  # Invoke hands --help to a positional argument as its value
        import inspect

        from scripts.views.render import width

        from .program import exit_codes_help, fit_paragraphs

        doc = fit_paragraphs(inspect.getdoc(sandbox) or "", width() - 2) + "\n\n" + exit_codes_help(
            sandbox.exit_codes, width() - 2, sandbox.exit_meanings)
        print("Usage: invoke sandbox up|down|status [--json]\n\nDocstring:\n" +
              "\n".join("  " + line if line else "" for line in doc.splitlines()))
        return
    from scripts.config.errors import ConfigError
    from scripts.ops import sandbox as sandbox_host
    from scripts.views.render import fit, table

    actions = {"up": sandbox_host.up, "down": sandbox_host.down, "status": sandbox_host.status}
    if action not in actions:
        raise ConfigError(f"sandbox {action!r}: expected one of up, down, status")
    state = actions[action]()
    if json:
        print(dumps(state))
        return
    print(fit(f"SANDBOX ({state['dir']}; device files {state['devices']})"))
    rows = [[role, p["pid"], "alive" if p["alive"] else "gone"] for role, p in sorted(state["processes"].items())]
    if action == "down":
        unrecorded = [p for p in state.get("stopped_unrecorded", ()) if p not in {r[1] for r in rows}]
        print("stopped:" if rows else ("nothing recorded was running" if unrecorded else "nothing was running"))
        if unrecorded:
            print(fit(f"also stopped (this sandbox's processes its state no longer listed): pids {unrecorded}"))
    print(table(["role", "pid", "now" if action != "down" else "before"], rows) if rows else "(no sandbox processes)")
    if action == "status" and state.get("unrecorded"):
        print(fit(f"NOT RECORDED: pids {state['unrecorded']} belong to this sandbox but its state no longer lists "
                  "them (directory removed by hand?): `invoke sandbox down` stops them"))
