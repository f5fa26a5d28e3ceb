"""The Ansible side of gpu-pivot, on the controller: the agent call a task asks for, what its
result means to Ansible (changed, failed, facts), and an inventory built from hosts.env.

Why on the controller: an Ansible module runs on the managed host with nothing of this repo
there. So the action plugin (ansible/action_plugins/gpu_pivot.py) builds the agent's argv
and bundle here, the module (ansible/library/gpu_pivot.py) only runs them on the host over
Ansible's own connection, and the JSON between the marker lines is read back here through
the contract, like every other result. Nothing is installed on the host.

Check mode runs `plan` instead of `teardown` (nothing is signalled; the plan is the diff);
`state: verified` runs `verify`, which signals nothing in either mode.
"""
from __future__ import annotations

from ..agent.wire import call as wire_call, codes, defaults, frame, records, requests
from ..config import cliargs
from ..config.errors import ConfigError
from ..config.patterncheck import check_pattern
from ..config.route import PctHop
from ..config.sshopts import options

STATES = ("free", "verified")
DEFAULTS = {"state": "free", "devices": defaults.DEVICE_GLOB, "fake_devices": False, "targets": [], "match": [],
            "protect": [], "scope": None, "scope_uid": None, "grace": defaults.GRACE_S, "timeout": defaults.TIMEOUT_S,
            "settle": None,  # not given: the agent's rule (defaults.SETTLE_S, none when nothing can respawn)
            "max_used_mib": defaults.MAX_USED_MIB, "python": None}


def _params(raw: dict) -> dict:
    """The task's arguments with defaults, checked; ConfigError names the bad one."""
    unknown = sorted(set(raw) - set(DEFAULTS))
    if unknown:
        raise ConfigError(f"gpu_pivot: unknown option(s) {', '.join(unknown)} (known: {', '.join(sorted(DEFAULTS))})")
    p = dict(DEFAULTS, **{k: v for k, v in raw.items() if v is not None})
    if p["state"] not in STATES:
        raise ConfigError(f"state={p['state']!r}: must be one of {', '.join(STATES)}")
    for key in ("targets", "match", "protect"):
        values = [p[key]] if isinstance(p[key], str) else list(p[key])
        p[key] = [check_pattern(key, str(v)) for v in values]
    for key in ("grace", "timeout", "settle"):
        p[key] = None if p[key] is None else cliargs.seconds(key, p[key])
    p["max_used_mib"] = cliargs.whole("max_used_mib", p["max_used_mib"])
    if p["scope"] is not None and not str(p["scope"]).strip():  # a variable that expanded to nothing
        raise ConfigError(f"scope={p['scope']!r}: an empty scope narrows nothing, so the teardown would reach the "
                          "whole host; give the text the targets' command lines contain, or leave scope out")
    if p["scope_uid"] is not None:
        p["scope_uid"] = cliargs.whole("scope_uid", p["scope_uid"])
    p["fake_devices"] = _bool("fake_devices", p["fake_devices"])
    if not str(p["devices"]).startswith("/"):
        raise ConfigError(f"devices={p['devices']!r}: an absolute path pattern such as /dev/nvidia*")
    return p


def _bool(key: str, value) -> bool:
    """A yes/no option as templating leaves it: a bool, or its text ("True", "no", "1")."""
    text = str(value).strip().lower()
    if text in ("true", "yes", "1", "on"):
        return True
    if text in ("false", "no", "0", "off"):
        return False
    raise ConfigError(f"{key}={value!r}: must be yes or no")


def agent_call(raw: dict, check_mode: bool) -> dict:
    """{subcommand, argv, nonce, deadline_s} for one task; ConfigError for a bad argument."""
    from ..ops import teardown as teardown_op

    p = _params(raw)
    nonce = frame.new_nonce()
    teardown = requests.Teardown(grace=p["grace"], timeout=p["timeout"], settle=p["settle"],
                                 max_used_mib=p["max_used_mib"], operator="ansible", match=tuple(p["match"]))
    # verified: look; else the teardown, or in check mode its plan (nothing signalled: the plan is the diff)
    req: requests.Request = (requests.Verify(max_used_mib=p["max_used_mib"]) if p["state"] == "verified"
                             else teardown_op.carried(teardown, check_mode))
    argv = wire_call.agent_argv(p["python"] or "python3", req, nonce, p["devices"], fake_devices=p["fake_devices"],
                                targets=p["targets"], protect=p["protect"], scope=p["scope"],
                                scope_uid=p["scope_uid"])
    return {"subcommand": req.name, "argv": argv, "nonce": nonce, "deadline_s": req.deadline_s(),
            "state": p["state"]}


def agent_source() -> str:
    """The agent bundle, as the module feeds it to `python3 -`."""
    from ..reach.bundle import agent_payload

    return agent_payload().decode()


def _rows(rows: list, keys: tuple) -> list:
    return [{k: r.get(k) for k in keys} for r in rows]


TARGET_KEYS = ("pid", "user", "state", "cmdline", "reason", "gpu_mib", "via")
PROTECTED_KEYS = ("pid", "user", "cmdline", "reason")


def outcome(call: dict, rc: int, stdout: str, stderr: str, check_mode: bool) -> dict:
    """The task result: changed, failed, msg and the facts (ansible_facts.gpu_pivot)."""
    from ..reach.transport import AgentError, read_document

    try:  # read as every agent call's result is (the module ran it over Ansible's own connection)
        doc = read_document("", stdout, call["nonce"], rc, stderr)
    except (AgentError, ConfigError) as exc:
        return {"failed": True, "changed": False, "msg": str(exc)}
    sub = call["subcommand"]
    try:
        res = records.read(sub, rc, doc)
    except records.ContractError as exc:
        return {"failed": True, "changed": False, "msg": str(exc)}
    facts: dict = {"state": call["state"], "subcommand": sub, "exit_code": rc, "targets": [], "protected": [],
                   "freed_mib": 0, "problems": []}
    if sub == "verify":
        # exit 0 only: "free" with exit 9 is a GPU nothing holds that still needs a reset or a reboot
        failed, changed = rc != codes.EXIT_OK or not res.free, False
        verdict = "free" if not failed else "not free" if not res.free else codes.exit_name(rc).replace("-", " ")
        facts.update(verdict=verdict, problems=res.problems,
                     protected=_rows([h for h in res.scan.holders if h["protected"]], ("pid", "cmdline", "protected")))
        msg = "GPUs free" if not failed else "; ".join(res.problems[:5]) or codes.exit_name(rc).replace("-", " ")
    elif sub == "plan":
        plan = res.plan
        facts.update(verdict="planned (check mode: nothing signalled)", would_free_mib=plan.will_free_mib,
                     targets=_rows(plan.targets, TARGET_KEYS), protected=_rows(plan.protected, PROTECTED_KEYS),
                     left_alone=_rows(plan.left_alone, TARGET_KEYS))
        failed, changed = False, bool(plan.targets)
        held = "GPU memory unknown" if plan.will_free_mib is None else f"{plan.will_free_mib} MiB"
        msg = f"would stop {len(plan.targets)} process(es), {held}"
    else:
        facts.update(_teardown_facts(res))
        failed, changed = rc != codes.EXIT_OK, res.signalled > 0
        msg = facts["verdict"] if not failed else f"{facts['verdict']}: " + "; ".join(facts["problems"][:5])
    out = {"changed": changed, "failed": failed, "msg": msg, "ansible_facts": {"gpu_pivot": facts}}
    if sub == "plan" and changed:
        out["diff"] = {"before": "".join(f"{t['pid']} {t['cmdline']}\n" for t in plan.targets), "after": ""}
    return out


def _teardown_facts(res: records.TeardownResult) -> dict:
    plan = res.plan
    if plan is None or res.locked or res.state_error:  # not started: then, and only then, it has no plan
        return {"verdict": "not started", "problems": [res.error or res.state_error]}
    return {"verdict": "free" if res.code == codes.EXIT_OK else codes.exit_name(res.code).replace("-", " "),
            "targets": _rows(plan.targets, TARGET_KEYS), "protected": _rows(plan.protected, PROTECTED_KEYS),
            "freed_mib": res.freed_mib, "signalled": res.signalled, "problems": res.problems,
            "still_holding": res.still_holding, "wall_s": res.wall_s}


# -- inventory from hosts.env ------------------------------------------------------------------

_VARS = (("devices", "gpu_pivot_devices"), ("scope", "gpu_pivot_scope"), ("scope_uid", "gpu_pivot_scope_uid"))


def inventory(hosts: dict) -> dict:
    """Ansible's JSON inventory (`--list`) for the ssh hosts of hosts.env, same settings:
    destination, port, key and other -o options, interpreter, devices, targets, protect, scope.
    Hosts reached through `pct exec` (CTID) are listed in `gpu_pivot_skipped` with why."""
    hostvars: dict = {}
    skipped = []
    for alias, host in sorted(hosts.items()):
        ssh = host.route.ssh
        if ssh is None or host.sandbox or any(isinstance(h, PctHop) for h in host.route.hops):
            if alias not in ("local", "sandbox"):
                skipped.append(alias)
            continue
        user, _, address = ssh.dest.rpartition("@")
        v: dict = {"ansible_host": address, "ansible_python_interpreter": host.python}
        if user:
            v["ansible_user"] = user
        v.update(_ssh_vars(list(ssh.opts)))
        if host.route.become is not None:  # ALIAS_BECOME=sudo: the module runs as root, as the agent would
            v.update(ansible_become=True, ansible_become_method="sudo")
        for attr, var in _VARS:
            if getattr(host, attr) is not None:
                v[var] = getattr(host, attr)
        if host.fake_devices:
            v["gpu_pivot_fake_devices"] = True
        for attr in ("targets", "protect"):
            if getattr(host, attr):
                v[f"gpu_pivot_{attr}"] = list(getattr(host, attr))
        hostvars[alias] = v
    return {"_meta": {"hostvars": hostvars}, "all": {"children": ["gpu_hosts"]},
            "gpu_hosts": {"hosts": sorted(hostvars)}, "gpu_pivot_skipped": {"vars": {"why": "pct exec hosts: use "
                          "community.proxmox's connection"}, "hosts": skipped} if skipped else {"hosts": []}}


def _ssh_vars(opts: list) -> dict:
    """-p and the first -i become ansible_port and the key file; the rest (-o ...) goes to
    every ssh, sftp and scp Ansible runs (ssh's -p is sftp's -P, so it cannot go there as it
    is). Read as ssh reads them (sshopts.options: `-p2222`, `-vp 22`)."""
    out: dict = {}
    rest: list = []
    for c, arg in options(opts):
        if c == "p" and arg:
            out["ansible_port"] = int(arg)
        elif c == "i" and arg and "ansible_ssh_private_key_file" not in out:
            out["ansible_ssh_private_key_file"] = arg
        elif not c:  # not an option (hosts.env refuses these: check_ssh_opts)
            rest.append(arg)
        else:  # a flag, or an option and its value, each word on its own
            rest += [f"-{c}", arg] if arg else [f"-{c}"]
    if rest:
        import shlex

        out["ansible_ssh_common_args"] = shlex.join(rest)
    return out
