"""The trust promises at their edges: nothing signalled that the plan did not list, nothing
called free that was not seen free, no path another user controls trusted.

Every case is a real process (and, where it is about other users, a real second user);
teardowns are scoped to the test's temp dir (fake devices + SCOPE), or run in a PID
namespace. Each test failed before its fix.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from scripts.agent.wire import requests
from scripts.config.hostconfig import build_host
from scripts.reach.bundle import agent_payload
from tests.conftest import invoke
from tests.support import scenario
from tests.support.agent_inproc import run_agent
from tests.support.paths import REPO
from tests.support.procs import alive, children, cmdline, process_group, wait_for

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (mount namespaces, capabilities, users)")




def host(ps, **keys):
    base = dict(scenario.host_keys(ps), TARGETS="nothing-here")
    base.update(keys)
    return dataclasses.replace(build_host("local", base, "test"), fake_gpus=str(ps.memdir))


def start_py(ps, code, *args, argv0=None):
    ready = ps.base / f"ready-py-{len(ps.pids)}"
    argv = [argv0 or sys.executable, "-c", code, str(ready), *map(str, args)]
    p = subprocess.Popen(argv, executable=sys.executable, start_new_session=True)
    ps.adopt(p.pid)
    wait_for(ready.exists, "holder ready")
    return p.pid


MAP_THEN_CLOSE = r"""
import mmap, os, sys, time
ready, path = sys.argv[1], sys.argv[2]
fd = os.open(path, os.O_RDWR)
m = mmap.mmap(fd, 4096)
os.close(fd)                      # no fd left: only the mapping holds the device
keep = [os.open(sys.argv[3], os.O_RDONLY)] if len(sys.argv) > 3 else []
open(ready, "w").close()
time.sleep(600)
"""


def _size(path):
    with open(path, "wb") as f:
        f.truncate(4096)


def test_mapping_without_an_fd_is_a_holder(ps):
    _size(ps.devdir / "nvidia0")
    pid = start_py(ps, MAP_THEN_CLOSE, ps.devdir / "nvidia0")
    doc = run_agent(host(ps), requests.Verify()).doc
    held = {h["pid"]: h for h in doc["holders"]}
    assert not doc["free"] and pid in held
    assert held[pid]["mapped_devices"] == [str(ps.devdir / "nvidia0")]
    result = run_agent(host(ps), requests.Teardown(grace=2, timeout=10, settle=0.3))
    assert result.code == 0, result.doc["problems"]
    assert not alive(pid)


def test_protected_name_with_a_mapping_under_another_name_is_not_free(ps):
    """Titled like an exporter (protected), maps the device through a hard link and closes
    that fd, keeps a plain fd on the device: a CUDA-like mapping in a protected process."""
    _size(ps.devdir / "nvidia0")
    alias = ps.base / "alias0"
    os.link(ps.devdir / "nvidia0", alias)
    pid = start_py(ps, MAP_THEN_CLOSE, alias, ps.devdir / "nvidia0", argv0="gpu_exporter")
    doc = run_agent(host(ps), requests.Verify()).doc
    held = {h["pid"]: h for h in doc["holders"]}
    assert held[pid]["protected"] and held[pid]["mapped_devices"] == [str(ps.devdir / "nvidia0")]
    assert not doc["free"]
    assert any("is protected" in p and "CUDA context" in p for p in doc["problems"])
    assert alive(pid)


@needs_root
@pytest.mark.skipif(not shutil.which("unshare"), reason="needs unshare")
def test_device_bind_mounted_over_a_proc_path_is_seen(ps):
    ready = ps.base / "ready-procbind"
    code = (f"import os, time; fd = os.open('/proc/version', os.O_RDONLY); open({str(ready)!r}, 'w').close(); "
            "time.sleep(600)")
    bind = f"mount --bind {ps.devdir}/nvidia1 /proc/version && exec {sys.executable} -c \"$0\" {ps.base}"
    p = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c", bind, code],
                         start_new_session=True)
    ps.adopt(p.pid)
    wait_for(ready.exists, "holder behind /proc/version")
    doc = run_agent(host(ps), requests.Verify()).doc
    assert not doc["free"]
    assert {h["pid"]: h["devices"] for h in doc["holders"]}.get(p.pid) == [str(ps.devdir / "nvidia1")]


def _agent(argv, input_=None, env=None):
    out = subprocess.run(argv, input=agent_payload(), capture_output=True, env=env, timeout=60)
    return out.returncode, json.loads(out.stdout.decode().strip().splitlines()[-1])


@needs_root
@pytest.mark.skipif(not shutil.which("setpriv"), reason="needs setpriv")
def test_root_without_ptrace_capability_never_says_free(shared_ps, second_user):
    holder = second_user.popen([second_user.python, "-c", "import os, sys, time; os.open(sys.argv[1], os.O_RDWR); "
                                "open(sys.argv[2], 'w').close(); time.sleep(600)", str(shared_ps.devdir / "nvidia1"),
                                f"{second_user.home}/ready"])
    wait_for(lambda: os.path.exists(f"{second_user.home}/ready"), "second user's holder")
    code, doc = _agent(["setpriv", "--bounding-set", "-sys_ptrace", "--inh-caps", "-sys_ptrace", "--",
                        second_user.python, "-", "verify", "--json", "--fake-devices", "--devices", shared_ps.glob])
    assert code == 6, doc.get("problems")
    assert holder.pid in doc["denied"] and not doc["free"]


@needs_root
def test_hidepid_proc_never_says_free(shared_ps, second_user):
    shared_ps.role("worker", "--gpu", "0")  # root's holder, invisible under hidepid=2
    inner = (f"mount -t proc -o hidepid=2 proc /proc && "
             f"exec setpriv --reuid={second_user.uid} --regid={second_user.gid} "
             f"--init-groups -- {second_user.python} - verify --json --fake-devices --devices '{shared_ps.glob}'")
    code, doc = _agent(["unshare", "--mount", "--propagation", "private", "sh", "-c", inner],
                       env={"PATH": "/usr/bin:/bin", "HOME": second_user.home})
    assert code == 6, doc.get("problems")
    assert "hidepid" in (doc.get("proc_hidden") or "")
    assert not doc["free"]


def test_pipeline_sibling_is_not_a_target_nor_adopted(ps, tmp_path):
    """`torchrun ... | reader` under job control, both reparented to init once the shell
    leaves: the reader shares the server's process group but was started by the shell, and
    what it starts when the server's output ends is not the server's either."""
    log = tmp_path / "train.log"
    pkg = ps.base / "pkg"
    scenario._server_shim(pkg)
    script = (f"set -m; PYTHONPATH={pkg} python3 -m sglang.launch_server --devdir {ps.devdir} --tp 1 --ready "
              f"{tmp_path}/srv.ready | sh -c 'cat > {log}; sleep 600; : {tmp_path}' & "
              f"echo $! > {tmp_path}/reader.pid; exit 0")
    path = f"{Path(sys.executable).parent}:{os.environ['PATH']}"
    subprocess.run(["bash", "-c", script], check=True, timeout=30, env=dict(os.environ, PATH=path))
    wait_for((tmp_path / "srv.ready").exists, "server ready")
    reader = int((tmp_path / "reader.pid").read_text())
    ps.adopt(reader)
    server = next(p for p in process_group(reader) if p != reader and "sglang.launch_server" in cmdline(p))
    ps.adopt(server)
    ps.pids.extend(process_group(reader))
    h = host(ps, TARGETS=r"sglang\.launch_server")
    plan = run_agent(h, requests.Plan()).doc["plan"]
    planned = {t["pid"] for t in plan["targets"]}
    assert server in planned and reader not in planned
    result = run_agent(h, requests.Teardown(grace=2, timeout=10, settle=0.5))
    later = children(reader)  # what the reader started once the server's output ended
    ps.pids.extend(later)
    assert result.code == 0, result.doc["problems"]
    assert not alive(server) and alive(reader)
    signalled = {a["pid"] for a in result.doc["actions"]}
    assert reader not in signalled and not (signalled & set(later)), result.doc["actions"]


def test_escape_sequences_in_titles_are_shown_escaped(ps, hosts_env):
    title = "\x1b[1A\x1b[2K\rFREE: every GPU is free\x1b[8m"
    ps.role("worker", "--gpu", "0", title=title)
    hosts_env(scenario.env_lines(ps))
    out = invoke("verify", "--host", "local")
    assert out.returncode == 1
    assert b"\x1b" not in out.stdout + out.stderr
    assert b"\\x1b[1A" in out.stdout


@pytest.mark.parametrize("opts,word", [("-E /tmp/victim", "-E"), ("-S /tmp/sock", "-S"),
                                       ("-o ControlPath=/tmp/x", "ControlPath"),
                                       ("-o StrictHostKeyChecking=accept-new", "stricthostkeychecking"),
                                       ("-L /tmp/s:localhost:22", "-L")])
def test_ssh_options_that_write_local_paths_are_refused(hosts_env, opts, word):
    hosts_env(f"GPU1_SSH=root@127.0.0.1\nGPU1_SSH_OPTS='{opts}'\n")
    out = invoke("hosts")
    assert out.returncode == 2
    err = out.stderr.decode().strip()
    assert len(err.splitlines()) == 1 and word in err


@pytest.mark.parametrize("args", [["plan", "--match", "a{99999999999}"], ["plan", "--match", "(" * 1200 + ")" * 1200]])
def test_pathological_patterns_are_one_line_exit_2(hosts_env, args):
    hosts_env("")
    out = invoke(*args, "--host", "local")
    assert out.returncode == 2, out.stderr
    assert b"Traceback" not in out.stderr and len(out.stderr.decode().strip().splitlines()) == 1


def test_python_option_refused_and_missing_interpreter_exits_3(hosts_env):
    hosts_env("LOCAL_PYTHON=-c\n")
    out = invoke("ping", "--host", "local")
    assert out.returncode == 2 and b"LOCAL_PYTHON" in out.stderr
    hosts_env("LOCAL_PYTHON=no-such-python-here\n")
    out = invoke("ping", "--host", "local")
    assert out.returncode == 3, out.stderr
    assert b"Traceback" not in out.stderr and b"no-such-python-here" in out.stderr


@pytest.mark.parametrize("approved", ["x:y", "1", "1:2,,3:"])
def test_agent_refuses_a_malformed_approved_list(ps, approved):
    out = subprocess.run([sys.executable, "scripts/gpuagent.py", "teardown", "--json", "--fake-devices", "--devices",
                          ps.glob, "--scope", str(ps.base), "--approved", approved], capture_output=True, text=True,
                         cwd=REPO, timeout=30)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "--approved" in out.stdout and "Traceback" not in out.stderr


def test_squatted_default_ssh_dir_costs_sharing_not_the_teardown(second_user, monkeypatch, tmp_path):
    """Root's default ControlPath dir sits in its run dir; where that path is too long for a
    socket the /tmp fallback is used, and a squatter there costs connection sharing only."""
    import hashlib

    from scripts.reach import ssh

    if os.geteuid() != 0:
        pytest.skip("the case is root's default")
    monkeypatch.delenv(ssh.CONTROL_DIR_ENV, raising=False)
    run_dir = tmp_path / ("r" * 40)
    monkeypatch.setenv("GPU_PIVOT_RUN_DIR", str(run_dir))
    fallback = f"/tmp/gpu-pivot-ssh-0-{hashlib.sha1(str(run_dir / 'ssh').encode()).hexdigest()[:10]}"
    made = second_user.run(["mkdir", "-m", "700", fallback])
    assert made.returncode == 0, made.stderr
    try:
        assert ssh.control_opts() == ["-o", "ControlMaster=no", "-o", "ControlPath=none"]
    finally:
        second_user.run(["rm", "-rf", "--", fallback])


def test_a_scope_that_starts_with_a_dash_reaches_the_agent(ps, hosts_env):
    """Found on the GPU machine: LOCAL_SCOPE=--token was read by the agent's argparse as a flag."""
    server = scenario._server(ps, "--tp", "1")
    keys = dict(scenario.host_keys(ps), SCOPE=f"--devdir {ps.devdir}")
    hosts_env("".join(f"LOCAL_{k}='{v}'\n" for k, v in keys.items()))
    out = invoke("plan", "--host", "local", "--json", "--match", "-never-a-program")
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)["local"]["plan"]
    assert server in {t["pid"] for t in plan["targets"]}
    assert plan["scope"]["text"] == f"--devdir {ps.devdir}"


# -- second round ------------------------------------------------------------------------

SLOW_SERVER = r"""
import os, sys, time
ready, dev, delay = sys.argv[1], sys.argv[2], float(sys.argv[3])
time.sleep(delay)                      # a real server imports for seconds before it opens a GPU
fd = os.open(dev, os.O_RDONLY)
open(ready, "w").close()
time.sleep(600)
"""


def test_a_loop_whose_restart_would_load_for_3_s_is_ended_first(ps, tmp_path):
    """A loop restarts the server, the new one taking 3 s to open the device, longer than the
    settle window: the loop never gets that turn."""
    server = tmp_path / "slow_server.py"
    server.write_text(SLOW_SERVER)
    sup = tmp_path / "supervise.sh"
    sup.write_text(f"n=0; d=0; while :; do n=$((n+1)); {sys.executable} {server} {tmp_path}/ready.$n "
                   f"{ps.devdir}/nvidia0 $d; d=3; sleep 0.1; done\n")
    supervisor = subprocess.Popen(["bash", str(sup)], start_new_session=True)
    ps.adopt(supervisor.pid)
    wait_for((tmp_path / "ready.1").exists, "first server holding the device")
    ps.pids.extend(children(supervisor.pid))
    result = run_agent(host(ps, TARGETS=r"slow_server\.py"), requests.Teardown(grace=2, timeout=10, settle=1))
    ps.pids.extend(children(supervisor.pid))
    # the loop is the server's parent, its job's own: frozen before the SIGTERM, ended after, so
    # the slow restart never starts (tests/agent/teardown/test_teardown_speed.py has a restart
    # the window must see)
    assert result.code == 0, result.doc["problems"]
    assert not alive(supervisor.pid) and not (tmp_path / "ready.2").exists()


def test_a_unit_is_stopped_only_when_all_its_processes_are_targets(monkeypatch):
    """A GPU job started from cron lives in cron.service: stopping the unit would end cron.
    (systemd cannot run here: the cgroup read is the stand-in; the rule is what is tested.)"""
    from scripts.agent.teardown import plan

    cgroups = {10: ("cron.service", "/system.slice/cron.service"), 11: ("cron.service", "/system.slice/cron.service"),
               20: ("vllm.service", "/system.slice/vllm.service"), 21: ("vllm.service", "/system.slice/vllm.service"),
               30: ("job.service", "/user.slice/user-1000.slice/user@1000.service/app.slice/job.service")}
    monkeypatch.setattr(plan.cgroup, "read", lambda pid, proc="/proc": {
        "unit": cgroups[pid][0], "path": cgroups[pid][1], "container": None} if pid in cgroups else
        {"unit": None, "path": None, "container": None})
    targets = [{"pid": 11, "unit": "cron.service", "container": None},
               {"pid": 20, "unit": "vllm.service", "container": None},
               {"pid": 21, "unit": "vllm.service", "container": None},
               {"pid": 30, "unit": "job.service", "container": None}]
    assert plan._wholly_targeted(targets, {p: {} for p in cgroups}) == {"vllm.service"}


def test_protected_looking_unreadable_process_blocks_free_without_nvml(shared_ps, second_user):  # noqa: F811
    """Another user cannot read root's `nvitop`-named holder; with no NVML to vouch, that
    must be 'could not inspect' (exit 6), not FREE."""
    code_txt = ("import os, sys, time; os.open(sys.argv[1], os.O_RDONLY); open(sys.argv[2], 'w').close(); "
                "time.sleep(600)")
    ready = shared_ps.base / "ready-nvitop"
    p = subprocess.Popen(["nvitop", "-c", code_txt, str(shared_ps.devdir / "nvidia0"), str(ready)],
                         executable=sys.executable, start_new_session=True)
    shared_ps.adopt(p.pid)
    wait_for(ready.exists, "nvitop-named holder")
    code, doc = _agent(second_user.argv([second_user.python, "-", "verify", "--json", "--fake-devices", "--devices",
                                         shared_ps.glob]), env=second_user.env())
    assert code == 6, doc.get("problems")
    assert p.pid in doc["denied"] and not doc["free"]


def test_a_huge_node_set_is_refused_at_once(hosts_env):
    """Refused from its size, before a name is made: expanding 99,999,999 names would take
    minutes and gigabytes, past the call's deadline (no wall-clock bound of its own: under a
    loaded machine's stress run, 20 s was too little for a CLI start)."""
    hosts_env("")
    out = invoke("status", "--host", "gpu[1-99999999]", timeout=120)
    assert out.returncode == 2 and b"at most" in out.stderr


def test_ssh_dir_never_inside_a_runtime_dir_another_user_owns(second_user, monkeypatch):  # noqa: F811
    from scripts.reach import ssh

    shared = f"/tmp/gprt-{os.getpid()}"
    assert second_user.run(["mkdir", "-m", "1777", shared]).returncode == 0
    try:
        monkeypatch.setenv("XDG_RUNTIME_DIR", shared)
        monkeypatch.setattr(ssh.os, "geteuid", lambda: 1000)  # the non-root branch, as such a user
        assert not ssh._default_base().startswith(shared)
    finally:
        second_user.run(["rm", "-rf", shared])
