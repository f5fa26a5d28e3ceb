"""Controller half of the gpu_pivot module: build the agent call, run the module, read the result.

Why an action plugin: the agent's source and argv are made from this repo on the controller
(scripts/engines/ansible_task.py), so the managed host needs nothing installed; the result is read
back through the same contract `invoke` uses, and check mode becomes the agent's `plan`.
"""
from __future__ import annotations

import sys
from pathlib import Path

from ansible.plugins.action import ActionBase  # type: ignore[import-untyped]

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from scripts.config.errors import ConfigError  # noqa: E402
from scripts.engines import ansible_task  # noqa: E402  (the repo root is put on sys.path just above)


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = True

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        check = bool(self._task.check_mode)
        try:
            call = ansible_task.agent_call(dict(self._task.args), check)
        except ConfigError as exc:
            result.update(failed=True, changed=False, msg=str(exc))
            return result
        args = dict(self._task.args, _agent_argv=[str(a) for a in call["argv"]],
                    _agent_source=ansible_task.agent_source(), _deadline_s=call["deadline_s"])
        ran = self._execute_module(module_name="gpu_pivot", module_args=args, task_vars=task_vars)
        if ran.get("failed"):
            result.update(failed=True, changed=False, msg=ran.get("msg", "the gpu_pivot module failed"))
            return result
        result.update(ansible_task.outcome(call, ran["rc"], ran["agent_stdout"], ran["agent_stderr"], check))
        return result
