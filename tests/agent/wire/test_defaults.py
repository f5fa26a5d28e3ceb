"""One definition of a teardown's waits and free threshold and of a phase's limits
(scripts/agent/wire/defaults.py), and everything that shows
or uses them agrees: the agent's flags, the local tasks' defaults and --help, the Ansible task
and the module's documented options, the shell one-liner."""
from __future__ import annotations

import argparse
import ast
import inspect
import subprocess

import yaml  # ansible-core's own dependency (requirements-dev.txt)

from scripts.agent.options import flags
from scripts.agent.teardown import run as teardown, verify
from scripts.agent.wire import defaults as shared, requests
from scripts.config import defaults
from scripts.config.phases import Phase
from scripts.emergency import runbook, shell_teardown
from scripts.engines import ansible_task, slurm_job
from tests.support.paths import REPO


def _agent_defaults() -> dict:
    parser = argparse.ArgumentParser()
    teardown.add_arguments(parser)
    return {a.dest: a.default for a in parser._actions}


def test_the_agent_and_the_local_side_read_the_contracts_numbers():
    agent = _agent_defaults()
    assert (agent["grace"], agent["timeout"]) == (shared.GRACE_S, shared.TIMEOUT_S)
    assert agent["settle"] is None and teardown.SETTLE_S == shared.SETTLE_S  # not given: the agent's rule
    assert (defaults.GRACE_S, defaults.TIMEOUT_S, defaults.SETTLE_S) == (shared.GRACE_S, shared.TIMEOUT_S,
                                                                        shared.SETTLE_S)
    assert defaults.ONELINER_GRACE_S == shared.GRACE_S
    params = inspect.signature(shell_teardown.argv).parameters
    assert (params["grace_s"].default, params["settle_s"].default) == (shared.GRACE_S, shared.SETTLE_S)


def test_the_ansible_task_and_the_module_document_the_same_defaults():
    assert (ansible_task.DEFAULTS["grace"], ansible_task.DEFAULTS["timeout"]) == (shared.GRACE_S,
                                                                                   shared.TIMEOUT_S)
    assert ansible_task.DEFAULTS["settle"] is None
    documented = _module_options()
    assert (documented["grace"]["default"], documented["timeout"]["default"]) == (shared.GRACE_S, shared.TIMEOUT_S)
    assert "default" not in documented["settle"]
    assert f"default {shared.SETTLE_S:g}" in documented["settle"]["description"]


def _module_options() -> dict:
    """The Ansible module's documented options (its DOCUMENTATION, read without Ansible)."""
    module = REPO / "ansible" / "library" / "gpu_pivot.py"
    doc = next(n.value.value for n in ast.parse(module.read_text()).body
               if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "DOCUMENTATION")
    return yaml.safe_load(doc)["options"]


def test_the_free_threshold_has_one_definition():
    agent = argparse.ArgumentParser()
    flags.add_threshold(agent)
    module_doc = _module_options()
    assert {agent.get_default("max_used_mib"), defaults.MAX_USED_MIB, ansible_task.DEFAULTS["max_used_mib"],
            slurm_job.Settings(host=None).max_used_mib, requests.Teardown().max_used_mib,
            module_doc["max_used_mib"]["default"]} == {shared.MAX_USED_MIB}


def test_the_shell_one_liner_takes_both_waits_from_the_contract(tmp_path):
    """The script has no default of its own: the one-liner passes GRACE and SETTLE, and the
    generated runbook carries the contract's numbers."""
    argv = shell_teardown.argv(runbook.DIRECT)
    assert argv[-2:] == [f"{shared.GRACE_S:g}", f"{shared.SETTLE_S:g}"]
    assert ":-" not in shell_teardown.SCRIPT.read_text().split("grace=", 1)[1].split("\n", 1)[0]
    calls = [line for line in runbook.render().splitlines() if "gpu-pivot-teardown" in line and "/dev/nvidia*" in line]
    # one line for both routes (P= names `pct exec CTID --` or nothing), its script on stdin
    assert len(calls) == 1 and calls[0].split(" <<", 1)[0].endswith(f" {shared.GRACE_S:g} {shared.SETTLE_S:g}'"), calls
    missing = subprocess.run(["sh", "-c", shell_teardown.script_text(), "gpu-pivot-teardown", str(tmp_path / "x*"),
                              "1"], capture_output=True, text=True, timeout=30)
    assert missing.returncode == 2 and "SETTLE_SECONDS" in missing.stderr


def test_a_phases_limits_are_the_contracts():
    phase = Phase(name="p", argv=("true",))
    assert phase.stop_timeout == shared.STOP_TIMEOUT_S
    spec = {"gates": ["true", "true"], "stop_timeout": 7}
    base = requests.BASE_DEADLINE_S
    assert requests.Gates(spec=spec).deadline_s() == base + 2 * shared.GATE_TIMEOUT_S
    assert requests.PhaseStop(spec=spec, operator="me").deadline_s() == base + 2 * 7
    assert requests.Smoke(spec=spec).deadline_s() == base + shared.SMOKE_TIMEOUT_S


def test_a_verify_and_a_lock_wait_have_one_definition():
    verify_flags = argparse.ArgumentParser()
    verify.add_arguments(verify_flags)
    assert verify_flags.get_default("wait") == defaults.VERIFY_WAIT_S == requests.Verify().wait == shared.VERIFY_WAIT_S
    assert _agent_defaults()["wait_lock"] == defaults.WAIT_LOCK_S == shared.WAIT_LOCK_S
