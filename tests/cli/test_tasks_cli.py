"""The invoke CLI as users meet it: --list, --help, `run` byte for byte, exit codes; what
loading the tasks imports; teardown and pivot passing the same teardown flags to the agent."""
import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from functools import cache
from pathlib import Path

import pytest

from scripts.agent.state import lastrun
from scripts.agent.teardown import hostlock
from tests.conftest import REPO, invoke
from tests.support import scenario
from tests.support.procs import ProcessSet, wait_for
from tests.support.task_help import HELP_GROUP, help_of, task_names

TASKS = ["hosts", "ping", "run", "oneliner", "sandbox"]


def test_list_names_every_task():
    out = invoke("--list")
    assert out.returncode == 0
    for name in TASKS:
        assert f"  {name} " in out.stdout.decode()


@HELP_GROUP
@pytest.mark.parametrize("name", TASKS)
def test_help_explains(name):
    out = help_of(name)
    assert out.returncode == 0
    text = out.stdout.decode()
    assert "Docstring:" in text and len(text.split("Docstring:")[1].strip()) > 20


@HELP_GROUP
def test_every_flag_of_every_task_is_explained():
    """help={} per flag: an option line of `invoke --help TASK` without words after it is a flag
    a person has to guess at."""
    names = task_names()
    assert "teardown" in names and "lint-launch" in names
    for name in names:
        text = help_of(name).stdout.decode()
        options = text.split("Options:", 1)[1].splitlines() if "Options:" in text else []
        bare = [line for line in options if re.match(r"^  -\S", line) and len(re.split(r"\s{2,}", line.strip())) < 2]
        assert not bare, f"{name}: flags without help: {bare}"


@pytest.fixture
def gpu1(sshd, hosts_env):
    hosts_env(sshd.hosts_env("gpu1") + sshd.hosts_env("gpu2", ctid="129"))


@pytest.mark.parametrize("host", ["local", "gpu1", "gpu2"])
def test_run_passes_bytes_and_exit_code(gpu1, host):
    script = "printf 'out\\0\\377\\n'; printf 'err \\001\\n' >&2; exit 7"
    out = invoke("run", "--host", host, "--", "sh", "-c", script)
    assert out.returncode == 7
    assert out.stdout == b"out\x00\xff\n"
    assert out.stderr == b"err \x01\n"


def test_remote_exit_255_is_not_unreachable(gpu1):
    out = invoke("run", "--host", "gpu1", "--", "sh", "-c", "exit 255")
    assert out.returncode == 255
    assert b"unreachable" not in out.stderr


def test_unreachable_host_exit3(hosts_env):
    hosts_env("GPU9_SSH=nobody@127.0.0.1\nGPU9_SSH_OPTS='-p 1 -o ConnectTimeout=3 -o ControlPath=none'\n")
    out = invoke("run", "--host", "gpu9", "--", "true")
    assert out.returncode == 3
    assert b"gpu9: host unreachable" in out.stderr


def test_several_hosts_worst_exit(gpu1):
    out = invoke("run", "--host", "local,gpu1", "--", "sh", "-c", "echo hi; exit 3")
    assert out.returncode == 3
    assert out.stdout.decode().count("hi") == 2
    assert "===== gpu1 =====" in out.stdout.decode()


def test_oneliner_prints_route(gpu1):
    out = invoke("oneliner", "--host", "gpu2", "--", "echo", "it's")
    line = out.stdout.decode().strip()
    assert line.endswith("""'pct exec 129 -- echo '"'"'it'"'"'"'"'"'"'"'"'s'"'"''""")
    assert out.returncode == 0


def test_run_without_command_is_bad_input():
    out = invoke("run", "--host", "local")
    assert out.returncode == 2
    assert b"needs a command after `--`" in out.stderr


@pytest.mark.parametrize("argv", [
    ["run", "--host", "local", "version", "--", "sh", "-c", "echo RAN >> {mark}"],  # run first, then a refusal
    ["version", "run", "--host", "local", "--", "sh", "-c", "echo RAN >> {mark}"],
])
def test_a_second_task_is_refused_before_the_first_runs(tmp_path, argv):
    """Exit 2 means nothing ran: a command line naming two tasks used to run the first one
    (here a command on the host) before the second refused its flags."""
    mark = tmp_path / "ran"
    out = invoke(*[a.format(mark=mark) for a in argv])
    assert out.returncode == 2, out
    assert not mark.exists(), "the first task ran"
    lines = out.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and "one task per command line, got 2" in lines[0] and "nothing ran" in lines[0], lines
    assert out.stdout == b""


@pytest.mark.parametrize("name", ["invoke.yaml", "invoke.yml"])
def test_a_project_config_read_before_ours_is_refused(tmp_path, name):
    """Invoke reads one project file beside tasks.py, invoke.yaml and invoke.yml before
    invoke.json: one of them would silently turn the one-task refusal off,
    so the tasks refuse to load instead. A copy of the project, with the file beside it."""
    project = tmp_path / "checkout"
    project.mkdir()
    for f in ("tasks.py", "invoke.json"):
        (project / f).write_bytes((REPO / f).read_bytes())
    (project / "scripts").symlink_to(REPO / "scripts")
    (project / name).write_text("run: {echo: false}\n")
    mark = tmp_path / "ran"
    out = invoke("--search-root", str(project), "run", "--host", "local", "version", "--", "sh", "-c",
                 f"echo RAN >> {mark}")
    assert out.returncode == 2, out
    assert not mark.exists(), "a task ran"
    lines = out.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and f"{project / name}: Invoke reads it instead of invoke.json" in lines[0], lines
    (project / name).unlink()  # the same copy without it: the refusal of two tasks is back
    out = invoke("--search-root", str(project), "run", "--host", "local", "version", "--", "sh", "-c",
                 f"echo RAN >> {mark}")
    assert out.returncode == 2 and "one task per command line" in out.stderr.decode() and not mark.exists(), out


# -- start-up: loading the tasks imports none of what they use --------------------------------------


def test_loading_the_tasks_imports_no_transport_config_or_sandbox():
    """`invoke --list` / `--help` load tasks.py; only the task that runs imports the transport,
    hosts.env parsing (dotenv, ClusterShell), the sandbox or the pivot."""
    code = ("import sys, tasks; print('\\n'.join(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('scripts', 'ClusterShell', 'dotenv'))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    loaded = set(out.stdout.split())
    others = {m for m in loaded if not m.startswith("scripts.cli.")}
    # the task modules and their defaults (a teardown's waits are the wire's: scripts/agent/wire/defaults.py)
    assert others == {"scripts", "scripts.cli", "scripts.config", "scripts.config.defaults", "scripts.agent",
                      "scripts.agent.wire", "scripts.agent.wire.defaults"}, loaded
    assert {"scripts.cli.flags", "scripts.cli.common", "scripts.cli.gpu"} <= loaded


# -- teardown and pivot: one set of teardown flags, passed the same way to the agent ----------------

TEARDOWN_FLAGS = ["--grace", "1.5", "--timeout", "7", "--wait-lock", "3", "--max-used-mib", "12", "--settle", "0.25"]


@pytest.fixture
def ps(tmp_path):
    procs = ProcessSet(tmp_path / "procs")
    yield procs
    procs.kill_all()


@pytest.fixture
def spied_local(ps, hosts_env, tmp_path):
    """The local host, scoped to the test's own (empty) process set, whose `python` is a
    wrapper that writes the agent's argv to a file and then execs the real interpreter;
    a phase `x` whose gate fails, so a pivot stops (exit 5) right after its teardown."""
    calls = tmp_path / "calls"
    calls.mkdir()
    spy = tmp_path / "spy-python"
    spy.write_text(f'#!/bin/sh\nprintf "%s\\0" "$@" > {calls}/$$\nexec {sys.executable} "$@"\n')
    spy.chmod(0o755)
    hosts_env(scenario.env_lines(ps) + f"LOCAL_PYTHON={spy}\nLOCAL_PHASE_X_CMD='true'\n"
              "LOCAL_PHASE_X_GATES='[\"false\"]'\n")

    def teardown_argvs() -> list:
        """Each agent `teardown` argv since the last call, from its subcommand on."""
        found = []
        for f in sorted(calls.iterdir()):
            argv = f.read_bytes().split(b"\0")[:-1]
            f.unlink()
            at = argv.index(b"-") + 1 if b"-" in argv else len(argv)  # the subcommand follows `-` (stdin)
            if argv[at:at + 1] == [b"teardown"]:
                found.append([a.decode() for a in argv[at:]])
        return found

    return teardown_argvs


def _flag_values(argv: list) -> dict:
    return {flag: argv[argv.index(flag) + 1] for flag in TEARDOWN_FLAGS[::2]}


def test_pivot_passes_the_teardown_flags_as_teardown_does(spied_local):
    out = invoke("teardown", "--host", "local", "--yes", *TEARDOWN_FLAGS)
    assert out.returncode == 0, out.stdout.decode() + out.stderr.decode()
    [by_teardown] = spied_local()
    out = invoke("pivot", "--host", "local", "--to", "x", "--yes", *TEARDOWN_FLAGS)
    text = out.stdout.decode() + out.stderr.decode()
    assert out.returncode == 5, text  # the teardown ran, then the gate `false` failed
    assert "FAIL false" in text and "nothing started" in text
    [by_pivot] = spied_local()
    expected = {"--grace": "1.5", "--timeout": "7.0", "--wait-lock": "3.0", "--max-used-mib": "12", "--settle": "0.25"}
    assert _flag_values(by_pivot) == expected
    assert _flag_values(by_teardown) == expected
    drop_marker = lambda argv: [a for i, a in enumerate(argv) if "--marker" not in argv[i - 1:i + 1]]  # noqa: E731
    hold = by_pivot.index("--hold-s")  # the pivot's own: its lock kept until the phase is ready
    assert by_pivot[hold::2][:3] == ["--hold-s", "--hold-phase", "--hold-token"] and by_pivot[hold + 3] == "x"
    by_pivot = by_pivot[:hold] + by_pivot[hold + 6:]
    assert drop_marker(by_pivot) == drop_marker(by_teardown)  # one builder: the same argv, flag for flag
    assert json.loads(Path(lastrun.last_path()).read_text())["settle_s"] == 0.25  # the agent used it


def _lock_waiter() -> bool:
    """A teardown agent with --wait-lock runs (alice holds the lock: it can only be waiting)."""
    return any("--wait-lock" in a["cmdline"] for a in hostlock.teardown_agents())


def test_pivot_wait_lock_waits_for_the_lock(spied_local):
    fd = hostlock.acquire("alice@ops")
    try:
        out = invoke("pivot", "--host", "local", "--to", "x", "--yes")
        assert out.returncode == 4, out.stdout.decode() + out.stderr.decode()
        assert b"alice@ops" in out.stdout + out.stderr
        proc = subprocess.Popen([sys.executable, "-m", "invoke", "pivot", "--host", "local", "--to", "x", "--yes",
                                 "--wait-lock", "20"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        wait_for(lambda: _lock_waiter() or proc.poll() is not None, "the pivot's teardown to wait on the lock",
                 timeout=60)
        assert proc.poll() is None, proc.communicate()[0].decode()  # still waiting for alice's lock
    finally:
        hostlock.release(fd)
    text = proc.communicate(timeout=60)[0].decode()
    assert proc.returncode == 5, text  # got the lock, tore down, then the gate failed
    assert "teardown: freed" in text


@pytest.mark.parametrize("task", [["teardown"], ["pivot", "--to", "x"]])
def test_off_a_terminal_without_yes_nothing_is_signalled(spied_local, task):
    out = invoke(*task, "--host", "local", input=b"")
    assert out.returncode == 2
    assert out.stderr.decode().startswith("gpu-pivot: not on a terminal and no --yes: refusing to signal anything")
    assert spied_local() == []  # no teardown reached the host


@pytest.mark.parametrize("flag,value", [("--settle", "soon"), ("--wait-lock", "-1"), ("--max-used-mib", "1.5")])
def test_pivot_bad_teardown_flag_is_one_line_exit2(spied_local, flag, value):
    out = invoke("pivot", "--host", "local", "--to", "x", "--yes", flag, value)
    assert out.returncode == 2
    lines = out.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"gpu-pivot: {flag} {value!r}:"), lines
    assert spied_local() == []


# -- flags: one meaning per short flag, -h is help, --json where a task reports ---------------------


@cache
def options(name: str) -> list:
    """[(short or None, long)] from `invoke NAME -h`."""
    text = help_of(name).stdout.decode()
    found = []
    for line in text.split("Options:", 1)[1].splitlines() if "Options:" in text else []:
        m = re.match(r"^  (?:-(\w)(?: \S+)?, )?--([a-z][a-z0-9-]*)", line)
        if m:
            found.append((m[1], m[2]))
    return found


@HELP_GROUP
def test_every_task_takes_h_as_help():
    """`-h` is help everywhere (--host is -H, as in Fabric): Invoke gave -h to --host before."""
    for name in task_names():
        out = help_of(name)
        assert out.returncode == 0 and b"Usage:" in out.stdout, (name, out.stdout[:200], out.stderr)


@HELP_GROUP
def test_a_short_flag_means_one_thing_in_every_task():
    meaning: dict = {}
    for name in task_names():
        for short, long in options(name):
            if short:
                meaning.setdefault(short, set()).add(long)
    assert meaning.get("H") == {"host"}
    assert "h" not in meaning
    clashes = {short: longs for short, longs in meaning.items() if len(longs) > 1}
    assert not clashes, clashes


def test_every_task_takes_its_short_flags_from_one_table():
    """A task module must use scripts.cli.flags.task (not invoke.task): Invoke's own short flags
    would give each task its own meanings again."""
    from scripts.cli import flags

    code = "import tasks; print(' '.join(sorted(n for n, t in tasks.ns.tasks.items() if type(t).__name__ != 'Task' "
    code += "or type(t).__module__ != 'scripts.cli.flags')))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.split() == [], f"tasks not made with scripts.cli.flags.task: {out.stdout}"
    assert len(set(flags.SHORT.values())) == len(flags.SHORT)


REPORTING = ["hosts", "ping", "status", "verify", "plan", "teardown", "start", "stop", "logs", "lint-launch",
             "pivot", "audit", "sandbox", "version"]


@pytest.mark.parametrize("name", REPORTING)
def test_every_reporting_task_has_json(name):
    text = invoke(name, "--help").stdout.decode()
    assert re.search(r"^\s+(?:-\w, )?--json\b|\[--json\]", text, re.M), text  # an option, not a mention


def test_hosts_json_writes_lists_where_lists_belong(hosts_env):
    hosts_env((REPO / "hosts.env.example").read_text())
    doc = json.loads(invoke("hosts", "--json").stdout)
    by_alias = {h["alias"]: h for h in doc}
    assert by_alias["local"]["phases"] == [] and by_alias["gpu1pct"]["phases"] == ["deploy", "train"]
    names = invoke("hosts", "--names").stdout.decode().split()
    assert names == list(by_alias)


def test_errors_name_the_flag_or_variable_the_user_gave(hosts_env):
    hosts_env("LOCAL_PHASE_X_CMD='true'\n")
    out = invoke("pivot", "-H", "local", "--to", "nosuch", "--yes")
    assert out.returncode == 2 and out.stderr.decode().startswith("gpu-pivot: --to 'nosuch': "), out.stderr
    out = invoke("start", "-H", "local", "--phase", "nosuch")
    assert out.stderr.decode().startswith("gpu-pivot: --phase 'nosuch': "), out.stderr
    from_env = dict(os.environ, GPU_PIVOT_HOST="gpu9")
    out = invoke("status", env=from_env)
    assert out.returncode == 2 and out.stderr.decode().startswith("gpu-pivot: GPU_PIVOT_HOST='gpu9': unknown host")
    out = invoke("status", "-H", "gpu8", env=from_env)
    assert out.stderr.decode().startswith("gpu-pivot: --host 'gpu8': unknown host"), out.stderr
    out = invoke("start", "--phase", "x", env=dict(os.environ, GPU_PIVOT_HOST="local,sandbox"))
    assert out.stderr.decode().startswith("gpu-pivot: GPU_PIVOT_HOST='local,sandbox': this task takes exactly one")


def test_version_is_the_projects():
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    out = invoke("version")
    assert out.returncode == 0 and out.stdout.decode().startswith(f"gpu-pivot {version} (invoke ")
    assert json.loads(invoke("version", "--json").stdout)["gpu-pivot"] == version


def test_bash_completes_host_aliases_tasks_and_flags(hosts_env, tmp_path):
    """scripts/completion.bash, sourced in a real bash, run from another directory."""
    hosts_env("GPU7_SSH=root@192.0.2.7\nGPU8_SSH=root@192.0.2.8\n")

    def complete(*words: str) -> list:
        script = (f"source {REPO}/scripts/completion.bash; COMP_WORDS=({' '.join(map(shlex.quote, words))}); "
                  "COMP_CWORD=$((${#COMP_WORDS[@]} - 1)); _gpu_pivot_complete; printf '%s\\n' \"${COMPREPLY[@]}\"")
        out = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=60)
        return out.stdout.split()

    assert complete("invoke", "status", "--host", "gpu") == ["gpu7", "gpu8"]
    assert complete("invoke", "teardown", "-H", "") == ["local", "sandbox", "gpu7", "gpu8"]
    assert complete("invoke", "status", "--host", "=", "s") == ["sandbox"]
    assert complete("invoke", "tear") == ["teardown"]
    assert "--host" in complete("invoke", "teardown", "--h")
