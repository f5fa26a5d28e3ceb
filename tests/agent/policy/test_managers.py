"""Which manager runs a process (policy/managers.py) and which container its cgroup names
(procs/cgroup.py): the path parser on the layouts each runtime writes, a holder moved into a
REAL Kubernetes or CRI cgroup layout (made under this test's own cgroup), the ancestry rules
on scan-shaped records, and a second user who names their process `supervisord`.

The real supervisord, runit and podman cases are in tests/system/test_real_managers.py.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from scripts.agent.holders import scan
from scripts.agent.policy import managers
from scripts.agent.procs import cgroup
from tests.support.managers_fixtures import CID, ESCAPED, UID, run_stop
from tests.support.procs import wait_for
from tests.support.scans import holders_by_pid, scan_args

STATIC = "6b1a8b6f2c1d4e5fa0b1c2d3e4f5a6b7"  # a static pod's UID: a hash, no dashes

CGROUPS = {
    "podman, systemd driver": (f"0::/machine.slice/libpod-{CID}.scope\n", ("podman", CID), None),
    "podman, cgroupfs driver v1": (f"9:name=systemd:/libpod_parent/libpod-{CID}\n8:pids:/libpod_parent/libpod-{CID}\n"
                                   "0::/\n", ("podman", CID), None),
    "podman under a quadlet unit": (f"0::/system.slice/vllm.service/libpod-payload-{CID}\n", ("podman", CID), None),
    "cri-containerd, no pod": (f"0::/system.slice/cri-containerd-{CID}.scope\n", ("cri-containerd", CID), None),
    "crio, no pod": (f"0::/machine.slice/crio-{CID}.scope\n", ("crio", CID), None),
    "nerdctl": (f"0::/system.slice/nerdctl-{CID}.scope\n", ("nerdctl", CID), None),
    "docker is still docker": (f"0::/system.slice/docker-{CID}.scope\n", ("docker", CID), None),
    "podman inside an LXC container, seen from the node": (f"0::/lxc/129/ns/machine.slice/libpod-{CID}.scope\n",
                                                          ("lxc", "129"), None),
    "pod, systemd driver, containerd": (
        f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{ESCAPED}.slice/"
        f"cri-containerd-{CID}.scope\n", ("kubernetes", CID), (UID, "cri-containerd")),
    "pod, guaranteed QoS, CRI-O": (f"0::/kubepods.slice/kubepods-pod{ESCAPED}.slice/crio-{CID}.scope\n",
                                   ("kubernetes", CID), (UID, "crio")),
    "pod, docker runtime: kubelet's, not docker's": (
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{ESCAPED}.slice/docker-{CID}.scope\n",
        ("kubernetes", CID), (UID, "docker")),
    "pod, cgroupfs driver v1": (f"12:pids:/kubepods/burstable/pod{UID}/{CID}\n1:name=systemd:/kubepods/burstable/"
                                f"pod{UID}/{CID}\n", ("kubernetes", CID), (UID, None)),
    "static pod": (f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{STATIC}.slice/"
                   f"cri-containerd-{CID}.scope\n", ("kubernetes", CID), (STATIC, "cri-containerd")),
    "a pod's own process, no container scope": (
        f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{ESCAPED}.slice\n",
        ("kubernetes", "pod" + UID), (UID, None)),
}


@pytest.mark.parametrize("name", sorted(CGROUPS))
def test_container_kinds_from_each_runtimes_cgroup(name):
    text, (kind, cid), pod = CGROUPS[name]
    out = cgroup.parse(text)
    assert (out["container"]["kind"], out["container"]["id"]) == (kind, cid)
    assert out["unit"] == ("libpod-%s.scope" % CID if kind == "lxc" else None)
    if pod:
        assert (out["container"]["pod"], out["container"]["runtime"]) == pod


def test_a_quadlet_containers_unit_is_kept():
    out = cgroup.parse(f"0::/system.slice/vllm.service/libpod-payload-{CID}\n")
    assert out["container"]["unit"] == "vllm.service"


@pytest.mark.parametrize("scope,kind", [(f"libpod-conmon-{CID}.scope", "podman"), (f"crio-conmon-{CID}.scope", "crio")])
def test_conmon_is_its_containers_monitor_not_a_member(scope, kind):
    """conmon's scope sits beside its container's: counted in it, conmon would keep the
    container from ever holding only targets."""
    out = cgroup.parse(f"0::/machine.slice/{scope}\n")
    assert out["container"] is None and out["unit"] == scope
    beside = cgroup.parse(f"0::/machine.slice/{scope.replace('-conmon', '')}\n")  # the container's own scope
    assert (beside["container"]["kind"], beside["container"]["id"]) == (kind, CID)


# -- real cgroup layouts ---------------------------------------------------------------------------


HOLD = "import sys, time; fs = [open(p, 'rb') for p in sys.argv[1:]]; open(fs[0].name + '.ready', 'w'); time.sleep(600)"


def _holder(ps, env):
    proc = subprocess.Popen([sys.executable, "-c", HOLD.replace(".ready", f".ready{len(ps.pids)}"),
                             str(ps.devdir / "nvidia0")], env=env, start_new_session=True)
    ps.adopt(proc.pid)
    wait_for(lambda: (ps.devdir / f"nvidia0.ready{len(ps.pids) - 1}").exists(), "holder ready")
    return proc.pid


def _managed(ps, pid):
    doc = scan.collect(scan_args(ps).selection)
    holder = holders_by_pid(doc)[pid]
    return holder, managers.manager_of(holder, doc.procs)


def test_pod_holder_named_by_its_environment_never_stopped_by_default(ps, layout):
    pid = _holder(ps, {"PATH": "/usr/bin:/bin", "POD_NAME": "vllm-0", "POD_NAMESPACE": "inference",
                       "KUBERNETES_SERVICE_HOST": "10.0.0.1"})
    layout.place(pid, f"kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{ESCAPED}.slice/"
                      f"cri-containerd-{CID}.scope")
    holder, m = _managed(ps, pid)
    assert holder["container"]["kind"] == "kubernetes" and holder["container"]["pod"] == UID
    assert (m["kind"], m["name"], m["pod_uid"]) == ("kubernetes", "inference/vllm-0", UID)
    assert m["stop_command"] == "kubectl -n inference delete pod vllm-0"
    assert m["first"].startswith("kubectl cordon ") and m["first"] in m["note"]
    assert m["stops_by_default"] is False


def test_the_kubelets_log_directory_names_the_pod_over_its_environment(ps, layout, tmp_path, monkeypatch):
    """/var/log/pods/NAMESPACE_NAME_UID is the kubelet's (root's); a container's environment is
    its own word (a process can rewrite it; HOSTNAME is the pod's name only by default)."""
    logs = tmp_path / "var-log-pods"  # no kubelet here: its directory, as it makes it, in the test's dir
    (logs / f"inference_vllm-0_{UID}").mkdir(parents=True)
    (logs / f"other_decoy_{UID}x").mkdir()
    monkeypatch.setattr(managers, "KUBELET_LOGS", str(logs))
    pid = _holder(ps, {"PATH": "/usr/bin:/bin", "POD_NAME": "payments-db-0", "POD_NAMESPACE": "prod"})
    layout.place(pid, f"kubepods.slice/kubepods-pod{ESCAPED}.slice/crio-{CID}.scope")
    _, m = _managed(ps, pid)
    assert m["stop_command"] == "kubectl -n inference delete pod vllm-0"
    assert "the kubelet's" in m["note"] and m["runtime"] == "crio"


def test_a_log_directory_another_user_made_names_no_pod(ps, layout, tmp_path, monkeypatch, second_user):
    logs = tmp_path / "var-log-pods"
    planted = logs / f"prod_payments-db-0_{UID}"
    planted.mkdir(parents=True)
    os.chown(planted, second_user.uid, second_user.gid)
    monkeypatch.setattr(managers, "KUBELET_LOGS", str(logs))
    pid = _holder(ps, {"PATH": "/usr/bin:/bin", "POD_NAME": "vllm-0", "POD_NAMESPACE": "inference"})
    layout.place(pid, f"kubepods.slice/kubepods-pod{ESCAPED}.slice/crio-{CID}.scope")
    _, m = _managed(ps, pid)
    assert m["stop_command"] == "kubectl -n inference delete pod vllm-0"
    assert "its own word" in m["note"]


def test_pod_holder_without_a_name_is_named_by_its_uid(ps, layout):
    """No POD_* and a HOSTNAME that is no Kubernetes name (it could carry shell text into a
    command): the printed command finds the pod by its UID."""
    pid = _holder(ps, {"PATH": "/usr/bin:/bin", "HOSTNAME": "x;reboot"})
    layout.place(pid, f"kubepods/besteffort/pod{UID}/{CID}")
    _, m = _managed(ps, pid)
    assert m["kind"] == "kubernetes" and m["name"] == f"pod {UID}" and m["namespace"] is None
    assert f'@.metadata.uid=="{UID}"' in m["stop_command"] and "reboot" not in m["stop_command"]
    assert m["stops_by_default"] is False


def test_cri_container_outside_a_pod_is_named_with_crictl(ps, layout):
    pid = _holder(ps, {"PATH": "/usr/bin:/bin"})
    layout.place(pid, f"system.slice/cri-containerd-{CID}.scope")
    holder, m = _managed(ps, pid)
    assert holder["container"] == {"kind": "cri-containerd", "id": CID}
    assert (m["kind"], m["stop_command"], m["stops_by_default"]) == ("cri-containerd", f"crictl stop {CID}", False)


# -- ancestry on scan-shaped records ------------------------------------------------------------------

GONE = 2 ** 22  # pids past pid_max: no /proc entry, nothing there is trusted


def _rec(pid, ppid, argv, sid=None, comm=None, **kw):
    return {"pid": pid, "ppid": ppid, "sid": sid or pid, "pgid": sid or pid, "argv": argv,
            "comm": comm or argv[0].rsplit("/", 1)[-1][:15], "state": "S", "threads": 1, "container": None, **kw}


def test_a_terminal_under_an_sshd_that_runit_supervises_is_not_runits():
    """sshd run by runsv: every login's shell descends from runsv, and `sv down` would take
    sshd down. The walk ends at the terminal's shell (a session leader no wrapper started)."""
    runsv = _rec(GONE + 1, 1, ["runsv", "ssh"])
    sshd = _rec(GONE + 2, runsv["pid"], ["/usr/sbin/sshd", "-D"], sid=runsv["pid"])
    shell = _rec(GONE + 3, sshd["pid"], ["-bash"])
    server = _rec(GONE + 4, shell["pid"], ["python3", "-m", "vllm.entrypoints.openai.api_server"], sid=shell["pid"])
    procs = {r["pid"]: r for r in (runsv, sshd, shell, server)}
    assert managers.managing_daemon(server, procs) == (None, None)
    assert managers.manager_of(server, procs) is None


def test_ray_worker_is_named_with_ray_stop_and_what_else_it_stops():
    raylet = _rec(GONE + 1, 1, ["/opt/venv/lib/python3.11/site-packages/ray/core/src/ray/raylet/raylet",
                                "--node_id=abc"], comm="raylet")
    workers = [_rec(GONE + 2 + i, raylet["pid"], ["ray::RayWorkerWrapper", ""], comm="ray::RayWorkerW",
                    sid=raylet["pid"]) for i in range(3)]
    procs = {r["pid"]: r for r in (raylet, *workers)}
    m = managers.manager_of(workers[0], procs)
    assert (m["kind"], m["name"], m["stop_command"]) == ("ray", "ray::RayWorkerWrapper", "ray stop")
    assert m["stops_by_default"] is False and m["workers"] == 3 and "every Ray job" in m["note"]


def test_runsv_of_a_scan_directory_names_the_service_by_the_scan_dir():
    """No /proc for these pids: the service directory cannot be read, and nothing is run."""
    runsvdir = _rec(GONE + 1, 1, ["runsvdir", "-P", "/etc/service"])
    runsv = _rec(GONE + 2, runsvdir["pid"], ["runsv", "vllm"])
    server = _rec(GONE + 3, runsv["pid"], ["vllm", "serve"], sid=runsv["pid"])
    m = managers.manager_of(server, {r["pid"]: r for r in (runsvdir, runsv, server)})
    assert (m["kind"], m["stop_command"], m["stops_by_default"]) == ("runit", None, False)


def test_podman_globals_keep_only_what_differs_from_the_defaults():
    argv = ["/usr/bin/conmon", "-c", CID, "-n", "vllm", "--exit-command", "/usr/bin/podman"]
    for arg in ["--root", "/var/lib/containers/storage", "--runroot", "/srv/run", "--log-level", "warning",
                "--cgroup-manager", "systemd", "--tmpdir", "/run/libpod", "--network-config-dir", "",
                "--events-backend", "file", "container", "cleanup", CID]:
        argv += ["--exit-command-arg", arg]
    conmon = _rec(GONE + 1, 1, argv, comm="conmon")
    server = _rec(GONE + 2, conmon["pid"], ["vllm", "serve"])
    m = managers.manager_of(server, {r["pid"]: r for r in (conmon, server)})
    assert (m["kind"], m["name"], m["container_id"]) == ("podman", "vllm", CID)
    assert m["stop_command"] == "podman --runroot /srv/run --events-backend file stop vllm"
    assert m["stops_by_default"] is False  # a conmon /proc cannot vouch for is nobody's to run commands for


def test_a_gpu_holder_is_never_a_manager_daemon():
    named = _rec(GONE + 1, 1, ["supervisord", "-c", "/etc/supervisord.conf"])
    assert managers.is_manager_daemon(named)
    assert not managers.is_manager_daemon(dict(named, devices=["/dev/nvidia0"]))
    assert managers.is_manager_daemon(_rec(GONE + 2, 1, ["/usr/bin/python3", "/usr/bin/supervisord"],
                                           comm="supervisord"))
    assert managers.is_manager_daemon(_rec(GONE + 3, 1, ["/usr/bin/containerd-shim-runc-v2", "-namespace", "k8s.io"]))
    assert not managers.is_manager_daemon(_rec(GONE + 4, 1, ["python3", "supervise_jobs.py"]))
    # a user's loop script named for a daemon is no daemon: `bash supervise.sh` restarts a server by its own loop
    assert not managers.is_manager_daemon(_rec(GONE + 5, 1, ["bash", "/srv/supervise.sh"]))
    assert not managers.is_manager_daemon(_rec(GONE + 6, 1, ["python3", "/srv/raylet.py"]))


# -- a second user --------------------------------------------------------------------------------

FAKE_SUPERVISORD = """
import os, subprocess, sys, time
dev = sys.argv[1]
mine = open(dev, 'rb')
env = dict(os.environ, SUPERVISOR_PROCESS_NAME='prod', SUPERVISOR_GROUP_NAME='ops', SUPERVISOR_ENABLED='1')
child = subprocess.Popen(['/usr/bin/python3', '-c', "import sys, time; f = open(sys.argv[1], 'rb'); time.sleep(600)",
                         dev], env=env)
time.sleep(600)
"""


def test_a_users_process_named_supervisord_is_named_never_obeyed(second_user, shared_ps):
    """A second user names their process `supervisord` and writes supervisord's variables
    into their job's environment: the job is attributed to it with a command, but that
    command is never the teardown's to run (untrusted), and their `supervisord`, itself
    holding a GPU, is no manager daemon: a target like any holder."""
    dev = shared_ps.devdir / "nvidia0"
    proc = second_user.popen(["bash", "-c", 'exec -a supervisord /usr/bin/python3 -c "$0" "$1"',
                              FAKE_SUPERVISORD, str(dev)])
    shared_ps.adopt(proc.pid)
    def is_job(h):  # the job once it runs its own code: between fork and exec, a copy of its parent holds
        return h["ppid"] == proc.pid and "import sys, time" in (h.get("cmdline") or "")

    def settled():  # a scan where the job, past its exec in every record of it, holds beside its parent
        d = scan.collect(scan_args(shared_ps).selection)
        job = next((h for h in d["holders"] if is_job(h)), None)
        if job is None or proc.pid not in holders_by_pid(d) or not is_job(d.procs.get(job["pid"], {})):
            return None
        return d, job

    doc, child = wait_for(settled, "the fake supervisord and its child hold")
    holders = holders_by_pid(doc)
    fake = holders[proc.pid]
    shared_ps.adopt(child["pid"])
    assert managers.daemon_name(fake) == "supervisord"
    assert not managers.is_manager_daemon(fake)  # it holds a GPU: a target, whatever its name
    m = managers.manager_of(child, doc.procs)  # named as the user's word has it, and not obeyed
    assert (m["kind"], m["name"], m["pid"]) == ("supervisord", "ops:prod", proc.pid)
    assert m["trusted"] is False and m["stops_by_default"] is False


def test_a_users_real_supervisord_is_named_but_not_run_by_the_teardown(second_user, shared_ps):
    """The real /usr/bin/supervisord, run by a second user: the program and the command are
    named, the command to run as that user; only that user may say what their supervisord runs,
    so the teardown does not run it."""
    import shutil

    if not shutil.which("supervisord"):
        pytest.skip("needs supervisord (.ci/packages: supervisor)")
    base = shared_ps.base / "sv"
    base.mkdir()
    base.chmod(0o777)
    conf = base / "supervisord.conf"
    conf.write_text(f"[unix_http_server]\nfile={base}/s.sock\n[supervisord]\nlogfile={base}/sd.log\n"
                    f"pidfile={base}/sd.pid\nnodaemon=true\n[rpcinterface:supervisor]\n"
                    "supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface\n"
                    f"[program:vllm]\ncommand=/usr/bin/python3 -c \"import time; f = open('{shared_ps.devdir}/"
                    "nvidia1', 'rb'); time.sleep(600)\"\nautorestart=true\nstartsecs=0\n")
    conf.chmod(0o644)
    sd = second_user.popen(["/usr/bin/supervisord", "-n", "-c", str(conf)], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    shared_ps.adopt(sd.pid)
    doc = wait_for(lambda: (d := scan.collect(scan_args(shared_ps).selection)) and any(
        h["ppid"] == sd.pid for h in d["holders"]) and d, "the user's program holds", timeout=20)
    holder = next(h for h in doc["holders"] if h["ppid"] == sd.pid)
    shared_ps.adopt(holder["pid"])
    m = managers.manager_of(holder, doc.procs)
    assert (m["kind"], m["name"], m["pid"]) == ("supervisord", "vllm", sd.pid)
    # printed to run as its user: the config path and the name are theirs to choose
    assert m["stop_command"] == f"runuser -u {second_user.name} -- supervisorctl -c {conf} stop vllm"
    assert m["trusted"] is False and m["stops_by_default"] is False
    assert "not run by the teardown" in m["note"]
    assert managers.is_manager_daemon(doc.procs[sd.pid])


def test_a_supervisord_inside_a_docker_container_answers_to_the_container():
    """Its config and socket are in the container's filesystem: a supervisorctl on the host
    would not find them. `docker stop` (plan.py) stops the container and it."""
    sd = _rec(GONE + 1, 1, ["/usr/bin/python3", "/usr/bin/supervisord", "-c", "/etc/supervisord.conf"],
              comm="supervisord", container={"kind": "docker", "id": CID})
    server = _rec(GONE + 2, sd["pid"], ["vllm", "serve"], container={"kind": "docker", "id": CID})
    assert managers.manager_of(server, {r["pid"]: r for r in (sd, server)}) is None
    assert managers.manager_of(dict(server, container=None), {r["pid"]: r for r in (sd, server)})["kind"] == \
        "supervisord"


def test_run_stop_runs_only_a_stop_the_teardown_may_run():
    ray = {"kind": "ray", "stop_command": "ray stop", "stop_argv": ["ray", "stop"], "stops_by_default": False}
    with pytest.raises(ValueError, match="ray stop"):
        run_stop(ray)
    with pytest.raises(ValueError):
        run_stop({"stop_command": "kubectl get pods ...", "stop_argv": None, "stops_by_default": True})
    ok, said = run_stop({"stop_argv": ["sh", "-c", "echo one; echo 'no such program' >&2; exit 3"],
                                  "stops_by_default": True})
    assert (ok, said) == (False, "no such program")


def _kubelet(ps, path, run=subprocess.Popen):
    """A process whose program is a file named `kubelet` (a copy of /bin/sh, waiting), run with
    --hostname-override: its comm is `kubelet`, as a kubelet's is."""
    import shutil

    shutil.copy("/bin/sh", path)
    os.chmod(path, 0o755)
    proc = run([str(path), "-c", "read x", "kubelet", "--hostname-override=GPU-Node-7"],
               start_new_session=True, stdin=subprocess.PIPE)  # waits on its stdin: no child to outlive it
    ps.adopt(proc.pid)
    wait_for(lambda: open(f"/proc/{proc.pid}/comm").read().strip() == "kubelet", "the kubelet runs")
    return proc.pid


def _first(ps, pid):
    doc = scan.collect(scan_args(ps).selection)
    return managers.manager_of(holders_by_pid(doc)[pid], doc.procs)["first"]


def test_the_node_to_cordon_is_the_kubelets_hostname_override(ps, layout, tmp_path):
    pid = _holder(ps, {"PATH": "/usr/bin:/bin", "POD_NAME": "vllm-0", "POD_NAMESPACE": "inference"})
    layout.place(pid, f"kubepods.slice/kubepods-pod{ESCAPED}.slice/cri-containerd-{CID}.scope")
    assert "gpu-node-7" not in _first(ps, pid)
    _kubelet(ps, tmp_path / "kubelet")  # root's, running a root-owned program
    assert _first(ps, pid) == "kubectl cordon gpu-node-7"


def test_a_users_kubelet_names_no_node(shared_ps, layout, second_user):
    """Anyone can start a program named `kubelet --hostname-override=OTHER`: the printed
    `kubectl cordon` must not name the node they chose."""
    ps = shared_ps
    pid = _holder(ps, {"PATH": "/usr/bin:/bin", "POD_NAME": "vllm-0", "POD_NAMESPACE": "inference"})
    layout.place(pid, f"kubepods.slice/kubepods-pod{ESCAPED}.slice/cri-containerd-{CID}.scope")
    mine = ps.base / "userbin"
    mine.mkdir()
    os.chown(mine, second_user.uid, second_user.gid)
    path = mine / "kubelet"
    _kubelet(ps, path, run=lambda argv, **kw: (os.chown(path, second_user.uid, second_user.gid),
                                                second_user.popen(argv, **kw))[1])
    assert "gpu-node-7" not in _first(ps, pid)


def test_root_only_paths(tmp_path, second_user):
    """A root tool reading a file (supervisorctl reads its -c config, and imports what a
    [ctlplugin:x] section names) must read one only root can change."""
    conf = tmp_path / "etc" / "supervisord.conf"
    conf.parent.mkdir()
    conf.write_text("[supervisorctl]\n")
    assert managers.root_only(str(conf))
    (tmp_path / "link.conf").symlink_to(conf)
    assert managers.root_only(str(tmp_path / "link.conf"))
    conf.chmod(0o664)
    assert not managers.root_only(str(conf))  # group-writable
    conf.chmod(0o644)
    os.chown(conf.parent, second_user.uid, second_user.gid)
    assert not managers.root_only(str(conf))  # in a directory another user can re-point
    os.chown(conf.parent, 0, 0)
    theirs = tmp_path / "theirs.conf"
    theirs.symlink_to(conf)
    os.lchown(theirs, second_user.uid, second_user.gid)
    assert not managers.root_only(str(theirs))  # a link of theirs
    assert not managers.root_only(str(tmp_path / "missing.conf"))
    assert not managers.root_only(str(conf.parent))  # a directory is no config file
