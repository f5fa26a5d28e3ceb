"""gpu-pivot tasks: free the GPUs of a host, prove it, start the next phase.

The tasks live in scripts/cli/, a few per module; this file only names them, all at the
root of the namespace (`invoke teardown`, `invoke lint-launch`). Each task checks its flags,
calls scripts/ and prints through the views; it imports what it uses when it runs, so
`invoke --list` and `invoke --help TASK` stay fast.

Exit codes (scripts/agent/wire/codes.py, EXIT_CODES): 0 ok / GPUs free; 1 done but not free; 2 bad input
(nothing ran); 3 host unreachable, agent failed, or its state dir unusable; 4 host locked
by another teardown; 5 a pivot's drain, gate or launch lint blocked it (nothing started);
6 not every process could be inspected (run as root); 7 the host timed out (ssh connect or
keep-alive timeout, or the call's deadline: `--timeout`); 8 the confirmation was answered
no (nothing signalled); 9 freed, but a GPU's health verdict is drain / reset needed / reboot needed
(verify, teardown; "unknown" never changes a code); 10 stdout could not be written (a full
disk, an I/O error: the task ran to its end, its own code named on stderr); 126/127 `run` of
a command not executable / not found, 128+N `run` of a command killed by signal N; 130
interrupted by Ctrl-C (the host side continues); 141 the reader closed the pipe of Invoke's
own --list, --help or --version (a task's reader closing it changes nothing: the task runs to
its end and exits with its own code). A command line Invoke's parser cannot read (unknown task
or flag, a flag missing its value) exits 2 with one line on stderr, a typo's nearest task or
flag included ("did you mean teardown?"), before any task runs (scripts/cli/parse_errors.py;
the core flags' own by output_guard). One task per command line:
a second one is refused (exit 2) before the first runs (scripts/cli/executor.py, named by
invoke.json beside this file).
Hosts come from $GPU_PIVOT_HOSTS_FILE, else hosts.env beside this file, else ./hosts.env
(see hosts.env.example); `local` and `sandbox` are built in.
"""
import os

from invoke import Collection

from scripts.cli import about, audit, executor, gpu, hosts, output_guard, phases, program, reset, sandbox, slurm

output_guard.install()  # Invoke's own --list and --help: a closed pipe exits 141, a full disk 10 (also by .pth)
program.install()  # a command line Invoke cannot read exits 2 (usage); TASK --help lists its exit codes
executor.check_project_config(os.path.dirname(os.path.abspath(__file__)))

ns = Collection(
    hosts.hosts, hosts.ping, hosts.run, hosts.oneliner,
    sandbox.sandbox,
    gpu.status, gpu.verify, gpu.plan, gpu.teardown, reset.reset,
    phases.start, phases.stop, phases.logs, phases.lint_launch, phases.pivot,
    audit.audit, about.version,
    slurm.undrain,
)
