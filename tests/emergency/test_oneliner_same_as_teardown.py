"""The pasted emergency line keeps and stops what `invoke teardown` keeps and stops.

Each world is built twice from real processes, once for `invoke teardown` and once for the
line `invoke oneliner --action teardown` prints for the same hosts.env (run with bash -c, as
pasted), and the two sets of survivors are compared with each other and with what the host's
config says. Every hosts.env here carries a SCOPE that only this test's processes have (its
temp dir) and DEVICES of its own fake device files, so neither teardown can reach anything else.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from scripts.config.sandbox import ROLES
from scripts.emergency import shell_teardown
from tests.conftest import invoke
from tests.support.parsers import oneliner_report
from tests.support.procs import ProcessSet, alive, wait_for


def _script(ps: ProcessSet, name: str, *args: str) -> int:
    """`python3 DIR/NAME.py ARGS`: a program the agent names `NAME.py ARGS[0]` (holds no GPU)."""
    path = ps.base / f"{name}.py"
    path.write_text("import sys, time\nopen(sys.argv[sys.argv.index('--ready') + 1], 'w').close()\n"
                    "time.sleep(600)\n")
    return ps.start(["python3", str(path), *args], executable=sys.executable)


# Sandbox roles take words they do not know (`--tag=...`): they only put them in the command line.
def protect_world(ps: ProcessSet):
    """A holder and a program TARGETS names, both with `keep-me` in their command line: PROTECT keeps them."""
    roles = {
        "protected_holder": ps.role("worker", "--gpu", "0", "--tag=keep-me"),
        "holder": ps.role("worker", "--gpu", "1"),
        "protected_named": ps.role("idle", "--tag=keep-me", title="myserve"),
        "named": ps.role("idle", title="myserve"),
    }
    keys = {"TARGETS": "myserve", "PROTECT": "keep-me", "SCOPE": str(ps.base)}
    return roles, keys, {"protected_holder", "protected_named"}


def targets_world(ps: ProcessSet):
    """TARGETS names programs, never text: `myserve` and `mytool.py run` are stopped though they
    hold no GPU; `myserve-helper`, `mytool.py stop` and a job with `myserve` as an argument stay."""
    roles = {
        "holder": ps.role("worker", "--gpu", "0"),
        "named": ps.role("idle", title="myserve"),
        "named_longer": ps.role("idle", title="myserve-helper"),
        "named_as_argument": ps.role("idle", "--job", "myserve"),
        "subcommand": _script(ps, "mytool", "run"),
        "other_subcommand": _script(ps, "mytool", "stop"),
    }
    keys = {"TARGETS": r"myserve|mytool\.py run", "SCOPE": str(ps.base)}
    return roles, keys, {"named_longer", "named_as_argument", "other_subcommand"}


def scoped_world(ps: ProcessSet):
    """SCOPE narrows the targets to command lines holding its text: a holder outside it is left (and
    reported), a program TARGETS names outside it is not touched."""
    scope = f"--tag={ps.base}/scope-in"
    roles = {
        "holder_in": ps.role("worker", "--gpu", "0", scope),
        "holder_out": ps.role("worker", "--gpu", "1"),
        "named_in": ps.role("idle", scope, title="myserve"),
        "named_out": ps.role("idle", title="myserve"),
    }
    keys = {"TARGETS": "myserve", "SCOPE": scope}
    return roles, keys, {"holder_out", "named_out"}


SERVER = r"""
import os, subprocess, sys, time
ready = sys.argv[sys.argv.index("--ready") + 1]
devdir, roles, py = sys.argv[1], sys.argv[2], sys.executable
spawn = "import subprocess, sys, time; p = subprocess.Popen(['sleep', sys.argv[2]]); " \
        "open(sys.argv[1] + '.tmp', 'w').write(str(p.pid)); os = __import__('os'); " \
        "os.rename(sys.argv[1] + '.tmp', sys.argv[1]); time.sleep(600)"
plain = subprocess.Popen(["sleep", "600"])
holder = subprocess.Popen([py, roles, "worker", "--devdir", devdir, "--gpu", "0"])
protected = subprocess.Popen(["nvitop", "-c", spawn, ready + ".p", "601"], executable=py, start_new_session=True)
mid = subprocess.Popen([py, "-c", spawn, ready + ".m", "602"])
while not (os.path.exists(ready + ".p") and os.path.exists(ready + ".m")):
    time.sleep(0.02)
pids = [plain.pid, holder.pid, protected.pid, int(open(ready + ".p").read()), mid.pid, int(open(ready + ".m").read())]
open(ready + ".tmp", "w").write(" ".join(map(str, pids)))
os.rename(ready + ".tmp", ready)
time.sleep(600)
"""


def tree_world(ps: ProcessSet):
    """A program TARGETS names and what it started: a plain child, a GPU holder outside the SCOPE text
    (a tree is asked for the scope at its root only), a grandchild, and a child under a protected name
    in a session of its own, with its own child: that branch is kept by both, the rest stopped."""
    scope = f"--tag={ps.base}/scope-in"
    path = ps.base / "mysrv.py"
    path.write_text(SERVER)
    ready = ps.base / f"ready{ps.n + 1}"
    root = ps.start(["python3", str(path), str(ps.devdir), str(ROLES), scope], executable=sys.executable)
    kids = [int(p) for p in ready.read_text().split()]
    ps.pids.extend(kids)
    names = ("plain", "holder", "protected", "under_protected", "mid", "under_mid")
    roles = dict(zip(names, kids, strict=True), root=root)
    wait_for(lambda: _holds(roles["holder"]), "the tree's holder")
    return roles, {"TARGETS": r"mysrv\.py", "SCOPE": scope}, {"protected", "under_protected"}


class RandomWorld:
    """A flat world drawn from a seed: holders and idle processes, each maybe named by TARGETS, maybe
    under a protected name, maybe tagged for PROTECT, maybe inside a narrower SCOPE. Flat: trees are
    tree_world's."""

    def __init__(self, seed: int):
        self.seed = seed
        self.__name__ = f"random_world_{seed}"

    def __call__(self, ps: ProcessSet):
        import random

        rnd = random.Random(self.seed)
        narrow = rnd.random() < 0.5
        scope = f"--tag={ps.base}/scope-in"
        roles = {}
        for i in range(8):
            holder = rnd.random() < 0.5
            title = rnd.choice([None, None, "myserve", "myserve-x", "nvitop"])
            tags = {word: tag for word, tag, p in (("_protected", "--tag=keep-me", 0.3),
                                                   ("_in_scope", scope, 0.6 if narrow else 0)) if rnd.random() < p}
            role = f"p{i}_{'holder' if holder else 'idle'}_{title or 'plain'}{''.join(tags)}"
            if not holder and title is None and rnd.random() < 0.5:
                sub = rnd.choice(["run", "stop"])
                roles[f"{role}_mytool_{sub}"] = _script(ps, "mytool", sub, *tags.values())
                continue
            roles[role] = ps.role("worker" if holder else "idle", *(["--gpu", str(i % 2)] if holder else []),
                                  *tags.values(), title=title)
        keys = {"TARGETS": r"myserve|mytool\.py run", "PROTECT": "keep-me", "SCOPE": scope if narrow else str(ps.base)}
        return roles, keys, None


def _hosts_env(ps: ProcessSet, keys: dict) -> str:
    keys = {"DEVICES": ps.glob, "FAKE_DEVICES": "yes", **keys}
    return "".join(f"LOCAL_{k}='{v}'\n" for k, v in keys.items())


def _by_invoke(tools: Path | None) -> subprocess.CompletedProcess:
    return invoke("teardown", "--host", "local", "--yes", "--grace", "1", "--settle", "1", timeout=120)


def _by_line(tools: Path | None) -> subprocess.CompletedProcess:
    """The printed line run as pasted; `tools`: the only directory on its PATH (its sh, grep, awk...)."""
    out = invoke("oneliner", "--host", "local", "--action", "teardown", "--grace", "1")
    assert out.returncode == 0, out.stderr
    env = dict(os.environ, PATH=str(tools)) if tools else None
    return subprocess.run(["/bin/bash", "-c", out.stdout.decode().strip()], capture_output=True, timeout=120, env=env)


# What the script runs besides sh's builtins (nvidia-smi is optional: no GPU here).
TOOLS = ("sh", "sed", "cut", "awk", "tr", "head", "grep", "sort", "find", "ls", "xargs", "cat", "id", "stat", "sleep")


def _toolsets(tmp_path: Path) -> dict:
    """How holders are found: fuser (psmisc, on this PATH), GNU find -lname (no fuser), busybox
    alone (ls -l of each fd directory: Debian's busybox has neither fuser nor -lname)."""
    sets: dict = {"fuser": None}
    gnu = tmp_path / "gnu-no-fuser"
    gnu.mkdir()
    for tool in TOOLS:
        found = shutil.which(tool)
        assert found, tool
        (gnu / tool).symlink_to(found)
    sets["find"] = gnu
    if shutil.which("busybox"):
        box = tmp_path / "busybox"
        box.mkdir()
        applets = subprocess.run(["busybox", "--list"], capture_output=True, text=True, check=True).stdout.split()
        for applet in applets:
            (box / applet).symlink_to(shutil.which("busybox"))
        sets["busybox"] = box
    return sets


@pytest.mark.parametrize("world", [protect_world, targets_world, scoped_world, tree_world,
                                   *map(RandomWorld, (1, 2, 3))],
                         ids=lambda w: w.__name__)
def test_the_line_and_invoke_teardown_leave_the_same_survivors(tmp_path, hosts_env, world):
    runs = [("invoke teardown", _by_invoke, None)]
    runs += [(f"pasted line ({name})", _by_line, tools) for name, tools in _toolsets(tmp_path).items()]
    survivors, outputs = {}, {}
    for how, run, tools in runs:
        ps = ProcessSet(tmp_path / how.replace(" ", "-").replace("(", "").replace(")", ""))
        try:
            roles, keys, expected = world(ps)
            hosts_env(_hosts_env(ps, keys))
            ran = run(tools)
            outputs[how] = ran
            survivors[how] = {role for role, pid in roles.items() if alive(pid)}
            assert expected is None or survivors[how] == expected, (how, ran.stdout.decode()[-3000:],
                                                                    ran.stderr.decode()[-2000:])
        finally:
            ps.kill_all()
    assert len(set(map(frozenset, survivors.values()))) == 1, survivors
    # who is left holding a GPU decides the exit code alike: 1 (not free) only in the scoped world
    codes = {how: out.returncode for how, out in outputs.items()}
    assert len(set(codes.values())) == 1, codes
    if isinstance(world, RandomWorld):
        return
    assert set(codes.values()) == {1 if world is scoped_world else 0}, codes
    for how, out in outputs.items():
        if how == "invoke teardown":
            continue
        text = out.stdout.decode()
        report = oneliner_report.parse_report(text)
        assert "@@" not in text and report["sigTERM"], (how, text)
        if world is protect_world:
            kept = [why for verb, why in report["decisions"].values() if verb == "keep"]
            assert len(kept) == 2 and all(why.startswith("its command line matches the host's PROTECT")
                                          for why in kept), (how, text)
        if world is scoped_world:
            assert len(report["outside-scope"]) == 1 and report["remaining"] == report["outside-scope"], (how, text)
            assert report["verdict"] == "not-free"


# -- a scope uid: targets only among one user's processes ------------------------------------------
HOLD = "import sys, time; f = open(sys.argv[1], 'rb'); time.sleep(600)"


def _uid_world(user, shared) -> dict:
    """A real second user's holder and named program, and root's: only the user's are in the scope."""
    base, dev, python = shared.base, shared.devdir, "/usr/bin/python3"  # one that execs under any name
    roles = {
        "user_holder": user.popen([python, "-c", HOLD, str(dev / "nvidia0"), str(base)]).pid,
        "user_named": user.popen([python, "-c", "import os, sys; os.execv(sys.argv[1], sys.argv[2:])",
                                  python, "myserve", "-c", HOLD, str(dev / "nvidiactl"), str(base)]).pid,
        "root_holder": shared.role("worker", "--gpu", "1"),
        "root_named": shared.role("idle", title="myserve"),
    }
    for role in ("user_holder", "user_named"):
        shared.adopt(roles[role])
    wait_for(lambda: all(_holds(roles[r]) for r in ("user_holder", "user_named")), "the user's holders")
    return roles


def _holds(pid: int) -> bool:
    try:
        return any("nvidia" in os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return False


def test_a_scope_uid_keeps_both_to_that_users_processes(second_user, shared_ps):
    """SCOPE_UID (the sandbox's, or a host's): root's holder and root's program TARGETS names are left
    by the agent and by the line alike; the user's are stopped by both."""
    import dataclasses

    if not os.access("/usr/bin/python3", os.X_OK):
        pytest.skip("no /usr/bin/python3 for the second user")
    from scripts.agent.wire.requests import Teardown
    from scripts.config.hostconfig import build_host
    from scripts.reach.transport import call_agent

    keys = {"DEVICES": shared_ps.glob, "FAKE_DEVICES": "yes", "TARGETS": "myserve", "SCOPE": str(shared_ps.base)}
    host = dataclasses.replace(build_host("local", keys, "test"), scope_uid=second_user.uid)
    survivors, codes = {}, {}
    for how in ("agent", "line"):
        roles = _uid_world(second_user, shared_ps)
        if how == "agent":
            codes[how] = call_agent(host, Teardown(grace=1, settle=1, timeout=20)).code
        else:
            argv = shell_teardown.argv(host, grace_s=1, settle_s=1)
            assert argv[-6] == str(second_user.uid)  # the SCOPE_UID parameter
            ran = subprocess.run(argv, capture_output=True, text=True, timeout=120)
            codes[how] = ran.returncode
            report = oneliner_report.parse_report(ran.stdout)
            assert report["outside-scope"] == [roles["root_holder"]], ran.stdout
            assert "owned by uid %d" % second_user.uid in ran.stdout
        survivors[how] = {role for role, pid in roles.items() if alive(pid)}
        ProcessSet._kill(roles.values())
    assert survivors["agent"] == survivors["line"] == {"root_holder", "root_named"}, survivors
    assert codes["agent"] == codes["line"] == 1, codes  # root's holder still holds a GPU


def test_another_persons_idle_target_program_is_left_by_both(second_user, shared_ps, hosts_env):
    """Another person's copy of a program TARGETS names that holds no GPU here is left by both (a
    client, a copy waiting for its turn); their copy that holds a GPU, and root's idle one, are stopped."""
    if not os.access("/usr/bin/python3", os.X_OK):
        pytest.skip("no /usr/bin/python3 for the second user")
    python, base, dev = "/usr/bin/python3", shared_ps.base, shared_ps.devdir
    execv = "import os, sys; os.execv(sys.argv[1], sys.argv[2:])"
    hosts_env(_hosts_env(shared_ps, {"TARGETS": "myserve", "SCOPE": str(base)}))
    survivors, codes = {}, {}
    for how, run in (("invoke teardown", _by_invoke), ("pasted line", _by_line)):
        roles = {
            "user_idle": second_user.popen([python, "-c", execv, python, "myserve", "-c", HOLD, "/dev/null",
                                            str(base)]).pid,
            "user_holder": second_user.popen([python, "-c", execv, python, "myserve", "-c", HOLD,
                                              str(dev / "nvidia0"), str(base)]).pid,
            "root_idle": shared_ps.role("idle", title="myserve"),
        }
        for role in ("user_idle", "user_holder"):
            shared_ps.adopt(roles[role])
        holder = roles["user_holder"]
        wait_for(lambda: _holds(holder), "the user's holder")  # noqa: B023 - called here, in this turn
        ran = run(None)
        codes[how] = ran.returncode
        survivors[how] = {role for role, pid in roles.items() if alive(pid)}
        if how == "pasted line":
            report = oneliner_report.parse_report(ran.stdout.decode())
            verb, why = report["decisions"][roles["user_idle"]]
            assert verb == "leave" and f"another person's (uid {second_user.uid})" in why, why
        ProcessSet._kill(roles.values())
    assert survivors["invoke teardown"] == survivors["pasted line"] == {"user_idle"}, survivors
    assert codes["invoke teardown"] == codes["pasted line"] == 0, codes
