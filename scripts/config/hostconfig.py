"""Host configuration: read hosts.env, validate every value, and describe each host.

Why this module exists: hand-written one-liners hard-coded `root@10.1.2.6` and `pct exec 129`
into hand-quoted strings. Here a host is data, checked before anything runs, so a typo
gets one clear line (and exit 2) instead of an ssh to the wrong place.

The file is read strictly (scripts/config/envfile.py: a line that is not KEY=VALUE is an error
naming file and line, where python-dotenv would only warn and drop it) and never copied
into `os.environ`. ssh options that run local commands are refused (scripts/config/sshopts.py);
target and protect patterns that match everything are refused (scripts/config/patterncheck.py).
"""
from __future__ import annotations

import os
import re
import shlex
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from ..agent.wire.defaults import DEVICE_GLOB, MAX_PROBE_MIB, PROBE_MIB
from . import gpu_settings
from .envfile import read_env_file
from .errors import ConfigError, show
from .patterncheck import check_pattern
from .route import PctHop, Route, SshHop, SudoHop
from .sshopts import check_ssh_opts

DEFAULT_DEVICES = DEVICE_GLOB
DEFAULT_PYTHON = "python3"
HOSTS_FILE_ENV = "GPU_PIVOT_HOSTS_FILE"

# Per-host keys: ALIAS_<SUFFIX>. Longest suffixes first so GPU1_SSH_OPTS is not read as
# alias "gpu1_ssh" + "OPTS".
KNOWN_SUFFIXES = ("SSH_OPTS", "SSH", "BECOME", "CTID", "PYTHON", "FAKE_DEVICES", "DEVICES", "TARGETS", "PROTECT",
                  "SCOPE_UID", "SCOPE", "GPU_BASELINE", "GPU_APPLY_SETTINGS", "PROBE_MIB")
_BOOL = {"yes": True, "true": True, "1": True, "no": False, "false": False, "0": False}

_SSH_DEST = re.compile(r"^[A-Za-z0-9_.][A-Za-z0-9_.@:%\[\]-]*$")
_PYTHON = re.compile(r"^(/[A-Za-z0-9._/+-]+|[A-Za-z0-9._+][A-Za-z0-9._+-]*)$")  # never an option ('-c')
_DEVICES = re.compile(r"^/[A-Za-z0-9._/*?\[\]+-]+$")
_ALIAS = re.compile(r"^[a-z][a-z0-9_]*$")


@dataclass(frozen=True)
class Host:
    """One configured host: where it is (the route) and how the agent runs there."""

    alias: str
    route: Route
    python: str = DEFAULT_PYTHON
    devices: str = DEFAULT_DEVICES
    targets: tuple = ()
    protect: tuple = ()
    sandbox: bool = False
    fake_gpus: str | None = None  # SANDBOX only: directory of the fake GPU memory source
    fake_devices: bool = False    # device files may be plain files (sandbox, tests); else NVIDIA char devices only
    scope: str | None = None      # targets must also have this text in their command line (sandbox: its dir)
    scope_uid: int | None = None  # targets must be owned by this uid (sandbox: its owner)
    run_dir: str | None = None    # where the agent keeps state on the host (default: /run/gpu-pivot)
    gpu_baseline: dict = field(default_factory=dict, compare=False, hash=False)  # GPU settings status expects
    apply_settings: bool = False  # a pivot sets the baseline after its teardown and the phase's before its start
    probe_mib: int = PROBE_MIB    # the CUDA probe's test buffer (verify --probe, a pivot's probe step)
    source: str = "built-in"
    phases: dict = field(default_factory=dict, compare=False, hash=False)

    def describe(self) -> str:
        label = " [SANDBOX: fake GPUs on this machine]" if self.sandbox else ""
        return f"{self.route.describe()}{label}"


# beside tasks.py: this file is scripts/config/hostconfig.py, two folders below it
REPO_HOSTS_FILE = Path(__file__).resolve().parents[2] / "hosts.env"


def hosts_file() -> Path:
    """Which hosts.env: $GPU_PIVOT_HOSTS_FILE, else the one beside tasks.py, else ./hosts.env.

    Why not only ./hosts.env: Invoke finds tasks.py from any subdirectory, so `invoke ping
    --host gpu1` from runbooks/ ran the repo's tasks without the repo's hosts ("unknown host
    alias"). The file beside tasks.py is the one those tasks belong to."""
    if os.environ.get(HOSTS_FILE_ENV):
        return Path(os.environ[HOSTS_FILE_ENV])
    if REPO_HOSTS_FILE.exists():
        return REPO_HOSTS_FILE
    return Path("hosts.env")


def _split_key(key: str):
    for suffix in KNOWN_SUFFIXES:
        tail = "_" + suffix
        if key.endswith(tail) and len(key) > len(tail):
            return key[: -len(tail)].lower(), suffix
    return None, None


def _check(key: str, value: str, pattern: re.Pattern, what: str) -> str:
    if not pattern.match(value):
        raise ConfigError(f"{key}={show(value)}: not a valid {what}")
    return value


def _regex_list(key: str, value: str) -> tuple:
    """One regex per key (alternation `a|b` names several programs); see patterncheck."""
    return (check_pattern(key, value),)


def _yes_no(key: str, value: str) -> bool:
    try:
        return _BOOL[value.lower()]
    except KeyError:
        raise ConfigError(f"{key}={show(value)}: must be yes or no (or true/false, 1/0)") from None


BECOME_METHODS = ("sudo",)  # Ansible's word and value; the one way to root over ssh supported


def _become(key: str, value: str, ssh: str | None, ssh_key: str) -> SudoHop:
    """The hop that makes the rest of the route root: `sudo -n` on the ssh host, before `pct exec`
    on a Proxmox node (the container is entered as root). Why only behind ssh: on this machine
    the tasks themselves run as whoever started them (`sudo invoke ...` as root)."""
    if value not in BECOME_METHODS:
        raise ConfigError(f"{key}={show(value)}: the one way to become root is 'sudo' (a NOPASSWD rule for the ssh "
                          "user on the host)")
    if ssh is None:
        raise ConfigError(f"{key} is set but {ssh_key} is not: becoming root is for an ssh host; on this machine "
                          "run the tasks as root instead")
    return SudoHop()


def build_host(alias: str, keys: dict, source: str) -> Host:
    """Validate one alias's keys (suffix -> value) and build its Host."""
    up = alias.upper()

    def key(s):
        return f"{up}_{s}"

    ssh = keys.get("SSH")
    opts: tuple = ()
    if "SSH_OPTS" in keys:
        try:
            opts = tuple(shlex.split(keys["SSH_OPTS"]))
        except ValueError as exc:
            raise ConfigError(f"{key('SSH_OPTS')}={show(keys['SSH_OPTS'])}: {exc}") from None
        check_ssh_opts(key("SSH_OPTS"), keys["SSH_OPTS"], opts)
        if not ssh:
            raise ConfigError(f"{key('SSH_OPTS')} is set but {key('SSH')} is not")
    hops: list[SshHop | SudoHop | PctHop] = []
    if ssh is not None:
        if ssh == "":
            raise ConfigError(f"{key('SSH')}='': empty ssh destination")
        if ssh.startswith("-"):
            raise ConfigError(f"{key('SSH')}={show(ssh)}: an ssh destination may not start with '-'")
        dest = _check(key("SSH"), ssh, _SSH_DEST, "ssh destination (user@host or alias; no spaces or shell characters)")
        hops.append(SshHop(dest, opts))
    if "BECOME" in keys:
        hops.append(_become(key("BECOME"), keys["BECOME"], ssh, key("SSH")))
    if "CTID" in keys:
        ctid = keys["CTID"]
        if not ctid.isdigit() or not ctid.isascii() or int(ctid) < 100:
            raise ConfigError(f"{key('CTID')}={show(ctid)}: a Proxmox container id is a number of 100 or more")
        hops.append(PctHop(ctid))
    python = _check(key("PYTHON"), keys.get("PYTHON", DEFAULT_PYTHON), _PYTHON,
                    "interpreter (a name or an absolute path)")
    devices = _check(key("DEVICES"), keys.get("DEVICES", DEFAULT_DEVICES), _DEVICES,
                     "device glob (an absolute path pattern)")
    targets = _regex_list(key("TARGETS"), keys["TARGETS"]) if "TARGETS" in keys else ()
    protect = _regex_list(key("PROTECT"), keys["PROTECT"]) if "PROTECT" in keys else ()
    fake = _yes_no(key("FAKE_DEVICES"), keys["FAKE_DEVICES"]) if "FAKE_DEVICES" in keys else False
    phases = _phases(alias, {k[1]: v for k, v in keys.items() if isinstance(k, tuple)})
    scope = None  # narrows targets to command lines containing it (see hosts.env.example)
    if "SCOPE" in keys:
        scope = keys["SCOPE"]
        if not scope.strip():  # a variable that expanded to nothing: the whole host, where one job was meant
            raise ConfigError(f"{key('SCOPE')}={show(scope)}: an empty scope narrows nothing, so the teardown would "
                              "reach the whole host; give the text the targets' command lines contain, or remove "
                              "the line")
    scope_uid = _uid(key("SCOPE_UID"), keys["SCOPE_UID"]) if "SCOPE_UID" in keys else None
    baseline = gpu_settings.parse(key("GPU_BASELINE"), keys["GPU_BASELINE"]) if "GPU_BASELINE" in keys else {}
    apply = _yes_no(key("GPU_APPLY_SETTINGS"), keys["GPU_APPLY_SETTINGS"]) if "GPU_APPLY_SETTINGS" in keys else False
    probe_mib = _probe_mib(key("PROBE_MIB"), keys["PROBE_MIB"]) if "PROBE_MIB" in keys else PROBE_MIB
    return Host(alias, Route(tuple(hops)), python, devices, targets, protect, fake_devices=fake, scope=scope,
                scope_uid=scope_uid, source=source, phases=phases, gpu_baseline=baseline, apply_settings=apply,
                probe_mib=probe_mib)


def _probe_mib(key: str, value: str) -> int:
    """The CUDA probe's test buffer in MiB: a whole number from 1 to MAX_PROBE_MIB."""
    if not (value.isascii() and value.isdigit()) or not 1 <= int(value) <= MAX_PROBE_MIB:
        raise ConfigError(f"{key}={show(value)}: the probe's test buffer is a whole number of MiB from 1 to "
                          f"{MAX_PROBE_MIB}")
    return int(value)


def _phase_key(key: str):
    """(alias, phase, field) of an ALIAS_PHASE_NAME_FIELD key, else None. The phases' module
    loads only for a file that has one: a status of hosts without phases builds none."""
    if "_PHASE_" not in key:
        return None
    from .phases import split_phase_key

    return split_phase_key(key)


def _phases(alias: str, fields_by_name: dict) -> dict:
    """{name: Phase} of one host, from {name: {field: value}} (none: the phases' module stays unloaded)."""
    if not fields_by_name:
        return {}
    from .phases import build_phase

    return {name: build_phase(alias, name, fields) for name, fields in fields_by_name.items()}


def _uid(key: str, value: str) -> int:
    """A uid: digits only (a user name would be looked up on this machine, not the host)."""
    if not (value.isascii() and value.isdigit()) or int(value) > 2**32 - 2:
        raise ConfigError(f"{key}={show(value)}: not a uid (a number; `id -u NAME` on the host gives it)")
    return int(value)


def _group(values: dict, source: str, lines: dict | None = None) -> dict:
    """hosts.env keys -> {alias: {suffix: value}}, rejecting keys we do not know.

    Phase keys (ALIAS_PHASE_NAME_FIELD) are gathered under suffix ("PHASE", name).
    `lines` (key -> line number) lets an error point at FILE:LINE."""
    grouped: dict = {}
    for k, v in values.items():
        where = f"{source}:{lines[k]}" if lines and k in lines else source
        phase_key = _phase_key(k)
        if phase_key:
            alias, name, fld = phase_key
            grouped.setdefault(alias, {}).setdefault(("PHASE", name), {})[fld] = v
            continue
        alias, suffix = _split_key(k)
        if alias is None:
            raise ConfigError(f"{where}: unknown key {k!r} (keys are ALIAS_" + "|ALIAS_".join(KNOWN_SUFFIXES)
                              + "|ALIAS_PHASE_NAME_FIELD; see hosts.env.example)")
        if not _ALIAS.match(alias):
            raise ConfigError(f"{where}: key {k!r}: alias {alias!r} must start with a letter")
        grouped.setdefault(alias, {})[suffix] = v
    return grouped


BUILT_IN = ("local", "sandbox")  # aliases hosts.env may not define


def load_hosts(path: Path | None = None, built_in=None) -> dict:
    """All hosts: the built-in `local`, the other built-ins, then those of hosts.env. Validates all.

    `built_in`: the other built-in hosts, as zero-argument callables that return a Host
    (sandbox.sandbox_host). Why passed in: they are built on this module's Host (the sandbox,
    with its own directory and phases), and importing them from here made an import circle.
    scripts/config/hosts.py, above both, passes them: call hosts.load() for every host a
    task can name.
    """
    built_in = built_in or ()
    path = path or hosts_file()
    values: dict = {}
    lines: dict = {}
    if path.exists():
        values, lines = read_env_file(path)
    elif os.environ.get(HOSTS_FILE_ENV):
        raise ConfigError(f"{HOSTS_FILE_ENV}={str(path)!r}: no such file")
    grouped = _group(values, str(path), lines)
    for alias in BUILT_IN[1:]:
        if alias in grouped:
            raise ConfigError(f"{path}: {alias.upper()}_* keys are not allowed; the {alias} host is built in")
    local_keys = grouped.pop("local", {})
    for forbidden in ("SSH", "SSH_OPTS", "BECOME", "CTID"):
        if forbidden in local_keys:
            raise ConfigError(f"{path}: LOCAL_{forbidden} is not allowed; `local` is always this machine")
    with _at_line(path, lines):
        hosts = {"local": build_host("local", local_keys, "built-in")}
    for make in built_in:
        host = make()
        hosts[host.alias] = host
    for alias, keys in grouped.items():
        with _at_line(path, lines):
            hosts[alias] = build_host(alias, keys, str(path))
    return hosts


_KEY_FIRST = re.compile(r"([A-Z][A-Z0-9_]*)[=: ]")


@contextmanager
def _at_line(path: Path, lines: dict):
    """A value's error (`GPU1_SSH='-x': ...`) ends with FILE:LINE of its key, as a syntax error
    names it: one bad value blocks every host, so the operator must find it at once. At the end,
    so the line still starts with the key and value (what scripts and people grep for)."""
    try:
        yield
    except ConfigError as exc:
        key = _KEY_FIRST.match(str(exc))
        if key and key.group(1) in lines and str(path) not in str(exc):
            raise ConfigError(f"{exc} (at {path}:{lines[key.group(1)]})") from None
        raise


def source_words(path: Path | None = None) -> str:
    """Which hosts.env the hosts came from, for a person: its path, or that none was found
    and where it was looked for (an alias of a missing file reads as a typo otherwise)."""
    path = path or hosts_file()
    if path.exists():
        return f"hosts from {path}"
    return (f"no hosts.env found (looked for ${HOSTS_FILE_ENV}, {REPO_HOSTS_FILE} and ./hosts.env; "
            "copy hosts.env.example to make one)")


def select_hosts(spec: str, hosts: dict, built_in: dict | None = None) -> list:
    """'gpu1,gpu2' (or a node set such as 'gpu[1-4]') -> [Host]; unknown names are an error.
    `built_in`: {alias: a callable that builds that Host}, called only for an alias `spec` names."""
    from .nodeset import expand  # late: ClusterShell loads only when hosts are selected

    built_in = built_in or {}
    names = expand(spec)
    unknown = [n for n in names if n not in hosts and n not in built_in]
    if unknown:
        known = ", ".join(sorted({*hosts, *built_in}))
        raise ConfigError(f"--host {show(spec)}: unknown host alias {show(unknown[0])}; known: {known}; "
                          f"{source_words()}")
    built = {n: built_in[n]() for n in dict.fromkeys(names) if n not in hosts}
    return [hosts[n] if n in hosts else built[n] for n in names]
