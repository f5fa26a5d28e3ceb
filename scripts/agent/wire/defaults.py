"""The defaults both sides read: a teardown's waits, what counts as free, the device glob,
the time format and the longest waits. The agent's flags, the local tasks' defaults and --help
(scripts/config/defaults.py), the Ansible task and the shell one-liner read these; the Ansible
module's documented defaults are checked against them (tests/agent/wire/test_defaults.py).
Imports nothing: loading the tasks for `invoke --list` reads it and no more."""
GRACE_S = 30.0    # between SIGTERM and SIGKILL
TIMEOUT_S = 60.0  # for the GPUs to be free after that
SETTLE_S = 2.0    # the respawn watch once they are (when something could restart a target)
WAIT_LOCK_S = 0.0  # another teardown's lock: 0 fails at once (exit 4)
VERIFY_WAIT_S = 0.0  # verify: poll this long for free GPUs (0: look once)
PROBE_MIB, MAX_PROBE_MIB, PROBE_DEADLINE_S = 64, 65536, 60.0  # verify --probe: buffer MiB, its cap, deadline s
MAX_USED_MIB = 0  # a GPU is free at or under this many MiB used (NVML v2, reserved memory excluded)

DEVICE_GLOB = "/dev/nvidia*"          # the GPU device files, when a host names none
TIME_FORMAT = "%Y-%m-%dT%H:%M:%S%z"  # audit records, last.json, pivot records: ISO 8601 with offset
MAX_WAIT_S = 3600  # the longest wait either side accepts: a typo must not hold a host's lock for days
MPS_QUIT_TIMEOUT_S = 10.0  # `teardown --mps quit`: every daemon's quit together (mps.py); the caller waits more
RESET_TIMEOUT_S = 120  # `nvidia-smi --gpu-reset` may take this long on the host (reset.py); the caller waits more
GATE_TIMEOUT_S = 600.0  # each command gate of a phase (phases/gates.py); the caller waits this per gate
SMOKE_TIMEOUT_S = 60.0  # a phase's smoke request (phases/run.py); the caller waits this more
STOP_TIMEOUT_S = 30.0  # a phase's stop: SIGTERM to SIGKILL, when its spec names none (phases/run.py)
