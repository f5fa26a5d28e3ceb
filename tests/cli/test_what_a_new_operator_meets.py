"""What a new operator meets in the first hour, and an operator at 3 a.m.: README to runbook
without a snag. The commands the README prints run as printed, errors are one line (one JSON
document with --json), host-key and connection failures say which, tables fit the terminal
without cutting what identifies a process, and a wait shows what it waits for. The runbooks
that run as printed are in tests/emergency/test_runbooks.py; `make bench`'s mechanics in
tests/test_bench_mechanics.py.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from scripts.agent.wire import codes
from tests.conftest import REPO, checkout_copy, invoke, sandbox_session
from tests.support import scenario
from tests.support.procs import wait_for


def text_of(res) -> str:
    return (res.stdout + res.stderr).decode(errors="replace")


# -- GPU_PIVOT_SANDBOX_DIR must be absolute ------------------------------------------------------

def test_relative_sandbox_dir_is_refused_with_one_line(tmp_path):
    """A relative GPU_PIVOT_SANDBOX_DIR is refused: it would make the sandbox inside the checkout."""
    env = dict(os.environ, GPU_PIVOT_SANDBOX_DIR="sb-relative")
    for args in (["sandbox", "up"], ["status", "--host", "sandbox"], ["hosts"]):
        res = subprocess.run([sys.executable, "-m", "invoke", "--search-root", str(REPO), *args], cwd=tmp_path,
                             env=env, capture_output=True, timeout=60)
        assert res.returncode == codes.EXIT_USAGE, (args, text_of(res))
        lines = res.stderr.decode().splitlines()
        assert len(lines) == 1 and "GPU_PIVOT_SANDBOX_DIR='sb-relative': must be an absolute path" in lines[0], lines
        assert res.stdout == b""
    assert list(tmp_path.iterdir()) == []  # nothing made where the task ran
    assert not (REPO / "sb-relative").exists()


# -- status during a running teardown: "running", never "exit None" --------------------------------

def test_last_teardown_line_running_has_no_exit_code():
    from scripts.views import status as status_view

    running = status_view.last_teardown(SimpleNamespace(last_teardown={
        "state": "running", "started": "2026-01-01T10:00:00+0000", "operator": "ana@laptop", "exit_code": None}))
    assert "running" in running and "exit" not in running and "None" not in running
    interrupted = status_view.last_teardown(SimpleNamespace(last_teardown={
        "state": "interrupted", "verdict": "the agent stopped", "exit_code": None, "started": "t0"}))
    assert "None" not in interrupted and "interrupted" in interrupted
    done = status_view.last_teardown(SimpleNamespace(last_teardown={
        "state": "done", "verdict": "freed", "exit_code": 0, "finished": "t1", "operator": "ana@laptop"}))
    assert "exit 0" in done and "by ana@laptop at t1" in done
    unread = status_view.last_teardown(SimpleNamespace(last_teardown={  # a state dir the agent could not read
        "state": "unreadable state directory /x/run: cannot create it", "exit_code": None}))
    assert "None" not in unread and unread.rstrip().endswith("cannot create it"), unread


def test_status_during_a_running_teardown_says_running(ps, hosts_env):
    """End to end: a teardown waiting out the grace of a server that ignores SIGTERM."""
    server, workers = ps.server("--ignore-term")
    hosts_env(scenario.env_lines(ps, "local").replace(scenario.target_pattern(ps), r"sandbox_roles\.py"))
    teardown = subprocess.Popen([sys.executable, "-m", "invoke", "teardown", "--host", "local", "--yes", "--grace",
                                 "60"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        def running():
            doc = json.loads(invoke("status", "--host", "local", "--json").stdout)["local"]
            return (doc.get("last_teardown") or {}).get("state") == "running"

        wait_for(running, "the teardown's running record", timeout=60)
        res = invoke("status", "--host", "local")
        line = next(x for x in res.stdout.decode().splitlines() if x.startswith("Last teardown"))
        assert "running" in line and "None" not in line and "exit" not in line, line
    finally:
        ps.kill_all()  # the server goes; the teardown then ends on its own
        teardown.communicate(timeout=120)


# -- host keys: their own line; a master per connection, options included -------------------

def _wrong_known_hosts(sshd, path):
    """A known_hosts that holds a key for the sshd's [host]:port, but not the sshd's key."""
    from tests.support.loopback_sshd import _keygen

    key = path.parent / "not-the-host-key"
    _keygen(key)
    kind, blob = (path.parent / "not-the-host-key.pub").read_text().split()[:2]
    path.write_text(f"[127.0.0.1]:{sshd.port} {kind} {blob}\n")
    return path


def _exit_master(sshd, opts: str) -> None:
    from scripts.reach.ssh import control_path

    subprocess.run(["ssh", *opts.split(), "-o", f"ControlPath={control_path(sshd.dest(), opts.split())}", "-O", "exit",
                    sshd.dest()], capture_output=True, timeout=30)


def test_host_key_mismatch_gets_its_own_line_naming_file_and_host(sshd, hosts_env, tmp_path, monkeypatch):
    """A changed host key is its own error, never "host unreachable"."""
    monkeypatch.setenv("GPU_PIVOT_CONTROL_DIR", str(tmp_path / "cm"))
    bad = _wrong_known_hosts(sshd, tmp_path / "known_hosts_old")
    hosts_env(f"GPU7_SSH={sshd.dest()}\nGPU7_SSH_OPTS='{sshd.ssh_opts.replace(str(sshd.known_hosts), str(bad))}'\n")
    res = invoke("ping", "--host", "gpu7")
    assert res.returncode == codes.EXIT_UNREACHABLE, text_of(res)
    lines = res.stderr.decode().splitlines()
    assert len(lines) == 1, lines
    line = lines[0]
    assert line.startswith("gpu-pivot: gpu7: host key verification failed for [127.0.0.1]:%d" % sshd.port), line
    assert f"{bad} (line 1)" in line and "unreachable" not in line and "@@@" not in line
    assert f"ssh-keygen -f {bad} -R '[127.0.0.1]:{sshd.port}'" in line
    doc = json.loads(invoke("status", "--host", "gpu7", "--json").stdout)
    assert doc["gpu7"]["exit_code"] == codes.EXIT_UNREACHABLE
    assert doc["gpu7"]["error"].startswith("gpu7: host key verification failed")
    # a host no key is known for: the known_hosts file named is the one its options give
    empty = tmp_path / "known_hosts_empty"
    empty.write_text("")
    hosts_env(f"GPU7_SSH={sshd.dest()}\nGPU7_SSH_OPTS='{sshd.ssh_opts.replace(str(sshd.known_hosts), str(empty))}'\n")
    res = invoke("ping", "--host", "gpu7")
    assert res.returncode == codes.EXIT_UNREACHABLE, text_of(res)
    assert f"host key verification failed for [127.0.0.1]:{sshd.port}: no key" in res.stderr.decode()
    assert f"is known in {empty};" in res.stderr.decode()


def test_aliases_with_different_options_never_share_a_master(sshd, hosts_env, tmp_path, monkeypatch):
    """gpu2 reaches the same user@host:port as gpu1 with its own UserKnownHostsFile,
    which does not hold the host's key; it rode on gpu1's master and was never checked."""
    monkeypatch.setenv("GPU_PIVOT_CONTROL_DIR", str(tmp_path / "cm"))
    bad = _wrong_known_hosts(sshd, tmp_path / "known_hosts_gpu2")
    opts2 = sshd.ssh_opts.replace(str(sshd.known_hosts), str(bad))
    hosts_env(f"GPU1_SSH={sshd.dest()}\nGPU1_SSH_OPTS='{sshd.ssh_opts}'\n"
              f"GPU2_SSH={sshd.dest()}\nGPU2_SSH_OPTS='{opts2}'\n")
    try:
        before = sshd.connections()
        assert invoke("ping", "--host", "gpu1").returncode == 0  # gpu1's master now runs (ControlPersist)
        assert sshd.connections() - before == 1
        res = invoke("ping", "--host", "gpu2")
        assert res.returncode == codes.EXIT_UNREACHABLE, text_of(res)
        assert "gpu2: host key verification failed" in res.stderr.decode()
        assert invoke("ping", "--host", "gpu1").returncode == 0
        assert sshd.connections() - before == 1  # gpu1 still rides on its own master
        from scripts.reach.ssh import control_dir

        sockets = sorted(p.name for p in control_dir().iterdir() if p.is_socket())
        assert len(sockets) == 1, sockets  # gpu1's: gpu2 never got one
    finally:
        _exit_master(sshd, sshd.ssh_opts)


# -- --json keeps its promise: every error is one JSON document on stdout ---------------------------

JSON_ERRORS = [
    ["status", "--host", "nosuch", "--json"],
    ["status", "--host", "gpu[", "--json"],
    ["verify", "--wait", "abc", "--json"],
    ["plan", "--match", "", "--json"],
    ["teardown", "--host", "nosuch", "--json"],
    ["teardown", "--grace", "x", "--json"],
    ["teardown", "--json"],  # not on a terminal and no --yes
    ["teardown", "--yes", "--mps", "x", "--json"],
    ["ping", "--timeout", "x", "--json"],
    ["start", "--phase", "nosuch", "--json"],
    ["stop", "--phase", "nosuch", "--json"],
    ["logs", "--json"],
    ["lint-launch", "--json"],
    ["pivot", "--to", "nosuch", "--json"],
    ["reset", "--gpu", "x", "--json"],
    ["sandbox", "nosuch", "--json"],
    ["audit", "--lines", "x", "--json"],
    ["status", "--json", "--", "foo"],  # words after `--` (refused before the task body)
    ["status", "--json", "verify"],  # two tasks (refused by the executor)
]


@pytest.mark.parametrize("args", JSON_ERRORS, ids=lambda a: " ".join(a) or "''")
def test_json_errors_are_one_document_on_stdout(args):
    res = invoke(*args)
    assert res.returncode == codes.EXIT_USAGE, text_of(res)
    doc = json.loads(res.stdout)  # the whole of stdout is one document
    assert set(doc) == {"error", "exit_code"} and doc["exit_code"] == codes.EXIT_USAGE, doc
    line = res.stderr.decode().strip()
    assert line == f"gpu-pivot: {doc['error']}"  # the same words as the one line on stderr


def test_json_error_for_a_bad_hosts_env_and_the_environment_host(hosts_env):
    hosts_env("GPU1_SSH=root@127.0.0.1\nGPU1_CTID=abc\n")
    res = invoke("status", "--host", "gpu1", "--json")
    assert res.returncode == codes.EXIT_USAGE
    assert "GPU1_CTID" in json.loads(res.stdout)["error"]
    env = {k: v for k, v in os.environ.items() if k != "GPU_PIVOT_HOSTS_FILE"}
    res = invoke("status", "--json", env=dict(env, GPU_PIVOT_HOST="nosuch"))
    assert res.returncode == codes.EXIT_USAGE
    assert json.loads(res.stdout)["error"].startswith("GPU_PIVOT_HOST='nosuch': unknown host alias")


def test_without_json_errors_stay_off_stdout():
    res = invoke("status", "--host", "nosuch")
    assert res.returncode == codes.EXIT_USAGE and res.stdout == b""


def test_invokes_own_parser_errors_are_the_documented_exception():
    """Invoke reads the command line before any task runs: its errors are bad input (exit 2)
    but no task's, so stdout stays empty even with --json. docs/tasks.md says so; this pins it."""
    res = invoke("status", "--json", "--hots", "x")
    assert res.returncode == 2 and res.stdout == b"" and b"has no flag '--hots'" in res.stderr
    readme = (REPO / "docs" / "tasks.md").read_text()
    assert "The one exception is Invoke's own" in readme and "did you mean" in readme


# -- screens: a PPID column, audit hosts whole, tables that fit 60 columns ---------------------

@pytest.fixture(scope="module")
def sandbox():
    yield from sandbox_session()


def _columns(n: int) -> dict:
    return dict({k: v for k, v in os.environ.items() if k != "NO_COLOR"}, COLUMNS=str(n))


def test_holder_table_has_a_ppid_column(sandbox):
    """The runbook sends people looking for orphans by PPID: the table shows it, not only --json."""
    text = invoke("status", "--host", "sandbox", env=_columns(100)).stdout.decode()
    header = next(line for line in text.splitlines() if line.split()[:2] == ["pid", "ppid"])
    assert header.split()[:3] == ["pid", "ppid", "user"], header
    procs = sandbox["processes"]
    for worker in ("worker0", "worker1"):
        row = next(line for line in text.splitlines() if line.split()[:1] == [str(procs[worker]["pid"])])
        assert row.split()[1] == str(procs["server"]["pid"]), row  # its parent, the server


@pytest.mark.parametrize("args", [["status"], ["plan"], ["verify", "--wait", "0"], ["hosts"], ["audit"],
                                  ["sandbox", "status"], ["teardown", "--dry-run"]], ids=" ".join)
def test_tables_fit_60_columns_and_keep_pids_whole(sandbox, args):
    """At COLUMNS=60 the holder table fits (it was 77 wide). Command lines give way (cut, or on a
    line of their own under the row); pids never do."""
    res = invoke(*args, env=_columns(60))
    text = res.stdout.decode()
    assert res.returncode in (0, 1), text_of(res)
    in_tables = [line for line in text.splitlines() if not line.startswith(("== ", "audit log: ", "SANDBOX ("))]
    too_wide = [line for line in in_tables if len(line) > 60 and " " in line.strip()]  # a path alone: never cut
    assert not too_wide, "\n".join(too_wide)
    if args[0] in ("status", "plan", "teardown"):
        for role in ("server", "worker0", "worker1"):
            pid = str(sandbox["processes"][role]["pid"])
            assert any(line.split()[:1] == [pid] for line in text.splitlines()), (role, text)
        assert "sglang.launch_server" in text and "sglang::scheduler_TP0" in text


def test_table_gives_way_in_order_and_never_cuts_identifying_columns():
    from scripts.views.render import Col, Command, table

    rows = [[4194301, 4194300, "a-long-user-name", "D", Command(["python3", "-m", "sglang.launch_server",
                                                                   "--model-path", "/models/kimi-k2.5", "--tp", "8"])]]
    heads = ["pid", "ppid", "user", "state", Col("command", "command", 30)]
    wide = table(heads, rows, "  ", columns=120).splitlines()
    assert len(wide) == 3 and "--model-path /models/kimi-k2.5" in wide[2]  # one line per process when it fits
    narrow = table(heads, rows, "  ", columns=60).splitlines()
    assert all(len(line) <= 60 for line in narrow), narrow
    assert narrow[3].split() == ["4194301", "4194300", "a-long-user-name", "D"]  # identifying columns whole
    assert narrow[4].strip().startswith("sglang.launch_server --")  # the command under its row
    assert narrow[1].strip() == "command"  # and its header under the header line
    # headers wider than their cells wrap at their spaces before anything is cut
    two = table(["gpu", "used before", "used after", "procs before", "procs after"], [[0, 20480, 0, 1, 0]], "",
                columns=40).splitlines()
    assert all(len(line) <= 40 for line in two) and two[1].split() == ["gpu", "before", "after", "before", "after"]


def test_audit_table_shows_host_names_whole(tmp_path):
    """The audit table shows host names whole, never `san...`."""
    from scripts.agent.wire import defaults

    state = tmp_path / "xdg"
    (state / "gpu-pivot").mkdir(parents=True, mode=0o700)
    rec = {"time": time.strftime(defaults.TIME_FORMAT), "alias": "gpu-node-17-sandbox", "operator": "ana@laptop",
           "signal": "SIGTERM", "pid": 4194301, "result": "sent", "cmdline": "python3 -m sglang.launch_server --tp 8"}
    (state / "gpu-pivot" / "audit.jsonl").write_text(json.dumps(rec) + "\n")
    (state / "gpu-pivot" / "audit.jsonl").chmod(0o600)
    for columns in (60, 80, 120):
        res = invoke("audit", env=dict(_columns(columns), XDG_STATE_HOME=str(state)))
        assert res.returncode == 0, text_of(res)
        lines = res.stdout.decode().splitlines()
        assert all(len(line) <= columns for line in lines if " " in line.strip()), lines  # a path alone: whole
        assert any("gpu-node-17-sandbox" in line and "4194301" in line for line in lines), lines


# -- verify --wait in a pipe: progress lines while it waits, then the verdict -------------------

def test_verify_wait_progress_in_a_pipe_counts_down_then_gives_the_verdict(sandbox):
    """In a pipe, `verify --wait` shows what it waits for as it waits: each line names the host,
    the time left (counting down, a line at most every 0.4 s of the wait's own clock, so a 50 ms
    poll is not a line each), the MiB still used and a holder by pid; the verdict comes after
    the last of them. The order and content are checked, never the wall clock between lines,
    which a busy machine stretches."""
    holders = {str(p["pid"]) for p in sandbox["processes"].values()}
    out = subprocess.run([sys.executable, "-m", "invoke", "verify", "--host", "sandbox", "--wait", "3"], cwd=REPO,
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=_columns(100), timeout=60)
    assert out.returncode == 1, out
    lines = out.stdout.decode().splitlines()
    waiting = [i for i, line in enumerate(lines) if line.startswith("sandbox: waiting")]
    assert len(waiting) >= 2, lines  # a wait of 3 s: the first scan and at least one after it
    assert waiting == list(range(len(waiting))), lines  # every progress line before the verdict
    assert any(line.startswith("NOT FREE") for line in lines[len(waiting):]), lines
    left = []
    for line in lines[:len(waiting)]:
        m = re.match(r"sandbox: waiting, (\d+\.\d)s left: (\d+) MiB used, held by pid (\d+) ", line)
        assert m and m.group(3) in holders, (line, holders)
        left.append(float(m.group(1)))
    assert left[0] <= 3.0 and all(b <= a - 0.3 for a, b in zip(left, left[1:], strict=False)), left


# -- the first commands: how the tool is run, what make demo leaves, the --host default ------

def _first_block() -> list:
    text = (REPO / "README.md").read_text()
    section = text.split("## First commands", 1)[1]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0]
    return [line.split(" #", 1)[0].strip() for line in block.splitlines() if line.strip()]


def test_readme_first_screen_says_how_the_tool_is_run():
    """After `make demo` the README says how `invoke` is run (it answered `bash: invoke: command not found`)."""
    first_screen = "\n".join((REPO / "README.md").read_text().splitlines()[:45])
    assert ". .venv/bin/activate" in first_screen and "invoke: command" in first_screen
    assert "Without `--host`" in first_screen and "`sandbox`" in first_screen  # the default host
    assert _first_block()[:4] == ["make demo", ". .venv/bin/activate", "invoke status", "invoke sandbox down"]
    # one way everywhere: bare `invoke` in an activated venv, never the path
    for path in [REPO / "README.md", *sorted((REPO / "runbooks").glob("*.md"))]:
        assert ".venv/bin/invoke" not in path.read_text(), path.name
    helptext = subprocess.run(["make", "-s", "help"], cwd=REPO, capture_output=True, text=True).stdout
    assert ". .venv/bin/activate" in helptext and "invoke --list" in helptext


def test_without_host_a_task_acts_on_the_sandbox():
    env = {k: v for k, v in os.environ.items() if k not in ("GPU_PIVOT_HOST", "GPU_PIVOT_HOSTS_FILE")}
    res = invoke("verify", "--wait", "0", env=env)
    assert res.stdout.decode().startswith("== sandbox ("), text_of(res)
    help_text = invoke("status", "--help", env=env).stdout.decode()
    assert "'sandbox'" in help_text


def test_readme_first_commands_run_as_printed_from_a_fresh_shell():
    """Items 1 and 2: the README's first block, as a newcomer types it, in a shell whose PATH
    does not hold the venv: `make demo` ends naming what it left running and the command that
    stops it; after `. .venv/bin/activate`, `invoke status` works; `invoke sandbox down` stops it."""
    if subprocess.run(["make", "-q", ".venv/.installed"], cwd=REPO, capture_output=True).returncode:
        pytest.skip("the venv is older than the requirements: `make demo` would run pip (run `make setup` first)")
    venv_bin = str(REPO / ".venv" / "bin")
    path = ":".join(p for p in os.environ["PATH"].split(":") if os.path.realpath(p) != os.path.realpath(venv_bin)
                    and not os.path.exists(os.path.join(p, "invoke")))
    env = dict({k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "GPU_PIVOT_HOST",
                                                                 "GPU_PIVOT_HOSTS_FILE")}, PATH=path)
    lines = [line for line in _first_block() if line != "make test"]  # the suite: this test is in it
    assert subprocess.run(["bash", "-c", "command -v invoke"], env=env, capture_output=True).returncode != 0
    script = "set -e\n" + "\n".join(f"echo '>>> {line}'\n{line}" for line in lines) + "\n"
    try:
        res = subprocess.run(["bash", "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        demo = res.stdout.split(">>> make demo", 1)[1].split(">>> . .venv/bin/activate", 1)[0]
        tail = demo.strip().splitlines()[-2:]
        assert tail[0].startswith("Still running") and "nvidia-persistenced (pid" in tail[0], tail
        assert "the nvitop monitor (pid" in tail[0] and "the unrelated job (pid" in tail[0], tail
        assert tail[1].startswith("Stop them with: invoke sandbox down"), tail
        status = res.stdout.split(">>> invoke status", 1)[1].split(">>>", 1)[0]
        assert status.startswith("\n== sandbox (") and "Holders" in status
        state = json.loads(invoke("sandbox", "status", "--json").stdout)
        assert state["alive"] == [], state  # `invoke sandbox down` stopped what the demo left
    finally:
        invoke("sandbox", "down")


# -- where the hosts came from, and the tasks from any folder ----------------------------------

def _clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if k != "GPU_PIVOT_HOSTS_FILE"}
    return dict(env, **extra)


def test_a_missing_hosts_env_is_named_with_where_it_was_looked_for(tmp_path):
    """A fresh clone without hosts.env: `--host lo1` says no hosts.env was found and where it
    was looked for (it read as a typo of the alias), and `invoke hosts` says the same under its
    table; with the file, `invoke hosts` names it."""
    clone = checkout_copy(tmp_path / "clone")
    res = subprocess.run([sys.executable, "-m", "invoke", "ping", "--host", "lo1"], cwd=clone, env=_clean_env(),
                         capture_output=True, timeout=120)
    assert res.returncode == codes.EXIT_USAGE, text_of(res)
    [line] = res.stderr.decode().splitlines()
    assert "unknown host alias 'lo1'" in line and "no hosts.env found" in line, line
    assert str(clone / "hosts.env") in line and "hosts.env.example" in line, line
    listed = subprocess.run([sys.executable, "-m", "invoke", "hosts"], cwd=clone, env=_clean_env(),
                            capture_output=True, timeout=120)
    assert listed.returncode == 0 and "no hosts.env found" in text_of(listed), text_of(listed)
    (clone / "hosts.env").write_text("LO1_SSH=root@127.0.0.1\n")
    listed = subprocess.run([sys.executable, "-m", "invoke", "hosts"], cwd=clone, env=_clean_env(),
                            capture_output=True, timeout=120)
    assert f"hosts from {clone / 'hosts.env'}" in text_of(listed).replace("\n  ", " "), text_of(listed)


def test_a_bad_value_in_hosts_env_names_its_file_and_line(hosts_env):
    """One bad value blocks every host, so it names FILE:LINE, as a syntax error does."""
    path = hosts_env("# gpu hosts\nGPU1_SSH=root@10.0.0.1\nGPU2_SSH=-oProxyCommand=x\n")
    res = invoke("hosts")
    assert res.returncode == codes.EXIT_USAGE, text_of(res)
    assert res.stderr.decode().splitlines() == [
        f"gpu-pivot: GPU2_SSH='-oProxyCommand=x': an ssh destination may not start with '-' (at {path}:3)"]


def test_the_tasks_run_from_any_folder_and_another_projects_tasks_stay_its_own(tmp_path):
    """Outside the checkout, `invoke TASK` (the venv's) runs gpu-pivot's tasks: it said only
    Invoke's "Can't find any collection named 'tasks'!", exit 1 ("done but not free"). A folder
    with a tasks.py of its own keeps it."""
    res = subprocess.run([sys.executable, "-m", "invoke", "hosts"], cwd=tmp_path, capture_output=True, timeout=120)
    assert res.returncode == 0, text_of(res)
    assert "sandbox" in res.stdout.decode() and "Can't find" not in text_of(res)
    other = tmp_path / "other"
    other.mkdir()
    (other / "tasks.py").write_text("from invoke import task\n\n\n@task\ndef hello(c):\n    print('other project')\n")
    res = subprocess.run([sys.executable, "-m", "invoke", "hello"], cwd=other, capture_output=True, timeout=120)
    assert res.returncode == 0 and res.stdout.decode().strip() == "other project", text_of(res)
