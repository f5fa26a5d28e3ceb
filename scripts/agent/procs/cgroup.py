"""Which systemd unit or container a process belongs to, from /proc/PID/cgroup.

Why: a server run by a systemd unit with Restart=always comes back after a kill, so it
must be stopped with `systemctl stop UNIT`; one inside docker with `docker stop`. Works on
cgroup v2 (`0::/path`) and v1 (`N:controller:/path`, the name=systemd or pids line).
"""
import re

from .. import textsafe

_HEX64 = r"[0-9a-f]{64}"
_DOCKER = [
    re.compile(r"/docker-(%s)\.scope" % _HEX64),      # systemd cgroup driver
    re.compile(r"/docker/(%s)(?:/|$)" % _HEX64),      # cgroupfs driver
]
_LXC = [
    re.compile(r"/lxc\.payload\.([^/]+)"),             # LXC 4+/Proxmox, seen from the node
    re.compile(r"/lxc/([^/]+)"),                       # older LXC layout
]
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
    """{'path', 'unit', 'container': {'kind','id'} or None} from the text of /proc/PID/cgroup."""
    path = pick_path(text)
    container = None
    for pattern in _DOCKER:
        m = pattern.search(path)
        if m:
            container = {"kind": "docker", "id": m.group(1)}
            break
    if container is None:
        for pattern in _LXC:
            m = pattern.search(path)
            if m:
                container = {"kind": "lxc", "id": m.group(1)}
                break
    if container is None and "/kubepods" in path:
        container = {"kind": "kubernetes", "id": path.rsplit("/", 1)[-1]}
    unit = None
    if container is None or container["kind"] == "lxc":
        units = _UNIT.findall(path)
        unit = units[-1] if units else None
    return {"path": path, "unit": unit, "container": container}


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
