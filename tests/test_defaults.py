"""One definition of a teardown's waits (scripts/agent/contract.py), and everything that shows
or uses them agrees: the agent's flags, the local tasks' defaults and --help, the Ansible task
and the module's documented options, the shell one-liner."""
from __future__ import annotations

import argparse
import ast
import inspect
from pathlib import Path

import yaml  # ansible-core's own dependency (requirements-dev.txt)

from scripts.agent import contract
from scripts.agent.teardown import run as teardown
from scripts.config import defaults
from scripts.emergency import shell_teardown
from scripts.engines import ansible_task


def _agent_defaults() -> dict:
    parser = argparse.ArgumentParser()
    teardown.add_arguments(parser)
    return {a.dest: a.default for a in parser._actions}


def test_the_agent_and_the_local_side_read_the_contracts_numbers():
    agent = _agent_defaults()
    assert (agent["grace"], agent["timeout"]) == (contract.GRACE_S, contract.TIMEOUT_S)
    assert agent["settle"] is None and teardown.SETTLE_S == contract.SETTLE_S  # not given: the agent's rule
    assert (defaults.GRACE_S, defaults.TIMEOUT_S, defaults.SETTLE_S) == (contract.GRACE_S, contract.TIMEOUT_S,
                                                                        contract.SETTLE_S)
    assert defaults.ONELINER_GRACE_S == contract.GRACE_S
    assert inspect.signature(shell_teardown.argv).parameters["grace_s"].default == contract.GRACE_S


def test_the_ansible_task_and_the_module_document_the_same_defaults():
    assert (ansible_task.DEFAULTS["grace"], ansible_task.DEFAULTS["timeout"]) == (contract.GRACE_S,
                                                                                   contract.TIMEOUT_S)
    assert ansible_task.DEFAULTS["settle"] is None
    module = Path(__file__).resolve().parent.parent / "ansible" / "library" / "gpu_pivot.py"
    doc = next(n.value.value for n in ast.parse(module.read_text()).body
               if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "DOCUMENTATION")
    options = yaml.safe_load(doc)["options"]
    assert (options["grace"]["default"], options["timeout"]["default"]) == (contract.GRACE_S, contract.TIMEOUT_S)
    assert "default" not in options["settle"] and f"default {contract.SETTLE_S:g}" in options["settle"]["description"]
