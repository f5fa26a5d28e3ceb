"""Gates a pivot must pass before the next phase starts: commands and file counts.

Why: the move from extraction to training must not be judged by eye ("all 37,312 samples"). A gate
makes that check explicit: a command that must exit 0 (a JSON string), or "at least N files
match GLOB" (a JSON object). The kind is the JSON type, so a command may start with any
character: reading `{` as "JSON" once crashed the agent on the shell group `{ a; b; }`.
"""
import glob
import json
import subprocess

from ..options.record import Options
from ..wire import codes, defaults, frame, records


def add_arguments(parser):
    pass  # --spec only: cli.py adds it, as the wire's SUBCOMMANDS name it


def check_gate(gate, cwd):
    """One gate's result. Its kind is its JSON type (the spec carries the hosts.env list as
    parsed): a string is a shell command, run by `sh -c` whatever it starts with (a `{ ...; }`
    group included); an object {"glob": G, "min": N} is a file count. Never guessed from text."""
    if isinstance(gate, dict):
        pattern, least = gate.get("glob"), gate.get("min")
        if not isinstance(pattern, str) or not isinstance(least, int):
            return {"gate": json.dumps(gate, sort_keys=True), "ok": False,
                    "detail": 'not a file count gate: needs {"glob": TEXT, "min": N}'}
        count = len(glob.glob(pattern, recursive=True))
        return {"gate": "at least %d files match %s" % (least, pattern), "ok": count >= least,
                "detail": "%d match" % count}
    if not isinstance(gate, str):
        return {"gate": json.dumps(gate), "ok": False, "detail": "neither a shell command nor a file count gate"}
    try:
        proc = subprocess.run(["sh", "-c", gate], cwd=cwd, capture_output=True, text=True,
                              timeout=defaults.GATE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"gate": gate, "ok": False, "detail": "timed out after %g s" % defaults.GATE_TIMEOUT_S}
    tail = (proc.stdout + proc.stderr).strip().splitlines()[-3:]
    detail = "exit %d%s" % (proc.returncode, (": " + " | ".join(tail)) if tail else "")
    return {"gate": gate, "ok": proc.returncode == 0, "detail": detail}


def run(opts: Options):
    spec = frame.decode_spec(opts.spec)
    results = [check_gate(g, spec.get("dir")) for g in spec.get("gates") or []]
    ok = all(r["ok"] for r in results)
    code = codes.EXIT_OK if ok else codes.EXIT_GATE
    return code, records.written(records.GatesResult, code=code, passed=ok, gates=results)
