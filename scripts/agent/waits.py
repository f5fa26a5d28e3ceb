"""A teardown's waits and what counts as free, by default: the one definition both sides read.

The agent's flags (through contract.py), the local tasks' defaults and --help
(scripts/config/defaults.py), the Ansible task and the shell one-liner read these; the Ansible
module's documented defaults are checked against them (tests/test_defaults.py). A module of
its own that imports nothing: loading the tasks for `invoke --list` reads it and no more.
"""
GRACE_S = 30.0    # between SIGTERM and SIGKILL
TIMEOUT_S = 60.0  # for the GPUs to be free after that
SETTLE_S = 2.0    # the respawn watch once they are (when something could restart a target)
WAIT_LOCK_S = 0.0  # another teardown's lock: 0 fails at once (exit 4)
VERIFY_WAIT_S = 0.0  # verify: poll this long for free GPUs (0: look once)
MAX_USED_MIB = 0  # a GPU is free at or under this many MiB used (NVML v2, reserved memory excluded)
