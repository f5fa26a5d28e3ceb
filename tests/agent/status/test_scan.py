"""Agent scan/verify against real processes holding fake device files (no GPU needed)."""
import json
import os
import signal
import subprocess
import sys

import pytest

from scripts.agent.holders import scan
from scripts.agent.procs import cgroup
from scripts.agent.teardown import verify
from tests.support.parsers import fuser as fuser_parse
from tests.support.procs import alive, state, wait_for
from tests.support.scans import holders_by_pid, scan_args

HOLDER = """
import os, sys, time, subprocess
files = [open(p, 'rb') for p in sys.argv[1:]]
{body}
time.sleep(3600)
"""


def test_scan_finds_tree_orphan_stopped_zombie_renamed(ps, tmp_path):
    server, workers = ps.server()
    holder = ps.role("worker", "--gpu", "1")
    os.kill(holder, signal.SIGSTOP)
    wait_for(lambda: state(holder) == "T", "stopped state")
    body = "c = subprocess.Popen(['true']); open(sys.argv[1] + '.z', 'w').write(str(c.pid))"
    zparent = subprocess.Popen([sys.executable, "-c", HOLDER.replace("{body}", body), str(ps.devdir / "nvidia0")],
                               start_new_session=True)
    ps.adopt(zparent.pid)
    zfile = ps.devdir / "nvidia0.z"
    zpid = int(wait_for(lambda: zfile.exists() and zfile.read_text(), "zombie pid"))
    wait_for(lambda: state(zpid) == "Z", "zombie")
    renamed = subprocess.Popen(["bash", "-c", f"exec -a 'sglang::scheduler_TP0' {sys.executable} -c \"$0\" \"$@\"",
                                HOLDER.replace("{body}", ""), str(ps.devdir / "nvidia1")], start_new_session=True)
    ps.adopt(renamed.pid)
    wait_for(lambda: _holds(renamed.pid, "nvidia1"), "renamed holder")
    real_orphan = _orphan(ps, tmp_path)

    doc = scan.collect(scan_args(ps).selection)
    by_pid = holders_by_pid(doc)
    assert set(by_pid) >= {server, *workers, holder, zparent.pid, renamed.pid, real_orphan}
    assert all(by_pid[w]["ppid"] == server and by_pid[w]["pgid"] == server for w in workers)
    assert by_pid[workers[0]]["cmdline"].startswith("sglang::scheduler_TP0 ")
    assert by_pid[workers[0]]["gpu_mib"] == {"0": 20480}
    assert by_pid[holder]["state"] == "T"
    assert by_pid[renamed.pid]["argv"][0] == "sglang::scheduler_TP0"
    assert by_pid[renamed.pid]["devices"] == [str(ps.devdir / "nvidia1")]
    assert by_pid[real_orphan]["ppid"] != os.getpid()
    related = {r["pid"]: r for r in doc["related"]}
    assert related[zpid]["state"] == "Z" and related[zpid]["ppid"] == zparent.pid
    assert os.getpid() not in by_pid  # the agent (here: this test process) never counts itself
    assert by_pid[server]["start_time"] > 0 and by_pid[server]["user"]


def _holds(pid, name):
    try:
        return any(os.readlink(f"/proc/{pid}/fd/{fd}").endswith(name) for fd in os.listdir(f"/proc/{pid}/fd"))
    except OSError:  # an fd closed while we looked
        return False


def _orphan(ps, tmp_path):
    """A holder whose parent exited: reparented to init or a subreaper."""
    from scripts.config.sandbox import ROLES
    pidfile = tmp_path / "orphan.pid"
    ready = tmp_path / "orphan.ready"
    code = ("import subprocess, sys; p = subprocess.Popen(sys.argv[1:], stdin=subprocess.DEVNULL, "
            "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); open(%r, 'w').write(str(p.pid))" % str(pidfile))
    parent = subprocess.Popen([sys.executable, "-c", code, sys.executable, str(ROLES), "worker", "--devdir",
                               str(ps.devdir), "--gpu", "0", "--ready", str(ready)], start_new_session=True)
    parent.wait()
    pid = int(pidfile.read_text())
    ps.adopt(pid)
    wait_for(ready.exists, "orphan ready")
    assert state(parent.pid) is None  # its parent is gone
    return pid


def test_scan_agrees_with_real_fuser(ps):
    server, workers = ps.server()
    monitor = ps.role("hold", title="nvitop")
    devices = sorted(str(p) for p in ps.devdir.iterdir())
    out = subprocess.run(["fuser", "-v", *devices], capture_output=True, text=True)
    parsed = fuser_parse.verbose(out.stdout, out.stderr)
    doc = scan.collect(scan_args(ps).selection)
    assert set(parsed["holders"]) == set(holders_by_pid(doc)) == {server, *workers, monitor}
    for pid, files in parsed["holders"].items():
        assert sorted(files) == holders_by_pid(doc)[pid]["devices"]


def test_protected_marked_and_verify(ps):
    server, workers = ps.server()
    persist = ps.role("hold", title="nvidia-persistenced")
    monitor = ps.role("hold", title="nvitop")
    doc = scan.collect(scan_args(ps).selection)
    by_pid = holders_by_pid(doc)
    assert "persistence" in by_pid[persist]["protected"]
    assert "monitor" in by_pid[monitor]["protected"]
    assert by_pid[server]["protected"] is None
    free, problems = verify.evaluate(doc, 0)
    assert not free and any(f"pid {server}" in p for p in problems)
    for pid in [server, *workers]:
        os.kill(pid, signal.SIGKILL)
    free, doc, problems, waited = verify.wait_free(scan_args(ps).selection, 5.0)
    assert free, problems
    assert [g["used_mib"] for g in doc["gpus"]] == [0, 0]
    assert alive(persist) and alive(monitor)


def test_verify_wait_times_out_and_lists_holders(ps):
    server, workers = ps.server(tp=1)
    free, doc, problems, waited = verify.wait_free(scan_args(ps).selection, 0.3)
    assert not free and waited >= 0.3
    rows = verify.still_holding(doc)
    assert {r["pid"] for r in rows} == {server, workers[0]}
    assert [r for r in rows if r["pid"] == workers[0]][0]["used_mib"] == 20480


def test_user_protect_pattern(ps):
    pid = ps.role("hold", "--job", "my-metrics-agent")
    doc = scan.collect(scan_args(ps, protect=[r"my-metrics-agent"]).selection)
    assert "host protect pattern" in holders_by_pid(doc)[pid]["protected"]


def test_cgroup_of_this_process_parses():
    with open("/proc/self/cgroup") as f:
        text = f.read()
    out = cgroup.parse(text)
    assert out["path"] == cgroup.pick_path(text)
    assert out["path"].startswith("/")


CGROUPS = {
    "systemd service, v2": ("0::/system.slice/vllm.service\n", "vllm.service", None),
    "systemd service, v1": ("12:pids:/system.slice/vllm.service\n11:memory:/system.slice/vllm.service\n"
                            "1:name=systemd:/system.slice/vllm.service\n0::/\n", "vllm.service", None),
    "docker, systemd driver": ("0::/system.slice/docker-" + "a" * 64 + ".scope\n", None, ("docker", "a" * 64)),
    "docker, cgroupfs driver v1": ("12:pids:/docker/" + "b" * 64 + "\n1:name=systemd:/docker/" + "b" * 64 + "\n",
                                   None, ("docker", "b" * 64)),
    "lxc from the Proxmox node": ("0::/lxc/129/ns/system.slice/sglang.service\n", "sglang.service", ("lxc", "129")),
    "lxc payload": ("0::/lxc.payload.129/init.scope\n", "init.scope", ("lxc", "129")),
    "user session": ("0::/user.slice/user-0.slice/session-3.scope\n", "session-3.scope", None),
}


@pytest.mark.parametrize("name", sorted(CGROUPS))
def test_cgroup_examples(name):
    text, unit, container = CGROUPS[name]
    out = cgroup.parse(text)
    assert out["unit"] == unit
    assert (out["container"] and (out["container"]["kind"], out["container"]["id"])) == (container or None)


def test_a_scan_keeps_its_process_table_beside_the_document(ps):
    """The plan, the settle window and MPS read the table; the JSON never carries it."""
    holder = ps.role("worker", "--gpu", "0")
    found = scan.collect(scan_args(ps).selection)
    assert holder in found.procs and os.getppid() in found.chain  # the agent's ancestry: never a target
    assert holder in {h["pid"] for h in found["holders"]}
    assert not [k for k in json.loads(json.dumps(found, default=str)) if k.startswith("_")]
    assert type(scan.public(found)) is dict and not hasattr(scan.public(found), "procs")
