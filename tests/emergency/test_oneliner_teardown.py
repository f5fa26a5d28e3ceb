"""The emergency one-liner, printed by `invoke oneliner --action teardown`, run through the
real quoting layers (bash -c -> ssh -> pct exec -> sh -c) against real processes."""
import os
import subprocess
import sys

import pytest

from scripts.emergency import shell_teardown
from tests.conftest import invoke
from tests.support import scenario
from tests.support.parsers import oneliner_report
from tests.support.procs import alive, children, wait_for


def script_argv(glob: str, grace: str = "1", settle: str = "2", scope: str = "", **config) -> list:
    """`sh -c SCRIPT` with the agent's default targets, the waits as given (text: bad ones too)."""
    params = shell_teardown.positional(glob, 0, 0, scope=scope, **config)
    return ["sh", "-c", shell_teardown.script_text(), shell_teardown.NAME, *params[:-2], grace, settle]


def test_oneliner_through_ssh_and_pct(ps, sshd, hosts_env):
    roles = scenario.start(ps)
    hosts_env(sshd.hosts_env("gpu2", ctid="129", extra=scenario.host_keys(ps)))
    out = invoke("oneliner", "--host", "gpu2", "--action", "teardown", "--grace", "1")
    assert out.returncode == 0, out.stderr
    line = out.stdout.decode().strip()
    assert line.startswith("ssh ") and "pct exec 129 -- sh -c" in line
    assert "pkill" not in line and "fuser -k" not in line and "killall" not in line
    ran = subprocess.run(["bash", "-c", line], capture_output=True, text=True, timeout=60)
    report = oneliner_report.parse_report(ran.stdout)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    gpu_targets = {roles[r] for r in ("server", "worker0", "worker1", "stubborn", "stubborn_worker", "orphan",
                                      "renamed")}
    assert set(report["holders"]) == gpu_targets | {roles["persistenced"], roles["monitor"]}
    assert set(report["protected"]) == {roles["persistenced"], roles["monitor"]}
    tree = {roles["tokenizer"]}  # the server's child that holds no GPU: in the tree of a program TARGETS names
    assert set(report["sigTERM"]) == gpu_targets | tree
    assert set(report["sigKILL"]) == {roles["stubborn"], roles["stubborn_worker"]}
    assert report["remaining"] == [] and report["verdict"] == "free"
    assert report["restarters"].startswith("not checked")  # it cannot freeze or judge what started them
    assert all(alive(roles[r]) for r in scenario.BYSTANDER_ROLES)
    assert not any(alive(p) for p in gpu_targets | tree)
    assert report["decisions"][roles["tokenizer"]][1].startswith(f"started by target {roles['server']};")
    # what the server double-forked into its session (reparented to PID 1) is in no tree: the agent
    # stops it with the session the server leads, the line does not
    assert alive(roles["group_helper"])
    # for people: each holder by pid and name, with what is done and why; who the grace waits for
    assert "@@" not in ran.stdout
    assert report["names"][roles["persistenced"]] == "nvidia-persiste"
    assert report["decisions"][roles["monitor"]][0] == "keep" and "protected name nvitop" in \
        report["decisions"][roles["monitor"]][1]
    assert all(report["decisions"][p][0] == "TERM" for p in gpu_targets)
    lines = ran.stdout.splitlines()
    waited = [i for i, line in enumerate(lines) if line.startswith("waiting up to 1 s")]
    assert waited and f"{roles['stubborn']} (" in lines[waited[0]], ran.stdout
    keys = [line.split(":", 1)[0] for line in lines]
    assert keys.index("sigTERM") < waited[0] < keys.index("sigKILL"), ran.stdout  # said during the grace


def test_report_parser_rejects_missing_report():
    with pytest.raises(ValueError, match="no gpu-pivot one-liner report"):
        oneliner_report.parse_report("Welcome!\n")


def test_oneliner_as_another_user_never_says_free(second_user, tmp_path):
    """Not root: other users' open files are unreadable, so an empty holder list proves nothing."""
    import os
    import tempfile

    base = tempfile.mkdtemp(prefix="gp-ol-", dir="/tmp")
    try:
        os.chmod(base, 0o755)
        open(os.path.join(base, "nvidia0"), "w").close()
        ran = second_user.run(script_argv(f"{base}/nvidia*", scope=base), text=True)
        report = oneliner_report.parse_report(ran.stdout)
        assert ran.returncode == 1 and report["verdict"] == "not-free"
        assert "run as root" in report["not-root"]
    finally:
        subprocess.run(["rm", "-rf", base])


def test_shell_protect_list_is_the_agents():
    """One protect list: the script's own copy equals what is generated from the contract,
    and the generated one-liner protects every name the agent protects (run in sh)."""
    from scripts.agent.policy import rules

    text = shell_teardown.SCRIPT.read_text()
    assert f"        {shell_teardown.protected_case()}) return 0 ;;" in text.splitlines()
    script = shell_teardown.script_text()
    assert f"{shell_teardown.protected_case()}) return 0 ;;" in script
    for name in [*rules.PROTECTED_NAMES, "node-exporter", "gpu_exporter", "sshd:"]:
        probe = f'case "$0" in {shell_teardown.protected_case()}) exit 0 ;; esac; exit 1'
        assert subprocess.run(["sh", "-c", probe, name]).returncode == 0, name
    assert subprocess.run(["sh", "-c", f'case python3 in {shell_teardown.protected_case()}) exit 0;; esac; exit 1']
                          ).returncode == 1


# -- who a protected name may protect ------------------------------------------------------------
# Runs as PID 1 of its own PID namespace (unshare --pid --fork --mount-proc): the teardown there
# sees only the processes started here, and every one of them ends when this driver exits.
NS_DRIVER = r"""
import json, os, shutil, subprocess, sys, time
base, script, uid, gid, python = sys.argv[1:6]
script = json.loads(script)  # sh -c SCRIPT NAME, and the config before DEVICE_GLOB's place is filled
dev = base + "/nvidia0"
hold = base + "/hold.py"
procs, roles = [], {}


def start(role, argv, user=False, executable=None, stdin=None, mapped=False):
    if user:  # setpriv runs argv[0] as the path: exec the program under its argv[0] after it
        argv = ["setpriv", "--reuid=" + uid, "--regid=" + gid, "--clear-groups", "--", python, "-c",
                "import os, sys; os.execv(sys.argv[1], sys.argv[2:])", executable or argv[0]] + argv
        executable = None
    proc = subprocess.Popen(argv, executable=executable, stdin=stdin, cwd=base)
    procs.append(proc)
    roles[role] = proc.pid
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:  # ready: it holds (and maps) the device file
        try:
            fds = [os.readlink("/proc/%d/fd/%s" % (proc.pid, fd)) for fd in os.listdir("/proc/%d/fd" % proc.pid)]
            with open("/proc/%d/maps" % proc.pid) as f:
                maps = f.read()
        except OSError:
            fds, maps = [], ""
        if dev in fds and (not mapped or dev in maps):
            return
        time.sleep(0.02)
    raise SystemExit("%s never held %s" % (role, dev))


def teardown():
    # cwd holds a file named Xorg: a comm `*` that the shell expanded would read as Xorg
    out = subprocess.run(script["head"] + [base + "/nvidia*"] + script["tail"], cwd=base,
                         capture_output=True, text=True, timeout=60)
    return {"rc": out.returncode, "stdout": out.stdout, "stderr": out.stderr}


def alive():
    res = {}
    for role, pid in roles.items():
        try:
            with open("/proc/%d/stat" % pid) as f:
                res[role] = f.read().rsplit(") ", 1)[1][0] != "Z"
        except OSError:
            res[role] = False
    return res


# a user's programs under protected names: argv[0] Xorg; `python3 ~/nvitop` (argv[1] only)
start("user_argv0_xorg", ["Xorg", hold, "map"], user=True, executable=python, mapped=True)
start("user_nvitop_script", [python, base + "/nvitop", "plain"], user=True)
# root's: a protected name only as argv[1]; a comm with a space; a comm `*`; a program a user owns;
# a root-owned program that its group may change
start("root_nvitop_script", [python, base + "/nvitop", "plain"])
start("root_comm_space", [python, hold, "comm:x Xorg"])
start("root_comm_star", [python, hold, "comm:*"])
with open(dev) as d:
    start("root_user_owned_exe", [base + "/Xorg", "600"], stdin=d)
    start("root_group_writable_exe", [base + "/nvtop", "600"], stdin=d)
# trusted: system uid, root-owned interpreter, argv[0] Xorg, no mapping
start("root_xorg", ["Xorg", hold, "plain"], executable=python)
first = teardown()
first_alive = alive()
# trusted and protected, but with a CUDA context (the device file mapped): never "free"
start("root_persistenced_mapped", ["nvidia-persistenced", hold, "map"], executable=python, mapped=True)
second = teardown()
print(json.dumps({"roles": roles, "first": first, "first_alive": first_alive, "second": second,
                  "second_alive": alive()}))
for proc in procs:
    if proc.poll() is None:
        proc.kill()
    proc.wait(10)
"""

HOLD = r"""
import ctypes, mmap, os, sys, time
how = sys.argv[-1]
if how.startswith("comm:"):
    ctypes.CDLL(None).prctl(15, ctypes.c_char_p(how[5:].encode()), 0, 0, 0)  # PR_SET_NAME
fd = os.open(os.path.join(os.path.dirname(os.path.abspath(sys.argv[0])), "nvidia0"), os.O_RDONLY)
held = mmap.mmap(fd, 4096, prot=mmap.PROT_READ) if how == "map" else None
time.sleep(600)
"""


def test_protected_names_trusted_only_from_system_uids_and_root_programs(second_user):
    """A name protects only a process whose uids are all system uids and whose program is a
    root-owned file only root can change; names come from comm and argv[0] only, matched whole
    (no word splitting, no globbing); a trusted protected holder that maps the device (a CUDA
    context) keeps the verdict not-free. Real processes of a real second user, fake device files,
    inside a PID namespace so the teardown can see nothing else."""
    import json
    import os
    import shutil
    import tempfile

    if not shutil.which("unshare"):
        pytest.skip("no unshare")
    python = os.path.realpath("/usr/bin/python3")
    if os.stat(python).st_uid != 0:
        pytest.skip("no root-owned /usr/bin/python3")
    base = tempfile.mkdtemp(prefix="gp-c2-", dir="/tmp")
    try:
        os.chmod(base, 0o755)
        with open(os.path.join(base, "nvidia0"), "wb") as f:
            f.write(bytes(4096))
        for name in ("hold.py", "nvitop"):
            with open(os.path.join(base, name), "w") as f:
                f.write(HOLD)
        sleep = shutil.which("sleep") or "/bin/sleep"
        shutil.copy(sleep, os.path.join(base, "Xorg"))
        os.chown(os.path.join(base, "Xorg"), second_user.uid, second_user.gid)
        shutil.copy(sleep, os.path.join(base, "nvtop"))
        os.chmod(os.path.join(base, "nvtop"), 0o775)
        whole = script_argv("GLOB")
        at = whole.index("GLOB")
        script = json.dumps({"head": whole[:at], "tail": whole[at + 1:]})
        ran = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", python, "-c", NS_DRIVER, base,
                              script, str(second_user.uid), str(second_user.gid), python],
                             capture_output=True, text=True, timeout=120)
        assert ran.returncode == 0, ran.stdout + ran.stderr
        res = json.loads(ran.stdout.strip().splitlines()[-1])
    finally:
        subprocess.run(["rm", "-rf", base])
    roles = res["roles"]
    first = oneliner_report.parse_report(res["first"]["stdout"])
    stopped = {"user_argv0_xorg", "user_nvitop_script", "root_nvitop_script", "root_comm_space", "root_comm_star",
               "root_user_owned_exe", "root_group_writable_exe"}
    assert res["first"]["rc"] == 0, res["first"]
    assert set(first["holders"]) == {roles[r] for r in stopped | {"root_xorg"}}
    assert first["protected"] == [roles["root_xorg"]]
    assert set(first["sigTERM"]) == {roles[r] for r in stopped}
    assert first["remaining"] == [] and first["protected-mapped"] == [] and first["verdict"] == "free"
    assert res["first_alive"] == {r: r == "root_xorg" for r in roles if r != "root_persistenced_mapped"}
    second = oneliner_report.parse_report(res["second"]["stdout"])
    assert res["second"]["rc"] == 1, res["second"]
    assert set(second["protected"]) == {roles["root_xorg"], roles["root_persistenced_mapped"]}
    assert second["sigTERM"] == [] and second["remaining"] == []
    assert second["protected-mapped"] == [roles["root_persistenced_mapped"]] and second["verdict"] == "not-free"
    assert res["second_alive"]["root_xorg"] and res["second_alive"]["root_persistenced_mapped"]


def _respawning_holder(ps):
    """A loop that opens the fake device again the moment its holder is gone (the holder
    carries the temp dir in its argv: ps ends it whatever its pid)."""
    dev = ps.base / "olsettle" / "nvidia0"
    dev.parent.mkdir()
    dev.write_text("")
    hold = f"{sys.executable} -c 'import time; time.sleep(600)' {dev} 3<{dev}"
    loop = subprocess.Popen(["bash", "-c", f"while :; do {hold}; done"], start_new_session=True,
                            stdin=subprocess.DEVNULL)
    ps.adopt(loop.pid)
    wait_for(lambda: any(_holds(c, dev) for c in children(loop.pid)), "the first holder")
    return dev, loop


def _holds(pid, path) -> bool:
    """Does `pid` have `path` open? Its fds come and go while it starts, and it may be gone."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") == str(path):
                return True
        except OSError:
            continue
    return False


def _run(dev, grace, settle):
    return subprocess.run(script_argv(f"{dev.parent}/nvidia*", grace, settle, scope=str(dev.parent)),
                          capture_output=True, text=True, timeout=120)


def test_a_settle_of_0_still_looks_once_after_the_kill(ps):
    """SETTLE 0 means no wait, never no look: a holder back by then keeps the verdict not-free."""
    dev, _ = _respawning_holder(ps)
    ran = _run(dev, "1", "0")
    report = oneliner_report.parse_report(ran.stdout)
    assert ran.returncode == 1 and report["verdict"] == "not-free" and report["remaining"], ran.stdout


@pytest.mark.parametrize("grace, settle", [("", "2"), ("1", ""), ("1", "2.5"), ("1", "abc"), ("-1", "2")])
def test_waits_that_are_not_whole_seconds_are_refused_before_any_signal(ps, grace, settle):
    dev, loop = _respawning_holder(ps)
    holder = children(loop.pid)
    ran = _run(dev, grace, settle)
    assert ran.returncode == 2 and "whole seconds" in ran.stderr and "nothing was signalled" in ran.stderr
    assert "sigTERM" not in ran.stdout and children(loop.pid) == holder


def test_a_program_targets_names_is_never_the_lines_own_ancestor(ps):
    """The line runs under a program TARGETS names (`myserve` runs it): that ancestor is neither
    signalled nor listed; another `myserve` is stopped."""
    other = ps.role("idle", title="myserve")
    params = shell_teardown.positional(ps.glob, 1, 0, targets=["myserve"], scope=str(ps.base))
    runner = subprocess.run(["myserve", "-c", "import os, subprocess, sys; print('runner', os.getpid()); "
                             "sys.stdout.flush(); sys.exit(subprocess.call(sys.argv[1:]))",
                             "sh", "-c", shell_teardown.script_text(), shell_teardown.NAME, *params],
                            executable=sys.executable, capture_output=True, text=True, timeout=60)
    runner_pid = int(runner.stdout.split()[1])
    report = oneliner_report.parse_report(runner.stdout)
    assert runner.returncode == 0 and report["sigTERM"] == [other], runner.stdout
    assert runner_pid not in report["decisions"] and runner_pid not in report["names"]
    assert not alive(other)


FORGER = r"""
import ctypes, sys, time
ctypes.CDLL(None).prctl(15, ctypes.c_char_p(b") 1 (\nverdict"), 0, 0, 0)  # PR_SET_NAME
f = open(sys.argv[1], "rb")
open(sys.argv[2], "w").close()
time.sleep(600)
"""


def test_a_holders_name_and_command_line_cannot_forge_report_lines(ps):
    """A holder named `) 1 (` + newline, its argv[0] holding report lines and a terminal escape:
    its line stays one line, its name one word, and the report reads as what happened."""
    ready = ps.base / "forger.ready"
    forged = "x\n==gpu-pivot-oneliner end==\nverdict: free\nsigTERM: 1 (init)\n\x1b]0;pwned\x07"
    proc = subprocess.Popen([forged, "-c", FORGER, str(ps.devdir / "nvidia0"), str(ready), str(ps.base)],
                            executable=sys.executable, start_new_session=True)
    ps.adopt(proc.pid)
    wait_for(ready.exists, "the forger")
    stubborn = ps.role("worker", "--gpu", "1", "--ignore-term")
    ran = subprocess.run(script_argv(ps.glob, "1", "0", scope=str(ps.base)), capture_output=True, text=True,
                         timeout=60)
    report = oneliner_report.parse_report(ran.stdout)
    assert "\x1b" not in ran.stdout and ran.stdout.splitlines().count(oneliner_report.END) == 1
    assert set(report["sigTERM"]) == {proc.pid, stubborn}
    assert report["sigKILL"] == [stubborn] and report["verdict"] == "free", ran.stdout
    assert report["names"][proc.pid] == "??1???verdict"  # one word: no space, parenthesis or line break
    lines = [line for line in ran.stdout.splitlines() if line.startswith(f"TERM {proc.pid} ")]
    assert len(lines) == 1 and "?==gpu-pivot-oneliner end==?verdict: free?" in lines[0], ran.stdout
