#!/usr/bin/env python3
"""Ansible inventory script: the ssh hosts of gpu-pivot's hosts.env, with the same settings.

Why read hosts.env instead of a second list: one file says where each GPU host is and how to
reach it (destination, -p, -i, -o options, interpreter, devices, targets, protect, scope);
a copy in YAML would drift. `GPU_PIVOT_HOSTS_FILE` picks the file as for `invoke`.
Usage: ansible-playbook -i ansible/inventory/hosts_env.py ansible/free-gpus.yml
"""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from scripts.config import hosts  # noqa: E402  (the repo root is put on sys.path just above)
from scripts.config.errors import ConfigError  # noqa: E402
from scripts.engines import ansible_task  # noqa: E402  (the repo root is put on sys.path just above)


def main(argv):
    try:
        inv = ansible_task.inventory(hosts.load())
    except ConfigError as exc:
        print(f"hosts_env.py: {exc}", file=sys.stderr)
        return 2
    if len(argv) > 1 and argv[1] == "--host":
        print(json.dumps(inv["_meta"]["hostvars"].get(argv[2] if len(argv) > 2 else "", {})))
    else:
        print(json.dumps(inv, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
