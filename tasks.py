"""gpu-pivot tasks: free the GPUs of a host, prove it, start the next phase.

The tasks live in scripts/cli/, a few per module; this file only names them, all at the
root of the namespace. Each task imports what it uses when it runs, so `invoke --list` and
`invoke --help TASK` stay fast.

Exit codes: one table, scripts/agent/wire/codes.py EXIT_CODES; `invoke TASK --help` lists
the ones that task can give (`@task(exit_codes=...)`); docs/verdicts-and-exit-codes.md
explains them. A command line Invoke's parser cannot read is bad input, one line with the
nearest name ("did you mean teardown?"), before any task runs (scripts/cli/parse_errors.py).
One task per command line (scripts/cli/executor.py, named by invoke.json beside this file).
Hosts: $GPU_PIVOT_HOSTS_FILE, else hosts.env beside this file, else ./hosts.env.
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


def main() -> None:
    """`gpu-pivot TASK ...` (the console script of `pip install .`): the same tasks, flags, help
    and exit codes as `invoke TASK ...` in the checkout, from any folder. Invoke reads its
    project file (invoke.json) only beside a collection it searched for, so its one setting,
    the executor, is given here."""
    program.Program(namespace=ns, name="gpu-pivot", binary="gpu-pivot", executor_class=executor.OneTaskExecutor).run()
