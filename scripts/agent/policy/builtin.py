"""The built-in selection: what a teardown targets when a host names nothing, and the names
never signalled. Data only, no imports: the agent's rules (rules.py) apply it, and the shell
one-liner (scripts/emergency/shell_teardown.py) is generated from these same lists on the
local side, so both read the one copy here.
"""

# The target patterns when a host names none. Each names a PROGRAM (see program.py): matched
# whole against its module, script, executable or process title - never against the arguments
# of another program.
DEFAULT_TARGETS = (
    r"sglang\.launch_server",
    r"sglang serve",
    r"sglang::.*",
    r"vllm serve",
    r"vllm\.entrypoints",
    r"VLLM::.*",
    r"torchrun",
)

# Never signalled, by any of the names a process goes by (names_of); names ending in a suffix
# below are exporters.
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
    "nv-fabricmanager": "NVIDIA Fabric Manager (NVSwitch fabric)",
    "nvidia-fabricmanager": "NVIDIA Fabric Manager (NVSwitch fabric)",
    "Xorg": "X server (display GPU)",
    "Xwayland": "X server (display GPU)",
    "lxc-start": "LXC container monitor (lxc-start / [lxc monitor])",
    "lxc-monitord": "LXC monitor daemon",
    "nvidia-cuda-mps-control": "CUDA MPS control daemon",
    "nvidia-cuda-mps-server": "CUDA MPS server (its daemon quits it: teardown --mps quit)",
}
PROTECTED_SUFFIXES = ("-exporter", "_exporter")

# Programs a process tree is read through, by the basename of a root-owned executable (never a
# name a process takes): relation.py (who could start a target again), wrappers.py, shellcode.py.
SHELLS = ("bash", "sh", "dash", "zsh", "ksh", "ksh93", "mksh", "ash", "busybox", "fish", "tcsh", "csh", "yash")
# run one command and end with it, changing who or how it runs (sudo forks a monitor with use_pty)
LAUNCHERS = ("sudo", "su", "setpriv", "runuser", "doas", "setsid", "flock", "nohup", "env", "nice", "ionice",
             "taskset", "numactl", "chrt", "stdbuf", "timeout", "chpst", "setuidgid", "s6-setuidgid", "time",
             "prlimit", "unshare", "nsenter", "cgexec", "systemd-run", "uv", "unbuffer", "xvfb-run", "srun",
             "mpirun", "mpiexec", "orterun", "prterun")
INITS = ("docker-init", "tini", "tini-static", "dumb-init", "catatonit")
# start nothing by themselves: a terminal's or a container's infrastructure
INFRA = INITS + ("init", "systemd", "sshd", "sshd-session", "tmux", "tmux: server", "screen", "SCREEN", "conmon",
                 "containerd-shim", "containerd-shim-runc-v2", "runc", "crun", "login", "agetty", "mosh-server",
                 "dockerd", "containerd", "script", "dtach", "abduco", "gnome-terminal-server", "xterm", "konsole",
                 "cron", "crond", "atd", "slurmstepd", "slurmd")
LOG_FILTERS = ("tee", "logger", "cat", "ts", "rotatelogs", "multilog", "svlogd", "cronolog")
TIMERS = ("sleep",)  # a loop's timer: a watchdog that waits between its checks runs `sleep`
HELPERS = LOG_FILTERS + TIMERS + ("tail", "less", "more", "head", "wc", "nvidia-smi", "true", "false", "date")
