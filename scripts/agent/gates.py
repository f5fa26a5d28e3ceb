"""Gates a pivot must pass before the next phase starts: commands and file counts.

Why: the move from extraction to training used to be judged by eye ("all 37,312 samples"). A gate
makes that check explicit: a command that must exit 0, or "at least N files match GLOB".
"""
import glob
import json
import subprocess

from . import contract, options


def add_arguments(parser):
    options.add_spec(parser)


def check_gate(gate, cwd):
    if gate.startswith("{"):
        g = json.loads(gate)
        count = len(glob.glob(g["glob"], recursive=True))
        return {"gate": "at least %d files match %s" % (g["min"], g["glob"]), "ok": count >= g["min"],
                "detail": "%d match" % count}
    try:
        proc = subprocess.run(["sh", "-c", gate], cwd=cwd, capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        return {"gate": gate, "ok": False, "detail": "timed out after 600 s"}
    tail = (proc.stdout + proc.stderr).strip().splitlines()[-3:]
    detail = "exit %d%s" % (proc.returncode, (": " + " | ".join(tail)) if tail else "")
    return {"gate": gate, "ok": proc.returncode == 0, "detail": detail}


def run(args):
    spec = contract.decode_spec(args.spec)
    results = [check_gate(g, spec.get("dir")) for g in spec.get("gates") or []]
    ok = all(r["ok"] for r in results)
    return (contract.EXIT_OK if ok else contract.EXIT_GATE), {"passed": ok, "gates": results}
