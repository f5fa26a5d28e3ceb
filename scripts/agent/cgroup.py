"""Which systemd unit or container a process belongs to, from /proc/PID/cgroup.

Why: a server run by a systemd unit with Restart=always comes back after a kill, so it
must be stopped with `systemctl stop UNIT`; one inside docker with `docker stop`. Works on
cgroup v2 (`0::/path`) and v1 (`N:controller:/path`, the name=systemd or pids line).
"""
import re

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


def read(pid, proc="/proc"):
    try:
        with open("%s/%d/cgroup" % (proc, pid)) as f:
            return parse(f.read())
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return {"path": None, "unit": None, "container": None}
