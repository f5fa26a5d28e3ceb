"""What brings a server back, and what does not: the rules of a teardown on a host as people
run it (real process trees on this machine, each teardown scoped to the test's own temp dir).

- a free-standing shell loop that restarts the server is named in the plan every time, a
  restart it makes is NOT FREE with the loop named, and --stop-starters stops it for good;
- a `TARGETS` alternation is split into its alternatives: a loading server named by one of
  them is stopped with its child;
- a helper the server left in its process group (a server started from a shell with job
  control leads its group, not the session) is stopped;
- an unrelated `python3 -c` loop on the host never makes the teardown NOT FREE (a shared
  interpreter name is not "the same program"), and neither does a GPU monitor's poll;
- the settle window ends at once when nothing that could restart a target survives, and is
  watched whole when something could (or when --settle is given).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from scripts.agent.wire import requests
from tests.support.agent_inproc import run_agent
from tests.support.procs import alive, children, tmux_pane, wait_for
from tests.support.teardowns import host, ready_pid, server_cmd, server_pkg, shell, teardown


def test_a_loop_with_no_pause_is_frozen_first_so_nothing_restarts(ps):
    """`while true; do SERVER; done`: restarted 0 s after each exit, so the loop is frozen
    before the server's SIGTERM (relation.py: the job's own), listed with that fate in every
    plan, and ended after: no respawn, FREED."""
    ready = ps.base / "srv.ready"
    loop = shell(ps, f"while true; do rm -f {ready}; {server_cmd(ps, ready)}; done")
    first = ready_pid(ready)
    ps.adopt(first)
    keys = dict(TARGETS=r"xsrv\.launch_server")
    for _ in range(3):  # listed every time, before anything is signalled
        starters = run_agent(host(ps, **keys), requests.Plan()).doc["plan"]["starters"]
        assert [(s["pid"], s["fate"]) for s in starters] == [(loop, "stop")], starters
    result = teardown(ps, settle=1, **keys)
    ps.pids.extend(children(loop))
    assert result.code == 0, result.doc["problems"]
    assert not alive(first) and not alive(loop)
    assert result.doc["appeared"] == []


def test_an_alternative_of_a_targets_alternation_names_a_loading_server(ps):
    pid = ps.start(["python3", "-m", "xsrv.launch_server", "--child"], env=dict(
        os.environ, PYTHONPATH=str(server_pkg(ps))))  # holding no GPU yet
    child = wait_for(lambda: children(pid), "the loading server's child")[0]
    ps.adopt(child)
    result = teardown(ps, TARGETS=r"xsrv\.launch_server|xsrv serve")
    assert result.code == 0, result.doc["problems"]
    reasons = {t["pid"]: t["reason"] for t in result.doc["plan"]["targets"]}
    assert reasons[pid] == r"runs module xsrv.launch_server (target pattern xsrv\.launch_server|xsrv serve)"
    assert child in reasons
    assert not alive(pid) and not alive(child)


def test_a_helper_left_in_the_process_group_of_a_job_control_server_is_stopped(ps):
    ready = ps.base / "srv.ready"
    shell(ps, f"set -m; {server_cmd(ps, ready, '--helper-after', '0.3')} & wait")
    server = ready_pid(ready)
    helper = ready_pid(Path(f"{ready}.helper"))
    ps.pids.extend([server, helper])
    with open(f"/proc/{server}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    assert int(fields[2]) == server and int(fields[3]) != server  # leads its group, not the session
    result = teardown(ps, TARGETS=r"xsrv\.launch_server")
    assert result.code == 0, result.doc["problems"]
    reasons = {t["pid"]: t["reason"] for t in result.doc["plan"]["targets"]}
    assert reasons[helper] == f"in the process group of target {server} (left there by it)"
    assert not alive(server) and not alive(helper)


def test_an_unrelated_python_c_loop_never_makes_a_teardown_not_free(ps):
    token = str(ps.base)
    nb_ready = ps.base / "nb.ready"
    notebook = subprocess.Popen([sys.executable, "-c", "import os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR); "
                                 "open(sys.argv[2], 'w').close(); time.sleep(600)", f"{ps.devdir}/nvidia0",
                                 str(nb_ready), "--notebook", token], start_new_session=True).pid
    ps.adopt(notebook)
    wait_for(nb_ready.exists, "the notebook holding GPU 0")
    loop = shell(ps, f"while :; do {sys.executable} -c 'import time; time.sleep(0.05)' {token}; sleep 0.2; done")
    wait_for(lambda: children(loop), "the cron-like loop running")
    result = teardown(ps, settle=1.5, TARGETS="nothing-here")
    assert result.code == 0, result.doc["problems"]
    assert not alive(notebook) and alive(loop)
    assert result.doc["appeared"] == []


def test_the_window_ends_at_once_when_nothing_could_restart_a_target(ps):
    server, workers = ps.server(tp=1)
    result = teardown(ps)  # no --settle: the agent's rule
    assert result.code == 0, result.doc["problems"]
    assert result.doc["settle_ended"] == "nothing left that could restart a target"
    assert result.doc["settle_s"] == 0
    assert not alive(server)
    server, workers = ps.server(tp=1)
    result = teardown(ps, settle=0.7)  # given: the whole window is watched
    assert result.code == 0 and result.doc["settle_ended"] is None and result.doc["settle_s"] == 0.7


def test_a_wrapper_that_would_outlive_its_server_ends_with_it_and_no_window_is_watched(ps):
    """`bash -c "SERVER; sleep 600"`: the wrapper is the job's own, ended after the server, so
    nothing that could restart a target survives and the window ends at once."""
    ready = ps.base / "srv.ready"
    wrapper = shell(ps, f"{server_cmd(ps, ready)}; sleep 600")
    server = ready_pid(ready)
    ps.adopt(server)
    ps.pids.extend(children(wrapper))
    result = teardown(ps, TARGETS=r"xsrv\.launch_server")
    assert result.code == 0, result.doc["problems"]
    assert not alive(wrapper)
    assert result.doc["settle_ended"] == "nothing left that could restart a target"


@pytest.mark.parametrize("lists", ["nvml", "nvidia-smi"])
def test_a_device_handle_without_a_context_is_not_a_holder_where_a_process_list_says_so(lists, tmp_path):
    """nvidia-smi, DCGM and exporters open and map the device files and have no context: where
    NVML or nvidia-smi lists the GPU's processes, one not listed is not in the way."""
    from scripts.agent.holders import scan
    from scripts.agent.teardown import verify

    os.mknod(tmp_path / "n0", 0o600 | 0o020000, os.makedev(1, 3))  # a character device, as a real node is
    dev = str(tmp_path / "n0")
    smi = {"pid": 7, "devices": [dev], "mapped_devices": [dev], "gpu_mib": {}, "state": "S", "cmdline": "nvidia-smi",
           "argv": ["nvidia-smi"]}
    assert scan.context_source(lists, []) == lists
    assert scan.context_source(lists, [{"pid": 9}]) is None  # node pids we cannot map: nobody is vouched for
    assert scan.context_source("fake", []) is None
    assert "no CUDA context" in scan._no_context(smi, lists)
    assert scan._no_context(dict(smi, gpu_mib={"0": 300}), lists) is None
    assert scan._no_context(smi, None) is None  # no list to ask: a mapping is taken for a context
    doc = {"gpus": [{"index": 0, "used_mib": 0, "processes": []}], "devices": [dev], "devices_glob": dev,
           "holders": [dict(smi, protected="GPU monitor (nvidia-smi)")], "context_source": lists}
    assert verify.evaluate(doc, 0) == (True, [])
    free, problems = verify.evaluate(dict(doc, context_source=None), 0)
    assert not free and "has a CUDA context" in problems[0]


def test_a_server_in_a_tmux_pane_is_stopped_and_tmux_survives(ps, tmp_path):
    """The control: a person's terminal (an interactive shell in a tmux pane) is no wrapper; the
    server it runs is stopped for good and the pane and tmux live on."""
    sock, tmux_server, pane = tmux_pane(ps, tmp_path)
    ready = ps.base / "srv.ready"
    subprocess.run(["tmux", "-S", str(sock), "send-keys", server_cmd(ps, ready), "Enter"], check=True)
    server = ready_pid(ready)
    ps.adopt(server)
    result = teardown(ps, TARGETS=r"xsrv\.launch_server")
    assert result.code == 0, result.doc["problems"]
    assert not alive(server) and alive(pane) and alive(tmux_server)
    assert [(s["pid"], s["fate"]) for s in result.doc["plan"]["starters"]] == [(pane, "watch")]
    assert result.doc["appeared"] == []


class _ListingSource:
    """A GPU source that lists each GPU's processes, as NVML does (the machine has no GPU)."""

    name = "nvml"

    def __init__(self, gpus):
        self.gpus = gpus

    def read(self):
        return [dict(g) for g in self.gpus]


def test_the_confirming_scan_reads_fd_tables_only_where_a_context_could_be(ps):
    """Once NVML lists no process and no memory is used, no process has a CUDA context: the
    scan that confirms FREED reads the process records (what a respawn is told by), not every
    fd table and mapping again. Where a process is listed, or memory is used, it reads them."""
    from scripts.agent.holders import scan
    from scripts.agent.options.record import Options

    holder = ps.role("worker", "--gpu", "0")  # holds a device file (a monitor-like handle, here)
    args = Options(devices=ps.glob, fake_devices=True, protect=[], fake_gpus=None, max_used_mib=0)
    idle = [{"index": 0, "used_mib": 0, "processes": []}]
    doc = scan.collect(args.selection, _ListingSource(idle), confirm=True)
    assert doc["holders_read"] is False and holder in doc.procs and doc["holders"] == []
    busy = [{"index": 0, "used_mib": 300, "processes": [{"pid": holder, "used_mib": 300}]}]
    doc = scan.collect(args.selection, _ListingSource(busy), confirm=True)
    assert doc["holders_read"] is True and [h["pid"] for h in doc["holders"]] == [holder]
    used = [{"index": 0, "used_mib": 300, "processes": []}]  # memory without a listed process: look at everything
    assert scan.collect(args.selection, _ListingSource(used), confirm=True)["holders_read"] is True
    assert scan.collect(args.selection, _ListingSource(idle))["holders_read"] is True  # only the confirming one: light


SLOW_SERVER = """\
import os, signal, sys, time
args = sys.argv[1:]
def opt(name):
    return args[args.index(name) + 1] if name in args else None
fd = os.open(opt("--hold"), os.O_RDWR)
def term(*_):
    open(opt("--ready") + ".term", "w").close()
    time.sleep(0.5)
    os._exit(0)
signal.signal(signal.SIGTERM, term)
with open(opt("--ready") + ".tmp", "w") as f:
    f.write(str(os.getpid()))
os.rename(opt("--ready") + ".tmp", opt("--ready"))
while True:
    time.sleep(1)
"""

# At the plan a monitor by name (a script called nvitop: trusted in the sandbox for the agent's
# own uid), holding the device without mapping it; once the target has its SIGTERM it execs
# another Python program keeping the fd: the same name, parent, group, session and flags.
EXECS_AFTER_TERM = """\
import os, sys, time
dev, term, after = sys.argv[1], sys.argv[2], sys.argv[3]
fd = os.open(dev, os.O_RDWR)
os.set_inheritable(fd, True)
open(term + ".mon", "w").write(str(os.getpid()))
while not os.path.exists(term):
    time.sleep(0.001)
os.execv(sys.executable, [sys.executable, after, str(fd)])
"""

OPENS_AFTER_TERM = """\
import os, sys, time
dev, term = sys.argv[1], sys.argv[2]
open(term + ".late", "w").write(str(os.getpid()))
while not os.path.exists(term):
    time.sleep(0.001)
time.sleep(0.25)  # after the plan's scan (the server takes 0.5 s to exit)
fd = os.open(dev, os.O_RDWR)
open(term + ".opened", "w").close()
time.sleep(600)
"""


def _slow_server(ps) -> Path:
    """`xsrv.launch_server` holding GPU 0, 0.5 s in its exit after SIGTERM (it writes READY.term first)."""
    pkg = ps.base / "slowpkg" / "xsrv"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "launch_server.py").write_text(SLOW_SERVER)
    ready = ps.base / "slow.ready"
    shell(ps, f"PYTHONPATH={pkg.parent} exec {sys.executable} -m xsrv.launch_server --ready {ready} "
              f"--hold {ps.devdir / 'nvidia0'}")
    ps.adopt(ready_pid(ready))
    return ready


@pytest.mark.parametrize("what", ["a monitor that execs a holder", "a bystander that opens the device"])
def test_what_takes_a_gpu_after_the_plan_is_seen_by_the_confirming_scans(ps, what):
    """The confirming scans keep the plan's record of a process still the same (one stat read):
    a process there before the teardown that then takes the device is still read as it is now.
    A protected monitor by name that exec'd another program under the same name is not protected
    any more (seen: FREED, exit 0, with the exec'd program holding GPU 0); a bystander that
    opens the device after the plan holds it. Either way: NOT FREE."""
    ready = _slow_server(ps)
    dev = ps.devdir / "nvidia0"
    if what.startswith("a monitor"):
        monitor, holder = ps.base / "nvitop", ps.base / "holder.py"
        monitor.write_text(EXECS_AFTER_TERM)
        holder.write_text("import sys, time\nopen(sys.argv[0] + '.execd', 'w').close()\ntime.sleep(600)\n")
        shell(ps, f"exec {sys.executable} {monitor} {dev} {ready}.term {holder}")
        ps.adopt(ready_pid(Path(f"{ready}.term.mon")))
        done = Path(f"{holder}.execd")
    else:
        late = ps.base / "late.py"
        late.write_text(OPENS_AFTER_TERM)
        shell(ps, f"exec {sys.executable} {late} {dev} {ready}.term")
        ps.adopt(ready_pid(Path(f"{ready}.term.late")))
        done = Path(f"{ready}.term.opened")
    result = teardown(ps, settle=1, TARGETS=r"xsrv\.launch_server")
    assert done.exists(), f"{what}: never took the device"
    assert result.code != 0, (what, result.doc.get("problems"))
