"""Which processes are targets and which are protected, and why.

Why names and not text: killing by command line and by device file killed monitors and
nvidia-persistenced along with the server. Protection looks at every name a process goes
by (program.names: comm, which is 15 chars: 'nvidia-persiste', argv[0]'s basename, and for
interpreters the script or `-m` module: nvitop and gpustat are Python programs); target
patterns name programs the same way (program.match).
"""
import os
import re

from . import contract, program

# Each names a PROGRAM (see program.py): matched whole against its module, script,
# executable or process title - never against the arguments of another program.
DEFAULT_TARGETS = (
    r"sglang\.launch_server",
    r"sglang serve",
    r"sglang::.*",
    r"vllm serve",
    r"vllm\.entrypoints",
    r"VLLM::.*",
    r"torchrun",
)

# The protect list lives in the contract: the shell one-liner is generated from the same list.
PROTECTED_NAMES = contract.PROTECTED_NAMES
_EXPORTER = re.compile(r"(%s)$" % "|".join(re.escape(x) for x in contract.PROTECTED_SUFFIXES))


def names_of(proc):
    """Every name the process goes by, for the protect list."""
    names = {name for name, _ in program.names(proc) if " " not in name}
    names.add(proc.get("comm") or "")
    argv = proc.get("argv") or []
    if argv and os.path.basename(argv[0]).startswith("sshd:"):
        names.add("sshd")
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
    if contract.agent_call(proc.get("argv") or []):  # e.g. another operator's scan: it holds NVML handles
        return "another gpu-pivot agent"
    for pattern in extra_protect:
        if re.search(pattern, cmdline):
            return "host protect pattern %s" % pattern  # as written: a repr would double each backslash
    return None


def target_reason(proc, patterns):
    """Why this process is a target in words ("runs module sglang.launch_server"), or None."""
    hit = program.match(proc, patterns)
    if hit is None:
        return None
    pattern, why = hit
    return "%s (target pattern %s)" % (why, pattern)  # as written, not repr-escaped
