"""What a related process is (scripts/agent/procs/relation.py): its role by its executable and
the shell's form, from one list of shells (procs/policy.py) for every reader."""
from __future__ import annotations

import subprocess

from scripts.agent.procs import procscan, relation, shellcode


def test_every_shell_the_relation_knows_is_a_shell_to_the_form_reader_too():
    """An interactive fish, tcsh or mksh is someone's terminal, never "a shell running code"
    (one list of shells: a terminal the form reader did not know was taken for code, and code
    is the job's own, ended with the server)."""
    for name in ("bash", "fish", "tcsh", "mksh", "ksh93", "yash"):
        info = {"pid": 0, "argv": [name, "-i"], "comm": name}
        assert shellcode.shell_form(info) == ("terminal", None), name
        assert shellcode.shell_form(dict(info, argv=[name, "-c", "x"])) == ("inline", "x"), name


def test_a_root_owned_sleep_is_a_helper_and_a_python_is_a_starter():
    procs = [subprocess.Popen(argv) for argv in (["sleep", "30"], ["python3", "-c", "import time; time.sleep(30)"])]
    try:
        roles = [relation.role(procscan.basic(p.pid)) for p in procs]
        assert roles == ["helper", "starter"], roles
    finally:
        for p in procs:
            p.kill()
            p.wait()
