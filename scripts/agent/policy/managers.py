"""Which manager runs a process, and the exact command that stops it through that manager.

The whole account: docs/design-notes.md (scripts/agent/policy/managers.py)."""
import os
import re
import shlex
import stat

from ..procs import cgroup, procfs, textsafe
from . import program, rules, wrappers

# The daemons of the managers: never a target's wrapper or supervisor to signal. By name only
# (see is_manager_daemon): a GPU holder is a target whatever it is called.
DAEMONS = {
    "supervisord": "supervisord",
    "raylet": "ray",
    "kubelet": "kubernetes",
    "containerd": "containerd",
    "conmon": "podman",
    "crio": "crio",
    "podman": "podman",
    "runsv": "runit",
    "runsvdir": "runit",
    "s6-supervise": "s6",
    "s6-svscan": "s6",
    "supervise": "daemontools",
    "svscan": "daemontools",
}
# A daemon run as a module (a venv's install): the module whole, never a last part a user's module shares
MODULE_DAEMONS = {"supervisor.supervisord": "supervisord"}
SHIM_PREFIX = "containerd-shim"  # containerd-shim, containerd-shim-runc-v2, ...: a container's monitor
# The daemon that runs a service's process directly, and the scanner that runs that daemon
SERVICE_SUPERVISORS = {"runsv": ("runit", "runsvdir", ["sv", "down"]),
                       "s6-supervise": ("s6", "s6-svscan", ["s6-svc", "-d"]),
                       "supervise": ("daemontools", "svscan", ["svc", "-d"])}
NOT_BY_DEFAULT = ("kubernetes", "cri-containerd", "crio", "nerdctl", "containerd", "ray")
ENVIRON_MAX = 1 << 20
# A Kubernetes object's name (RFC 1123 subdomain): nothing else reaches a printed kubectl command
_K8S_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
KUBELET_PODS = "/var/lib/kubelet/pods"
KUBELET_LOGS = "/var/log/pods"  # NAMESPACE_NAME_UID per pod, made by the kubelet
SA_NAMESPACE = "kubernetes.io~projected"  # the projected service-account volume holds `namespace`
# podman's global options that say where a container lives, with root's packaged defaults
# (left out of the command where the container was made with them)
PODMAN_GLOBALS = {"--root": "/var/lib/containers/storage", "--runroot": "/run/containers/storage",
                  "--tmpdir": "/run/libpod", "--cgroup-manager": "systemd",
                  "--network-config-dir": "/etc/containers/networks", "--events-backend": "journald",
                  "--storage-driver": None, "--db-backend": None}


def daemon_name(record):
    """The manager daemon this process's program is ('supervisord', 'runsv', ...), or None. By
    every name the program goes by (program.names: `python3 /usr/bin/supervisord` is
    supervisord) and its comm (a `#!` script's comm is its file name); never a script's name
    without its extension (a user's `bash supervise.sh` loop is no daemontools `supervise`)."""
    names = {name for name, why in program.names(record)
             if not why.startswith("runs script ") or os.path.basename(why[12:]) == os.path.basename(name)}
    names.add(record.get("comm") or "")
    names.update(MODULE_DAEMONS.get(name, "") for name in list(names))  # `python3 -m supervisor.supervisord`
    for name in sorted(names):
        base = os.path.basename(name)
        if base in DAEMONS:
            return base
        if base.startswith(SHIM_PREFIX):
            return SHIM_PREFIX
    return None


def is_manager_daemon(record):
    """Is this process a manager's own daemon (supervisord, raylet, kubelet, containerd and its
    shims, conmon, crio, podman, runsv, runsvdir, s6-supervise, s6-svscan, supervise, svscan)?
    Such a process is never signalled as a target's wrapper or supervisor: its manager is
    asked, or named. It PROTECTS NOTHING: a name is anyone's to take (`exec -a supervisord`),
    so a process that holds a GPU device is never a manager daemon here, and the plan makes
    it a target as any other holder."""
    if record.get("devices"):
        return False
    return daemon_name(record) is not None


def manager_of(record, procs, proc="/proc"):
    """The manager that runs `record` (a scan record: pid, ppid, sid, comm, argv, and where
    read, container), from `procs` ({pid: record}, the scan's table), as
    {kind, name, stop_command, stops_by_default, note, pid, main_pid, trusted, ...}; None for a
    process no such manager runs (or one a unit, docker or LXC runs: plan.py's)."""
    if "container" in record:
        container = record.get("container")
    else:
        container = cgroup.read(record["pid"], proc)["container"]
    if container and container.get("kind") == "kubernetes":
        return _kubernetes(record, container, procs, proc)
    if container and container.get("kind") in ("docker", "lxc"):
        return None  # plan.py's: `docker stop`, `pct`; a supervisord inside answers to its container
    daemon, main = managing_daemon(record, procs)
    if container and container.get("kind") in ("podman", "cri-containerd", "crio", "nerdctl"):
        return _container(container, daemon, main)
    name = (daemon_name(daemon) if daemon is not None else None) or ""
    handler = _BY_DAEMON.get(SHIM_PREFIX if name.startswith(SHIM_PREFIX) else name)
    return handler(daemon, main, procs, proc) if handler else None


def managed_pids(manager, procs):
    """The pids the manager runs for this program: its main_pid and every process below it (a
    "child" that started before its parent is none: its pid was reused). The teardown may stop
    the program through its manager only when each of these is a target, a target's wrapper or
    a helper of theirs (a log filter): anything else would go down with it unlisted."""
    main = manager.get("main_pid")
    if main not in procs:
        return set()
    kids: dict = {}
    for pid, info in procs.items():
        kids.setdefault(info.get("ppid"), []).append(pid)
    out, todo = {main}, [main]
    while todo:
        parent = todo.pop()
        for child in kids.get(parent, ()):
            if child not in out and procs[child]["start_time"] >= procs[parent]["start_time"]:
                out.add(child)
                todo.append(child)
    return out


def managing_daemon(record, procs):
    """(the manager daemon that runs this process, the process it runs on the way here) or
    (None, None). Walked up through parents: past wrappers and launchers, and past a process
    the daemon itself runs; it ends after a session leader that nothing of a manager started
    (a terminal's shell under an sshd that runit supervises is the terminal's, not runit's),
    and at PID 1 (checked: s6-svscan or supervisord can be a container's PID 1)."""
    seen = set()
    info = record
    while info is not None and info["pid"] not in seen:
        seen.add(info["pid"])
        parent = procs.get(info.get("ppid"))
        if parent is None:
            return None, None
        if is_manager_daemon(parent) and not procfs.finished(parent):
            return parent, info
        if parent["pid"] == 1:
            return None, None
        leader = info.get("sid") == info["pid"]
        if leader and wrappers.kind(parent) is None and not wrappers.launcher(parent):
            return None, None
        info = parent
    return None, None


def _result(kind, name, command, note, daemon, main, default=None, **extra):
    """The answer. `command`: the stop command as argv (a list: run without a shell, shown
    quoted) or as a shell line for people only (a str: the teardown never runs it), or None."""
    trusted = bool(daemon is not None and rules.trusted_names(daemon))
    argv = list(command) if isinstance(command, list) else None
    if argv is not None:
        command = " ".join(_q(word) for word in argv)
    if default is None:
        default = kind not in NOT_BY_DEFAULT
    out = {
        "kind": kind,
        "name": textsafe.printable(name) if name is not None else None,
        "stop_command": command,
        "stop_argv": argv,
        "stops_by_default": bool(default and trusted and argv),
        "note": note,
        "pid": daemon["pid"] if daemon is not None else None,
        "main_pid": main["pid"] if main is not None else None,
        "trusted": trusted,
    }
    if argv and not trusted and daemon is not None:
        # its daemon's user wrote every word of it (a config path, a name, its directory): printed
        # to run as that user, so it can reach only what that user's own daemon controls
        ids = procfs.uids(daemon["pid"])
        uid = ids[1] if ids else daemon.get("uid")
        if uid not in (None, os.geteuid()):
            out["stop_command"] = "runuser -u %s -- %s" % (_q(_user(uid)), command)
    if default and argv and not trusted and daemon is not None:
        out["note"] = ("%s; not run by the teardown: its daemon (PID %d) is not root's or a system account's "
                       "running a root-owned program, so only its own user may say what it runs"
                       % (note, daemon["pid"]))
    out.update(extra)
    return out


def _user(uid):
    """The name of the account `uid` is now, looked up at each call (an account's uid may have
    gone to another since a scan's cached name), or the number where it has none."""
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except (KeyError, OverflowError, TypeError, ValueError):
        return str(uid)


def environ(pid, proc="/proc"):
    """{name: value} of /proc/PID/environ (what the process started with, as far as it did not
    overwrite it: a process's own say, never a proof), {} when it cannot be read."""
    try:
        raw = procfs.read_bytes("%s/%d/environ" % (proc, pid))[:ENVIRON_MAX]
    except OSError:
        return {}
    out = {}
    for item in raw.split(b"\0"):
        key, eq, value = item.partition(b"=")
        if eq and key:
            out[textsafe.decode(key)] = textsafe.decode(value)
    return out


def _cwd(pid, proc="/proc"):
    """The text of /proc/PID/cwd's link (never followed), or None."""
    try:
        path = os.readlink("%s/%d/cwd" % (proc, pid))
    except OSError:
        return None
    return path if path.startswith("/") and not path.endswith(" (deleted)") else None


def _option(argv, short, long):
    """The value of `-c VALUE`, `-cVALUE`, `--configuration VALUE` or `--configuration=VALUE`."""
    for i, arg in enumerate(argv):
        if arg in (short, long) and i + 1 < len(argv):
            return argv[i + 1]
        if long and arg.startswith(long + "="):
            return arg[len(long) + 1:]
        if short and arg.startswith(short) and len(arg) > len(short) and not arg.startswith("--"):
            return arg[len(short):]
    return None


def _q(word):
    return shlex.quote(textsafe.printable(word))


# -- supervisord ---------------------------------------------------------------------------------

SUPERVISORD_DEFAULT_CONFS = ("/etc/supervisord.conf", "/etc/supervisor/supervisord.conf")


def _supervisord(daemon, main, procs, proc):
    env = environ(main["pid"], proc)
    program_name, group = env.get("SUPERVISOR_PROCESS_NAME"), env.get("SUPERVISOR_GROUP_NAME")
    argv = daemon.get("argv") or []
    conf = _option(argv, "-c", "--configuration")
    if conf and not conf.startswith("/"):
        cwd = _cwd(daemon["pid"], proc)
        conf = os.path.normpath(os.path.join(cwd, conf)) if cwd else None
    elif conf is None:
        # supervisord's own search, where a package puts it (read for its existence only)
        conf = next((c for c in SUPERVISORD_DEFAULT_CONFS if os.path.exists(c)), None)
    if not program_name:
        return _result("supervisord", None, None,
                       "supervisord (PID %d) runs it, but which program is not readable (SUPERVISOR_PROCESS_NAME is "
                       "not in PID %d's environment): `supervisorctl status` names it" % (daemon["pid"], main["pid"]),
                       daemon, main, default=False)
    spec = program_name if not group or group == program_name else "%s:%s" % (group, program_name)
    note = ("supervisord program %s (supervisord PID %d keeps running; `supervisorctl start %s` brings it back; "
            "it signals the program's own process only, unless stopasgroup=true: a server under a `bash -c` is left "
            "running, to be signalled as a target)" % (spec, daemon["pid"], spec))
    if conf:
        where = ["-c", conf]
        if not root_only(conf):  # supervisorctl reads it, and imports the modules its [ctlplugin:x] name
            note += ("; not run by the teardown: %s is not a file only root can change, and supervisorctl would "
                     "read it" % conf)
    else:
        url = env.get("SUPERVISOR_SERVER_URL", "")
        where = ["-s", url] if re.fullmatch(r"(unix|http)://[\w./:@-]+", url) else []
    return _result("supervisord", spec, ["supervisorctl", *where, "stop", spec], note, daemon, main,
                   default=not conf or root_only(conf), config=conf,
                   comes_back="when supervisord starts again (a reboot, `supervisorctl reload`), if the program has "
                              "autostart=true: set autostart=false in its section to keep it down")


MAX_LINKS = 40


def root_only(path):
    """Can only root change what `path` names? Walked a component at a time: every directory on
    the way root's and writable by no one else (unless sticky, as /tmp: others cannot replace
    what is root's there), every symbolic link root's, and the file a regular one, root's, not
    writable by group or others. Why each: another user's directory or link above it lets them
    re-point which file a root tool reads."""
    pending = [c for c in os.path.abspath(path).split("/") if c]
    cur, links = "/", 0
    while True:
        try:
            st = os.lstat(cur)
        except OSError:
            return False
        if st.st_uid != 0:
            return False
        if stat.S_ISLNK(st.st_mode):
            links += 1
            if links > MAX_LINKS:
                return False
            target = os.readlink(cur)
            pending = [c for c in target.split("/") if c] + pending
            cur = "/" if target.startswith("/") else os.path.dirname(cur)
            continue
        if not pending:
            return stat.S_ISREG(st.st_mode) and not st.st_mode & 0o022
        if not stat.S_ISDIR(st.st_mode) or (st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX):
            return False
        name = pending.pop(0)
        cur = os.path.normpath(os.path.join(cur, name)) if name != ".." else os.path.dirname(cur)


# -- runit, s6, daemontools ----------------------------------------------------------------------


def _service(daemon, main, procs, proc):
    name = daemon_name(daemon)
    kind, scanner, template = SERVICE_SUPERVISORS[name]
    directory = _cwd(daemon["pid"], proc)
    argv = daemon.get("argv") or []
    parent = procs.get(daemon.get("ppid"))
    service = argv[1] if len(argv) > 1 else None
    if parent is not None and daemon_name(parent) == scanner and service and "/" not in service:
        base = _scan_dir(parent, proc)
        if base and os.path.isdir(os.path.join(base, service)):
            directory = os.path.join(base, service)  # the name the operator's scan directory gives it
    if directory is None:
        return _result(kind, service, None, "%s (PID %d) runs it; its service directory is not readable"
                       % (name, daemon["pid"]), daemon, main)
    command = template + [directory]
    note = ("%s service %s (%s PID %d keeps running, the service stays down until brought up; it signals the "
            "service's own process only: what a `run` script left under it is signalled as a target)"
            % (kind, directory, name, daemon["pid"]))
    return _result(kind, directory, command, note, daemon, main, directory=directory,
                   comes_back="when its supervisor is started again (a reboot): `touch %s` keeps it down"
                              % _q(os.path.join(directory, "down")))


def _scan_dir(scanner, proc="/proc"):
    """The directory a scanner (runsvdir, s6-svscan, svscan) scans: its first operand, taken
    from its working directory when relative, or that directory itself when it has none. Never
    its working directory alone where it was given one: `runsvdir /etc/service` started from /
    scans /etc/service."""
    argv = scanner.get("argv") or []
    operand = next((a for a in argv[1:] if not a.startswith("-")), None)
    if operand and operand.startswith("/"):
        return operand
    cwd = _cwd(scanner["pid"], proc)
    return os.path.normpath(os.path.join(cwd, operand)) if cwd and operand else cwd


# -- containers ----------------------------------------------------------------------------------


def _conmon_of(container_id, daemon):
    """The conmon daemon when it is this container's (its `-c ID`), else None."""
    if daemon is None or daemon_name(daemon) != "conmon":
        return None
    argv = daemon.get("argv") or []
    cid = _option(argv, "-c", "--cid")
    return daemon if container_id is None or cid == container_id else None


def _podman_globals(argv):
    """The podman global options this container was made with (its storage root, run root...),
    from conmon's `--exit-command-arg`s (the `podman ... container cleanup` conmon runs at its
    exit): `podman stop` finds the container only where they point."""
    args = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--exit-command-arg"]
    out = []
    i = 0
    while i < len(args) - 1 and args[i] != "container":
        if args[i] in PODMAN_GLOBALS:
            if args[i + 1] and args[i + 1] != PODMAN_GLOBALS[args[i]]:
                out += [args[i], args[i + 1]]
            i += 2
            continue
        i += 1
    return out


def _conmon(daemon, main, procs, proc):
    """A process whose parent is a conmon, where no cgroup said which container: podman's."""
    return _container(None, daemon, main)


def _container(container, daemon, main):
    kind = container["kind"] if container else "podman"
    cid = container["id"] if container else None
    conmon = _conmon_of(cid, daemon)
    if conmon is not None and cid is None:
        cid = _option(conmon.get("argv") or [], "-c", "--cid")
    if kind == "podman":
        return _podman(container or {}, cid, conmon, main)
    if kind == "nerdctl":
        short = cid[:12] if cid else None
        return _result("nerdctl", short, ["nerdctl", "stop", short] if short else None,
                       "nerdctl container %s: not stopped by default (its owner decides)" % short, daemon, main,
                       container_id=cid)
    runtime = "containerd (CRI)" if kind == "cri-containerd" else "CRI-O"
    return _result(kind, cid[:13] if cid else None, ["crictl", "stop", cid] if cid else None,
                   "%s container outside any Kubernetes pod's cgroup: not stopped by default (whatever made it "
                   "through the CRI may start it again)" % runtime, daemon, main, container_id=cid)


def _podman(container, cid, conmon, main):
    argv = conmon.get("argv") if conmon else []
    name = _option(argv or [], "-n", "--name")
    label = name if name and re.fullmatch(r"[a-zA-Z0-9][a-zA-Z0-9_.-]*", name) else (cid[:12] if cid else None)
    unit = container.get("unit")
    if unit:
        return _result("podman", label, ["systemctl", "stop", unit],
                       "podman container %s run by the systemd unit %s (the unit restarts it: stopped through it)"
                       % (label, unit), conmon, main, container_id=cid, unit=unit)
    if label is None:
        return _result("podman", None, None, "a podman container whose id is not readable", conmon, main)
    return _result("podman", label, ["podman", *_podman_globals(argv or []), "stop", label],
                   "podman container %s (its restart policy, `podman inspect --format "
                   "'{{.HostConfig.RestartPolicy.Name}}' %s`, does not restart a container `podman stop` stopped)"
                   % (label, label), conmon, main, container_id=cid,
                   comes_back="at boot where podman-restart.service starts --restart=always containers: remove the "
                              "container (`podman rm`) or run it again without --restart to keep it down")


def _containerd_shim(daemon, main, procs, proc):
    """A container whose monitor is a containerd shim (`-namespace NS -id ID`): Kubernetes's
    (namespace k8s.io) when no kubepods cgroup said so, docker's (moby: plan.py's), or one
    nerdctl or ctr made."""
    argv = daemon.get("argv") or []
    namespace, cid = _option(argv, "-namespace", None), _option(argv, "-id", None)
    if namespace == "moby":
        return None
    if namespace == "k8s.io":
        return _result("cri-containerd", cid, ["crictl", "stop", cid] if cid else None,
                       "a Kubernetes container (containerd namespace k8s.io): stop its pod with kubectl",
                       daemon, main, default=False)
    ns = ["-n", namespace] if namespace and namespace != "default" else []
    return _result("nerdctl", cid, ["nerdctl", *ns, "stop", cid] if cid else None,
                   "a containerd container (namespace %s): not stopped by default" % (namespace or "default"),
                   daemon, main, container_id=cid, namespace=namespace)


# -- Kubernetes ----------------------------------------------------------------------------------


def _kubernetes(record, container, procs, proc):
    uid = container.get("pod")
    namespace, name, source = _pod_of(uid, environ(record["pid"], proc))
    node = _node_name(procs)
    first = "kubectl cordon %s" % node
    if name and namespace:
        command = ["kubectl", "-n", namespace, "delete", "pod", name]  # type: list | str | None
        label = "%s/%s" % (namespace, name)
        then = "`kubectl -n %s delete pod %s`" % (namespace, name)
    else:
        uid_text = uid if uid and re.fullmatch(r"[0-9a-f-]{32,36}", uid) else None
        label = "pod %s" % (uid_text or container.get("id"))
        command = ("kubectl get pods -A -o jsonpath='{range .items[?(@.metadata.uid==\"%s\")]}"
                   "{\"kubectl -n \"}{.metadata.namespace}{\" delete pod \"}{.metadata.name}{\"\\n\"}{end}'"
                   % uid_text) if uid_text else None
        then = "the `kubectl -n NS delete pod NAME` that command prints"
    note = ("Kubernetes pod %s (pod UID %s%s): never stopped by the teardown, the kubelet restarts what is killed "
            "under it. Run `%s` first, so the pod is not scheduled here again, then %s; a DaemonSet's pod comes back "
            "on a cordoned node too: change or delete the DaemonSet" % (
                label, uid, "; its name from %s" % source if source else "", first, then))
    out = _result("kubernetes", label, command, note, None, None, default=False)
    out.update(pod_uid=uid, namespace=namespace, pod=name, container_id=container.get("id"),
               runtime=container.get("runtime"), first=first, node=node)
    return out


def _node_name(procs):
    """This node's name as its kubelet registers it: the kubelet's `--hostname-override`, else
    the host name, lowercased (the kubelet's default); `NODE` where neither is a Kubernetes name."""
    import socket

    name = socket.gethostname().lower()
    for info in procs.values():  # the comm alone first: one compare a process on a busy host
        if info.get("comm") == "kubelet" and rules.trusted_names(info):  # a user's `kubelet` names no node
            name = (_option(info.get("argv") or [], None, "--hostname-override") or name).lower()
            break
    return name if _K8S_NAME.fullmatch(name) else "NODE"


def _pod_of(uid, env):
    """(namespace, name, where they were read) of pod `uid`: the kubelet's log directory
    (/var/log/pods/NAMESPACE_NAME_UID, root's: the kubelet's word), else the container's
    environment (POD_NAMESPACE / POD_NAME as the downward API sets them, HOSTNAME, which is the
    pod's name unless the spec sets another; the namespace then from the kubelet's pod
    directory): the process's own word, which it can rewrite. Only Kubernetes names are kept:
    nothing else reaches a printed command."""
    logged = _kubelet_log_dir(uid) if uid else None
    if logged:
        return logged[0], logged[1], "the kubelet's %s" % KUBELET_LOGS
    name = env.get("POD_NAME") or env.get("HOSTNAME")
    namespace = env.get("POD_NAMESPACE") or (_kubelet_namespace(uid) if uid else None)
    name = name if name and _K8S_NAME.fullmatch(name) else None
    namespace = namespace if namespace and _K8S_NAME.fullmatch(namespace) else None
    return namespace, name, "the container's environment (its own word)" if name else None


def _kubelet_log_dir(uid):
    """(namespace, name) from the kubelet's /var/log/pods/NAMESPACE_NAME_UID, a directory root
    owns (a namespace and a name cannot hold `_`); None when there is none."""
    try:
        entries = os.listdir(KUBELET_LOGS)
    except OSError:
        return None
    for entry in entries:
        parts = entry.split("_")
        if len(parts) != 3 or parts[2] != uid or not all(_K8S_NAME.fullmatch(p) for p in parts[:2]):
            continue
        try:
            st = os.lstat(os.path.join(KUBELET_LOGS, entry))
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode) and st.st_uid == 0:
            return parts[0], parts[1]
    return None


def _kubelet_namespace(uid):
    """The pod's namespace from the kubelet's pod directory (root's): the projected
    service-account volume's `namespace` file; None when none can be read."""
    base = "%s/%s/volumes/%s" % (KUBELET_PODS, uid, SA_NAMESPACE)
    try:
        volumes = sorted(os.listdir(base))
    except OSError:
        return None
    for volume in volumes:
        text = _small_root_file("%s/%s/namespace" % (base, volume))
        if text:
            return text.strip()
    return None


def _small_root_file(path, limit=256):
    """A regular file's first bytes, opened without blocking and read only when root owns it
    (the kubelet wrote it; another user's file is no word on a pod)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != 0:
            return None
        return os.read(fd, limit).decode("utf-8", "replace")
    except OSError:
        return None
    finally:
        os.close(fd)


# -- Ray -----------------------------------------------------------------------------------------


def _ray(daemon, main, procs, proc):
    kids = [p for p, info in procs.items() if info.get("ppid") == daemon["pid"] and not procfs.finished(info)]
    title = (main.get("argv") or [""])[0]
    name = title if title.startswith("ray::") else "raylet PID %d" % daemon["pid"]
    note = ("a Ray worker (%s) of the raylet PID %d: not stopped by default. `ray stop` ends every Ray process on "
            "this node (the raylet, its %d workers, and gcs_server and the dashboard on a head node): every Ray job "
            "here, not only this one; run it as the user the raylet runs as" % (name, daemon["pid"], len(kids)))
    return _result("ray", name, ["ray", "stop"], note, daemon, main, default=False, workers=len(kids))


_BY_DAEMON = {"supervisord": _supervisord, "conmon": _conmon, SHIM_PREFIX: _containerd_shim, "raylet": _ray,
              **{name: _service for name in SERVICE_SUPERVISORS}}
