"""The gpu_pivot Ansible module run by real ansible-core: ansible/free-gpus.yml through the
hosts.env inventory, then a report play that writes each host's registered result to a file."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

from tests.support.paths import REPO

REPORT = """
- import_playbook: {playbook}
- name: Report
  hosts: localhost
  gather_facts: false
  tasks:
    - check_mode: false
      ansible.builtin.copy:
        dest: {out}
        content: >-
          {{% for h in groups['gpu_hosts'] %}}{{{{ '{{' if loop.first }}}}"{{{{ h }}}}":
          {{{{ hostvars[h].gpu_pivot | default(None) | to_json }}}}
          {{{{ ',' if not loop.last else '}}' }}}}{{% endfor %}}
"""

ANSIBLE_PLAYBOOK = shutil.which("ansible-playbook", path=os.path.dirname(sys.executable)) or "ansible-playbook"


def play(env, tmp_path, *extra: str) -> tuple:
    """(the ansible-playbook run, {host: its gpu_pivot result}) of free-gpus.yml with `extra` arguments."""
    out = tmp_path / "facts.json"
    if out.exists():
        out.unlink()
    book = tmp_path / "report.yml"
    book.write_text(REPORT.format(playbook=REPO / "ansible" / "free-gpus.yml", out=out))
    argv = [ANSIBLE_PLAYBOOK, "-i", str(REPO / "ansible" / "inventory" / "hosts_env.py"), str(book),
            "-e", "gpu_pivot_settle=0.3", "-e", "gpu_pivot_timeout=1", *extra]
    done = subprocess.run(argv, cwd=REPO / "ansible", env=env, capture_output=True, text=True, timeout=120)
    facts = json.loads(out.read_text()) if out.exists() else {}
    return done, facts
