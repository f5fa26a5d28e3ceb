"""How a call ended: the exit codes both sides and the docs follow, and the keys a result
carries instead of a record when the agent did not run its subcommand."""

EXIT_OK = 0
EXIT_NOT_FREE = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
EXIT_LOCKED = 4
EXIT_GATE = 5
EXIT_UNINSPECTED = 6
EXIT_TIMED_OUT = 7     # no answer in time: ssh's connect or keep-alive timeout, or the call's deadline
EXIT_DECLINED = 8      # the operator answered no at the confirmation: nothing was done
EXIT_UNHEALTHY = 9     # free, but a GPU's health verdict says drain, reset or reboot (agent/gpu/health.py)
EXIT_OUTPUT = 10       # stdout could not be written (disk full, I/O error): the task's own code is on stderr
EXIT_STARTER_ALIVE = 11  # GPUs free now, a related starter lives (agent/policy/relation.py)
EXIT_REBOOT_NEEDED = 12  # reset --quiesce: the reset failed with nothing blocking it (teardown/quiesce.py)
EXIT_INTRUDER = 13     # a pivot: a process outside the new phase opened a GPU after the teardown (named)
EXIT_INTERRUPTED = 130
EXIT_CLOSED_PIPE = 141  # 128 + SIGPIPE, as a shell reports a program its reader left: Invoke's own output
EXIT_FAILED = EXIT_NOT_FREE  # the same 1, for subcommands not about free GPUs: not started, not ready, not stopped

# (code, name, meaning): the one table the docs, the task docstrings and both sides follow.
EXIT_CODES = (
    (EXIT_OK, "ok", "done"),
    (EXIT_STARTER_ALIVE, "starter-alive", "teardown: GPUs free now, but a related starter lives (named): not yet free"),
    (EXIT_NOT_FREE, "not-free", "done but not free (or not ready, rolled back, a prep job failed)"),
    (EXIT_USAGE, "usage", "bad input: one line names the bad value; nothing ran"),
    (EXIT_UNREACHABLE, "unreachable", "host unreachable or login refused, agent failed there, or state dir unusable"),
    (EXIT_LOCKED, "locked", "another teardown holds the host's lock"),
    (EXIT_GATE, "gate-failed", "a pivot's drain, gate, launch lint or GPU setting blocked it: nothing started"),
    (EXIT_UNINSPECTED, "uninspected", "not every process could be inspected (run as root): never called free"),
    (EXIT_TIMED_OUT, "timed-out", "the host did not answer in time (ssh connect or keep-alive timeout, or the "
                                  "call's --timeout); other hosts of a fleet still finish"),
    (EXIT_DECLINED, "declined", "the confirmation was answered no: nothing was signalled or started"),
    (EXIT_UNHEALTHY, "unhealthy", "free, but a GPU's health verdict is not ready, drain, reset or reboot needed"),
    (EXIT_REBOOT_NEEDED, "reboot-needed", "reset --quiesce: the reset failed with its blockers stopped: reboot"),
    (EXIT_OUTPUT, "output-failed", "stdout could not be written (disk full, I/O error); the task ran to its end "
                                   "and its own exit code is named on stderr"),
    (EXIT_INTRUDER, "intruder", "pivot: a process outside the new phase opened a GPU before it was ready (named)"),
    (EXIT_INTERRUPTED, "interrupted", "Ctrl-C on the local side; the host side continues"),
    (EXIT_CLOSED_PIPE, "closed-pipe", "the reader closed the pipe of Invoke's own --list, --help or --version"),
)


def worst(codes):
    """The worst of several hosts' codes, by number, but 11 (the middle verdict) just above 0."""
    return max(codes, key=lambda c: 0.5 if c == EXIT_STARTER_ALIVE else c, default=EXIT_OK)


def exit_name(code):
    """'locked' for 4; 'exit N' for a code outside the table (e.g. a remote command's own)."""
    for number, name, _ in EXIT_CODES:
        if number == code:
            return name
    return "exit %s" % code


# Every result is one JSON object with "command" and "exit_code", or one of these instead:
USAGE_ERROR = "usage_error"  # {"usage_error": TEXT}: a bad flag (exit 2), nothing ran
AGENT_ERROR = "agent_error"  # {"agent_error": "IndexError: ... at program.py:72 in names"}: the agent failed (exit 3)


class UsageError(ValueError):
    """Bad input to the agent: one line naming the value ({USAGE_ERROR: TEXT}), exit 2, nothing done (cli.py)."""
