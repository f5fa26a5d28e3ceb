"""Which systemd unit or container a process belongs to, from /proc/PID/cgroup.

Why: a server run by a systemd unit with Restart=always comes back after a kill, so it
must be stopped with `systemctl stop UNIT`; one inside docker with `docker stop`, podman with
`podman stop`, a Kubernetes pod only through the API server (the kubelet restarts whatever is
killed or stopped under it). Works on cgroup v2 (`0::/path`) and v1 (`N:controller:/path`, the
name=systemd or pids line).

The whole account: docs/design-notes.md (scripts/agent/procs/cgroup.py)."""
import re

from . import textsafe

_HEX64 = r"[0-9a-f]{64}"
_DOCKER = [
    re.compile(r"/docker-(%s)\.scope" % _HEX64),      # systemd cgroup driver
    re.compile(r"/docker/(%s)(?:/|$)" % _HEX64),      # cgroupfs driver
]
_LXC = [
    re.compile(r"/lxc\.payload\.([^/]+)"),             # LXC 4+/Proxmox, seen from the node
    re.compile(r"/lxc/([^/]+)"),                       # older LXC layout
]
# (kind, pattern) of the runtimes besides docker. The container's own scope only: a runtime's
# monitor (conmon) lives beside it, in a scope of its own.
_OTHER_RUNTIMES = (
    ("podman", re.compile(r"/libpod-(?:payload-)?(%s)(?:\.scope)?(?:/|$)" % _HEX64)),
    ("cri-containerd", re.compile(r"/cri-containerd-(%s)\.scope(?:/|$)" % _HEX64)),
    ("crio", re.compile(r"/crio-(%s)\.scope(?:/|$)" % _HEX64)),
    ("nerdctl", re.compile(r"/nerdctl-(%s)\.scope(?:/|$)" % _HEX64)),
)
_RUNTIMES = _OTHER_RUNTIMES + (("docker", _DOCKER[0]),)  # which runtime made a pod's container
# Outside a pod, the first that matches: docker (as it always was), then LXC, whose node sees
# what runs inside a CT below its cgroup (podman in a CT is the CT's: `pct` reaches it), then the others
_CONTAINERS = tuple(("docker", p) for p in _DOCKER) + tuple(("lxc", p) for p in _LXC) + _OTHER_RUNTIMES
# A pod's cgroup: `kubepods-<qos>-pod<UID>.slice` (systemd driver, the UID's dashes escaped as
# `_`) or `pod<UID>` (cgroupfs driver). A static pod's UID is a 32-digit hash without dashes.
_POD = re.compile(r"/(?:kubepods-(?:[a-z]+-)?)?pod([0-9a-f][0-9a-f_-]{30,35}[0-9a-f])(?:\.slice)?(?:/|$)")
_BARE_ID = re.compile(r"/(%s)(?:\.scope)?$" % _HEX64)  # the cgroupfs driver names a pod's container by its id alone
_UNIT = re.compile(r"/([^/]+\.(?:service|scope))(?:/|$)")
_PREFERRED_V1 = ("name=systemd", "pids", "memory", "cpu,cpuacct")


def pick_path(text):
    """The cgroup path that tells unit and container: v2's unified line, else a v1 line."""
    paths = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            paths[parts[1]] = parts[2]
    if "" in paths and paths[""] not in ("/", ""):
        return paths[""]
    for controller in _PREFERRED_V1:
        if controller in paths:
            return paths[controller]
    return paths.get("", next(iter(paths.values()), ""))


def parse(text):
    """{'path', 'unit', 'container': {'kind', 'id', ...} or None} from the text of /proc/PID/cgroup."""
    path = pick_path(text)
    container = _kubernetes(path) if "/kubepods" in path else _match(path, _CONTAINERS)
    units = _UNIT.findall(path)
    unit = None
    if container is None or container["kind"] == "lxc":
        unit = units[-1] if units else None
    elif container["kind"] == "podman":
        # podman run by a systemd unit (quadlet, `podman generate systemd --new`): the unit
        # restarts it, so the unit is what stops it for good
        services = [u for u in units if u.endswith(".service")]
        if services:
            container["unit"] = services[-1]
    return {"path": path, "unit": unit, "container": container}


def _match(path, table):
    """{'kind', 'id'} of the first (kind, pattern) of `table` that the path matches, or None."""
    for kind, pattern in table:
        m = pattern.search(path)
        if m:
            return {"kind": kind, "id": m.group(1)}
    return None


def _kubernetes(path):
    """A Kubernetes pod's container: {'kind': 'kubernetes', 'id', 'pod', 'runtime'}. `id` is the
    container's id where the path names one (a pod's own processes, outside any container's
    scope, are known by `pod<UID>`), `pod` the pod UID with its dashes, `runtime` the scope's
    maker (cri-containerd, crio, docker) or None. A process in `kubepods` with no pod UID (the
    QoS slices themselves) is still the kubelet's: its id is the path's last element."""
    pod = _POD.search(path)
    inner = _match(path, _RUNTIMES)
    out = {"kind": "kubernetes", "id": path.rstrip("/").rsplit("/", 1)[-1], "pod": None, "runtime": None}
    if pod:
        uid = pod.group(1).replace("_", "-")
        out["pod"] = uid
        out["id"] = "pod" + uid
    if inner is not None:
        out.update(id=inner["id"], runtime=inner["kind"])
    else:
        bare = _BARE_ID.search(path)
        if bare:
            out["id"] = bare.group(1)
    return out


def inner_pid(pid, proc="/proc"):
    """The pid a process has in its own (innermost) pid namespace: the last NSpid field."""
    try:
        with open("%s/%d/status" % (proc, pid)) as f:
            for line in f:
                if line.startswith("NSpid:"):
                    return int(line.split()[-1])
    except (OSError, ValueError):
        return None
    return None


def with_pids(container, pid, proc="/proc"):
    """An LXC container record with the process's pid inside it and a label to show:
    `ct 129 pid 9 (node pid 814)` - the pid the container's own tools and logs use, and the
    pid the node signals. Other containers are returned as they are."""
    if not container or container["kind"] != "lxc":
        return container
    inner = inner_pid(pid, proc)
    if inner is None or inner == pid:
        return container
    return dict(container, pid=inner, node_pid=pid, label="ct %s pid %d (node pid %d)" % (container["id"], inner, pid))


def read(pid, proc="/proc"):
    try:
        with open("%s/%d/cgroup" % (proc, pid), "rb") as f:  # a cgroup's name is any bytes its maker chose
            return parse(textsafe.decode(f.read()))
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return {"path": None, "unit": None, "container": None}
