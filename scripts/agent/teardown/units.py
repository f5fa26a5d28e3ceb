"""The commands that stop a unit or container through its manager, and whether it comes back.

Why through the manager: a process of a `Restart=always` unit or of a docker container with
a restart policy is started again after a kill; `systemctl stop` / `docker stop` end it for
good (until boot, or until docker restarts). A unit inside an LXC container on a Proxmox
node is the container's systemd's to stop: `pct exec CTID -- systemctl stop UNIT`.
Why say whether it comes back: a stopped unit that is still enabled starts again at the
next boot, and a stopped `--restart=always` container when the docker daemon restarts
(the auto-started vLLM service that came back after a host crash and held every GPU);
`--disable` makes the stop last.

Items are the plan's rows: units {unit, pids, disable, ctid (a unit inside an LXC
container) or None}, containers {id, pids, disable}, and the stops of other managers
(policy/managers.py: supervisorctl, sv down, podman stop...) {kind, name, command, argv, pids,
comes_back, run}, which say themselves how they are run and whether the program comes back.
"""

COMES_BACK_POLICIES = ("always",)  # `unless-stopped` stays stopped after `docker stop`, even over a restart


def _in_ct(item, argv):
    return ["pct", "exec", str(item["ctid"]), "--"] + argv if item.get("ctid") else argv


def stop_argv(item):
    """The one command that stops this unit (and disables it with --disable), container or
    manager's program."""
    if "argv" in item:
        return list(item["argv"])
    if "unit" in item:
        verb = ["disable", "--now"] if item.get("disable") else ["stop"]
        return _in_ct(item, ["systemctl"] + verb + [item["unit"]])
    return ["docker", "stop", item["id"]]


def stop_text(item, argv):
    """The stop as the audit log and the report show it: a container by name and short id
    (`docker stop vllm (3f2a1b4c5d6e)`), the id alone being 64 characters no one reads."""
    if "argv" in item:
        return item["command"]
    if "unit" in item or not item.get("name"):
        return " ".join(argv)
    return " ".join(argv[:-1] + ["%s (%s)" % (item["name"], item["id"][:12])])


def before_stop(item):
    """Commands to run before the stop: with --disable, a container's restart policy off."""
    if "unit" not in item and "argv" not in item and item.get("disable"):
        return [["docker", "update", "--restart=no", item["id"]]]
    return []


def _out(argv):
    import subprocess  # here: only a teardown that stopped a unit or container asks

    try:
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.decode(errors="replace").strip()


def comes_back(item):
    """A sentence saying whether the stopped unit, container or program starts again by itself, or None."""
    if "argv" in item:
        return item.get("comes_back")
    if "unit" in item:
        if item.get("disable"):
            return "disabled: it does not start at boot"
        state = _out(_in_ct(item, ["systemctl", "is-enabled", item["unit"]]))
        if state in ("enabled", "enabled-runtime", "alias", "indirect", "generated"):
            return "still %s: it starts again at boot (--disable disables it)" % state
        return "%s: it does not start at boot by itself" % state if state else None
    policy = _out(["docker", "inspect", "-f", "{{.HostConfig.RestartPolicy.Name}}", item["id"]])
    if policy in COMES_BACK_POLICIES:
        return ("restart policy %s: it comes back when docker restarts unless its policy changes "
                "(--disable runs docker update --restart=no)" % policy)
    return "restart policy %s: it stays stopped" % policy if policy else None


def container_names(ids):
    """{id: name} of docker containers, from one `docker inspect` (names are for people: the
    stop itself goes by id, which no other container can take)."""
    text = _out(["docker", "inspect", "--format", "{{.Id}} {{.Name}}"] + list(ids))
    out = {}
    for line in (text or "").splitlines():
        cid, _, name = line.partition(" ")
        if cid in ids and name.strip("/ "):
            out[cid] = name.strip().lstrip("/")
    return out
