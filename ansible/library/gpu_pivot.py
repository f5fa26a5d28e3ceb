#!/usr/bin/python
"""Ansible module gpu_pivot: runs gpu-pivot's agent on the managed host (see DOCUMENTATION).

Why so thin: the agent (standard library only) comes from the controller with the call, fed
to the host's python on stdin as `invoke` does over ssh; the action plugin of the same name
(ansible/action_plugins/gpu_pivot.py) builds its argv and reads its result through the
contract (scripts/engines/ansible_task.py). This file only runs it where Ansible put it.
"""
from __future__ import annotations

import subprocess
import sys

from ansible.module_utils.basic import AnsibleModule  # type: ignore[import-untyped]

DOCUMENTATION = r"""
module: gpu_pivot
short_description: Free the GPUs of a host (gpu-pivot teardown + verify) or verify they are free
description:
  - C(state=free) plans, signals the targets (SIGTERM, then SIGKILL after C(grace)), and verifies
    every GPU free for a settle window; C(state=verified) only verifies.
  - Check mode shows the plan (targets, protected, MiB it would free) and signals nothing.
  - Sets the fact C(gpu_pivot) (targets, protected, freed_mib, verdict, problems); the host
    fails when its GPUs are not free.
  - Needs the action plugin of the same name (ansible/action_plugins); nothing is installed on the host.
options:
  state: {choices: [free, verified], default: free, description: teardown and verify, or verify only}
  devices: {type: str, default: /dev/nvidia*, description: glob of the GPU device files (hosts.env DEVICES)}
  fake_devices: {type: bool, default: false, description: the glob may name test files (hosts.env FAKE_DEVICES)}
  targets: {type: list, elements: str, description: patterns replacing the default targets (TARGETS)}
  match: {type: list, elements: str, description: patterns added to the default targets}
  protect: {type: list, elements: str, description: command lines never signalled (PROTECT)}
  scope: {type: str, description: target only command lines containing this text (SCOPE)}
  scope_uid: {type: int, description: target only processes of this uid}
  grace: {type: float, default: 30, description: seconds between SIGTERM and SIGKILL}
  timeout: {type: float, default: 60, description: seconds to wait for the GPUs to read free}
  settle: {type: float, description: seconds they must stay free (default 2, none when nothing could restart a target)}
  max_used_mib: {type: int, default: 0, description: a GPU counts as free at or under this}
  python: {type: str, description: interpreter for the agent (default the module's own)}
"""

OPTIONS = {
    "state": {"type": "str", "default": "free", "choices": ["free", "verified"]},
    "devices": {"type": "str"}, "fake_devices": {"type": "bool"}, "targets": {"type": "list", "elements": "str"},
    "match": {"type": "list", "elements": "str"}, "protect": {"type": "list", "elements": "str"},
    "scope": {"type": "str"}, "scope_uid": {"type": "int"}, "grace": {"type": "float"},
    "timeout": {"type": "float"}, "settle": {"type": "float"}, "max_used_mib": {"type": "int"},
    "python": {"type": "str"},
    # set by the action plugin: the agent's argv and source, and how long it may take
    "_agent_argv": {"type": "list", "elements": "str"}, "_agent_source": {"type": "str", "no_log": True},
    "_deadline_s": {"type": "float", "default": 120.0},
}


def main():
    module = AnsibleModule(argument_spec=OPTIONS, supports_check_mode=True)
    argv, source = module.params["_agent_argv"], module.params["_agent_source"]
    if not argv or not source:
        module.fail_json(msg="gpu_pivot needs its action plugin (ansible/action_plugins/gpu_pivot.py on "
                             "ANSIBLE_ACTION_PLUGINS, or run the playbook in ansible/)")
    # the host's own interpreter unless the task names one: argv[0] was only a placeholder
    argv = [module.params["python"] or sys.executable] + list(argv[1:])
    try:
        done = subprocess.run(argv, input=source.encode(), capture_output=True, timeout=module.params["_deadline_s"])
    except subprocess.TimeoutExpired:
        module.fail_json(msg="the agent did not finish within %ss" % module.params["_deadline_s"])
    except OSError as exc:
        module.fail_json(msg="could not start %s: %s" % (argv[0], exc))
    # plain data back: the action plugin decides changed/failed from the agent's result
    module.exit_json(changed=False, rc=done.returncode, agent_stdout=done.stdout.decode("utf-8", "replace"),
                     agent_stderr=done.stderr.decode("utf-8", "replace")[-4000:])


if __name__ == "__main__":
    main()
