"""Which processes are targets and which are protected, and why.

Why names and not just patterns: the seed's kill-by-command-line and kill-by-device-file steps killed
monitors and nvidia-persistenced along with the server. Protection looks at every name a
process goes by: comm (15 chars: 'nvidia-persiste'), argv[0]'s basename, and for
interpreters the script or `-m` module (nvitop and gpustat are Python programs).
"""
import os
import re

DEFAULT_TARGETS = (
    r"sglang\.launch_server",
    r"\bsglang serve\b",
    r"\bsglang::",
    r"\bvllm serve\b",
    r"\bvllm\.entrypoints\b",
    r"\bVLLM::",
    r"\btorchrun\b",
)

PROTECTED_NAMES = {
    "sshd": "ssh server",
    "nvidia-persistenced": "NVIDIA persistence daemon",
    "nvidia-persiste": "NVIDIA persistence daemon",
    "nv-hostengine": "DCGM host engine",
    "dcgm-exporter": "DCGM exporter",
    "nvidia-smi": "GPU monitor",
    "nvitop": "GPU monitor",
    "gpustat": "GPU monitor",
    "nvtop": "GPU monitor",
    "nvidia-dcgm": "DCGM",
    "pct": "Proxmox pct (route)",
    "lxc-attach": "Proxmox lxc-attach (route)",
    "systemd": "init/systemd",
}
_EXPORTER = re.compile(r"[-_]exporter$")
_INTERPRETERS = re.compile(r"^(python[0-9.]*|pypy[0-9.]*|perl|ruby|node|bash|sh|dash)$")
_AGENT = re.compile(r"^\S*python[0-9.]* - (ping|scan|verify|plan|teardown)\b.* --marker [0-9a-f]+")


def names_of(proc):
    """Every name the process goes by, for the protect list."""
    argv = proc.get("argv") or []
    names = {proc.get("comm") or ""}
    if argv:
        first = os.path.basename(argv[0])
        names.add(first.split(":")[0] if first.startswith("sshd:") else first)
        if _INTERPRETERS.match(first) and len(argv) > 1:
            rest = argv[1:]
            if rest[0] == "-m" and len(rest) > 1:
                names.add(rest[1])
            elif not rest[0].startswith("-"):
                names.add(os.path.basename(rest[0]))
    names.discard("")
    return names


def protect_reason(proc, self_chain, extra_protect=()):
    """Why this process must never be signalled, or None."""
    pid = proc["pid"]
    if pid == 1:
        return "PID 1"
    if pid in self_chain:
        return "gpu-pivot agent or its ancestor (ssh session / pct)" if pid != os.getpid() else "gpu-pivot agent"
    cmdline = proc.get("cmdline") or ""
    for name in sorted(names_of(proc)):
        if name in PROTECTED_NAMES:
            return "%s (%s)" % (PROTECTED_NAMES[name], name)
        if name.startswith("sshd"):
            return "ssh server (%s)" % name
        if _EXPORTER.search(name):
            return "metrics exporter (%s)" % name
    if _AGENT.match(cmdline):
        return "another gpu-pivot agent"
    for pattern in extra_protect:
        if re.search(pattern, cmdline):
            return "host protect pattern %r" % pattern
    return None


def target_reason(proc, patterns):
    """The target pattern this process's command line matches, or None."""
    cmdline = proc.get("cmdline") or ""
    for pattern in patterns:
        if re.search(pattern, cmdline):
            return "matches target pattern %r" % pattern
    return None
