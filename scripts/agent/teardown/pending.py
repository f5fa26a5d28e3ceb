"""Restarts a manager has already scheduled while no process of the server exists yet.

Why: a server that crashed a moment ago under `Restart=on-failure` with `RestartSec=10` has no
process for those ten seconds. The scan finds nothing to stop, the GPUs read free, FREED, and
systemd starts the server again; docker does the same for a container it is "restarting". The
unit or container is related to the targets by what it runs: its command line is picked by
the same target patterns and scope that pick a process (never by reading its code). The
teardown stops it as it stops a unit holding a target: `systemctl stop` cancels the pending
start, `docker stop` the pending restart.

Only what the agent can see and stop: system units (not user managers'), containers of the
docker daemon on PATH. Each query runs only when its manager runs here, and costs two short
commands (list, then show or inspect), on a thread while the plan is computed.
"""
import os
import re
import shlex
import threading

from ..policy.builtin import LAUNCHERS, SHELLS

QUERY_TIMEOUT_S = 3  # a manager that does not answer in this long is named by none of its pending restarts
_ARGV = re.compile(r"argv\[\]=(.*?) ;")


def _out(argv):
    import subprocess  # here, on the query's thread: never loaded before the first signal by the plan itself

    try:
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=QUERY_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return proc.stdout.decode(errors="replace") if proc.returncode == 0 else ""


def _as_process(argv, uid):
    """The record the target rules read (program.match, plan.in_scope) for a command not yet run."""
    return {"argv": argv, "cmdline": " ".join(argv), "comm": os.path.basename(argv[0])[:15] if argv else "",
            "uid": uid}


def commands(argv, depth=2, joined=False):
    """The argvs a command will run as, the process the target patterns would see: itself, and
    through a launcher (`env VAR=1 python ...`, `nice -n 5 ...`: the first words that could be
    a program) or a shell's `-c` code, which execs its last command (`sh -c "exec python ..."`:
    its first command, `exec` and VAR=value words dropped). Only the words, never the code's
    meaning: a restart loop inside is the unit's own, and the unit is what is stopped.
    `joined`: argv was read back from words joined by spaces (systemd's ExecStart shows
    `sh -c exec python ...` so), the `-c` code being all the words after it."""
    out: list = [argv]
    if depth == 0 or not argv:
        return out
    prog = os.path.basename(argv[0])
    if prog in SHELLS and "-c" in argv[1:-1]:
        try:
            at = argv.index("-c") + 1
            lexer = shlex.shlex(" ".join(argv[at:]) if joined else argv[at], posix=True, punctuation_chars=True)
            words = list(lexer)
        except ValueError:
            return out
        first: list = []
        for w in words:
            if w in (";", "&&", "||", "|", "&", "(", ")", "\n"):
                if first:
                    out += commands(first, depth - 1)
                first = []
                continue
            if not first and (w == "exec" or re.match(r"[A-Za-z_][A-Za-z0-9_]*=", w)):
                continue
            first.append(w)
        if first:
            out += commands(first, depth - 1)
    elif prog in LAUNCHERS:  # the first two words that are no option, value or number: `flock FILE cmd`
        starts = [i for i, w in enumerate(argv[1:], 1) if not w.startswith("-") and "=" not in w
                 and not w.replace(".", "").isdigit()]
        for i in starts[:2]:
            out += commands(argv[i:], depth - 1)
    return out


def _uid(user):
    import pwd  # here: only a pending unit asks

    if not user:
        return 0  # a system unit without User= runs as root
    try:
        return pwd.getpwnam(user).pw_uid
    except KeyError:
        return int(user) if user.isdigit() else None


def _picked(argv, uid, picks, joined=False):
    """Why the target rules pick what this command runs (commands()), or None."""
    for run in commands(argv, joined=joined):
        why = picks(_as_process(run, uid))
        if why:
            return why
    return None


def _blocks(text):
    """`systemctl show` of several units: {Key: value} per unit, blank-line separated."""
    out = []
    for block in text.split("\n\n"):
        fields = dict(line.partition("=")[::2] for line in block.splitlines() if "=" in line)
        if fields:
            out.append(fields)
    return out


def units(picks):
    """[{unit, argv, why}] of the system units in `auto-restart` (a start scheduled, no process)
    whose ExecStart `picks` (a process-shaped record -> why it is a target, or None)."""
    listed = _out(["systemctl", "list-units", "--type=service", "--state=auto-restart", "--all",
                   "--no-legend", "--plain", "--no-pager"])
    names = [line.split()[0] for line in listed.splitlines() if line.split()]
    if not names:
        return []
    out = []
    for fields in _blocks(_out(["systemctl", "show", "-p", "Id", "-p", "User", "-p", "ExecStart", "--"] + names)):
        for command in _ARGV.findall(fields.get("ExecStart", "")):
            why = _picked(command.split(), _uid(fields.get("User")), picks, joined=True)
            if why:
                out.append({"unit": fields["Id"], "argv": command.split(),
                            "why": "a restart is scheduled (auto-restart) and it runs: %s" % why})
                break
    return out


def containers(picks):
    """[{id, name, argv, why}] of the docker containers docker is restarting whose command
    (entrypoint and cmd) `picks`."""
    ids = _out(["docker", "ps", "-q", "--no-trunc", "--filter", "status=restarting"]).split()
    if not ids:
        return []
    out = []
    fmt = "{{.Id}}\t{{.Name}}\t{{json .Config.Entrypoint}}\t{{json .Config.Cmd}}\t{{.Config.User}}"
    import json  # here: only a restarting container asks

    for line in _out(["docker", "inspect", "--format", fmt, "--"] + ids).splitlines():
        parts = line.split("\t")
        if len(parts) != 5:
            continue
        argv = [str(a) for a in (json.loads(parts[2] or "null") or []) + (json.loads(parts[3] or "null") or [])]
        user = parts[4].split(":")[0]
        why = argv and _picked(argv, _uid(user) if not user.isdigit() else int(user), picks)
        if why:
            out.append({"id": parts[0], "name": parts[1].lstrip("/"), "argv": argv,
                        "why": "docker is restarting it and it runs: %s" % why})
    return out


class Query:
    """Both queries in a thread, started before the scan so their commands overlap it; `get()`
    waits for them (bounded by their own timeouts). `picks` as units() takes it; `systemd`,
    `docker`: callables, on the thread, saying whether each manager runs here."""

    def __init__(self, picks, systemd, docker):
        self.found: dict = {"units": [], "containers": []}
        self._thread = threading.Thread(target=self._run, args=(picks, systemd, docker), daemon=True)
        self._thread.start()

    def _run(self, picks, systemd, docker):
        if systemd():
            self.found["units"] = units(picks)
        if docker():
            self.found["containers"] = containers(picks)

    def get(self):
        self._thread.join(4 * QUERY_TIMEOUT_S + 1)  # four commands at most, each bounded
        return self.found
