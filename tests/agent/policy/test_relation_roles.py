"""What a related process is (scripts/agent/policy/relation.py): its role by its executable and
the shell's form, from one list of shells (policy/builtin.py) for every reader."""
from __future__ import annotations

import subprocess

from scripts.agent.policy import relation, shellcode
from scripts.agent.procs import procscan
from tests.support.procs import wait_for


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


def test_the_stop_of_a_manager_another_user_runs_is_printed_to_run_as_that_user(second_user):
    """A second user's process calling itself supervisord, with root's config path in its argv:
    every word of the stop is theirs, so it is printed to run as them (`runuser -u USER --`):
    run literally by root it reaches only what that user's own daemon controls."""
    from scripts.agent.policy import managers
    from scripts.agent.procs import procfs

    daemon = second_user.popen(["sleep", "30"])
    try:
        wait_for(lambda: (procfs.uids(daemon.pid) or [0])[1] == second_user.uid, "the second user's process")
        record = {"pid": daemon.pid, "argv": ["supervisord", "-c", "/etc/supervisor/supervisord.conf"]}
        out = managers._result("supervisord", "all", ["supervisorctl", "-c", "/etc/supervisor/supervisord.conf",
                                                      "stop", "all"], "note", record, record)
        assert not out["trusted"] and not out["stops_by_default"]
        assert out["stop_command"] == (f"runuser -u {second_user.name} -- "
                                       "supervisorctl -c /etc/supervisor/supervisord.conf stop all")
    finally:
        daemon.kill()
        daemon.wait()
