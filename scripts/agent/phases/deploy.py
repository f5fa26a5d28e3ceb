"""Apply a deploy's patch or file copies with a backup, and roll them back.

Why: a patch applied by hand to a live server's code, then a restart by hand: if the new
server failed, the old code was gone. Here every changed file is backed up first
(FILE.gpu-pivot-orig) and a rollback restores exactly those files.
"""
import json
import os
import re
import shutil
import subprocess

from ..options.record import Options
from ..state import lastrun
from ..wire import codes, frame, records

SUFFIX = ".gpu-pivot-orig"


def add_arguments(parser):
    parser.add_argument("--action", choices=["apply", "rollback"], required=True)


def _record_path(name):
    return os.path.join(lastrun.run_dir(), "deploy-%s.json" % name)


def apply(spec):
    changed = []
    if spec.get("patch"):
        base = ["patch", "-p1", "--forward", "--batch", "-d", spec["dir"], "-i", spec["patch"]]
        dry = subprocess.run(base + ["--dry-run"], capture_output=True, text=True)
        if dry.returncode:
            return False, [], "patch does not apply: %s" % (dry.stdout + dry.stderr).strip()
        proc = subprocess.run(base + ["--backup", "--suffix", SUFFIX], capture_output=True, text=True)
        if proc.returncode:
            return False, [], "patch failed: %s" % (proc.stdout + proc.stderr).strip()
        patched = re.findall(r"^patching file '?([^'\n]+)'?$", proc.stdout, re.M)
        changed = [os.path.join(spec["dir"], m) for m in patched]
    for src, dst in spec.get("copy") or []:
        if os.path.exists(dst):
            shutil.copy2(dst, dst + SUFFIX)
        shutil.copy2(src, dst)
        changed.append(dst)
    with open(_record_path(spec["name"]), "w") as f:
        json.dump({"changed": changed}, f)
    return True, changed, "applied"


def rollback(spec):
    try:
        with open(_record_path(spec["name"])) as f:
            changed = json.load(f)["changed"]
    except (OSError, ValueError):
        return False, [], "no record of an applied deploy for phase %s" % spec["name"]
    restored = []
    for path in changed:
        if os.path.exists(path + SUFFIX):
            os.replace(path + SUFFIX, path)
        elif os.path.exists(path):
            os.unlink(path)  # the deploy created it
        restored.append(path)
    os.unlink(_record_path(spec["name"]))
    return True, restored, "restored"


def run(opts: Options):
    spec = frame.decode_spec(opts.spec)
    ok, files, detail = (apply if opts.action == "apply" else rollback)(spec)
    code = codes.EXIT_OK if ok else codes.EXIT_FAILED
    return code, records.written(records.DeployResult, code=code, ok=ok, files=files, detail=detail, action=opts.action)
