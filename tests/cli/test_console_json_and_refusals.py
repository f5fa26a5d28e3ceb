"""The console as a new user and an SRE meet it: --json that stays JSON
with a prompt and for a failed host, `logs --follow` against a dead host, a phase never
started and Ctrl-C, values shown as typed, `run`'s exit for a command killed by a signal,
completion with invoke typed by path, and the wording of refusals. Real processes, the real
CLI, a real loopback sshd; nothing is signalled that the test did not start."""
from __future__ import annotations

import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import time

import pytest

from scripts.agent.wire import codes
from tests.conftest import REPO, invoke
from tests.support import fleet_faults
from tests.support.procs import alive, wait_for

DEAD = "GPU9_SSH=nobody@127.0.0.1\nGPU9_SSH_OPTS='-p 1 -o ConnectTimeout=3 -o ControlPath=none'\n"


def local_env(ps, **phase) -> str:
    """hosts.env for `local` scoped to the test's fake GPU, with a phase SERVE (sleep)."""
    keys = {"ARGV": json.dumps(["sleep", "60"]), "READY": "alive", "LINT": "off"}
    keys.update(phase)
    return "\n".join([f"LOCAL_DEVICES='{ps.glob}'", "LOCAL_TARGETS='sandbox_roles\\.py'", "LOCAL_FAKE_DEVICES=yes",
                      f"LOCAL_SCOPE='{ps.base}'"] + [f"LOCAL_PHASE_SERVE_{k}='{v}'" for k, v in keys.items()]) + "\n"


def on_terminal(args: list, answer: bytes, timeout: float = 30) -> tuple[int, bytes, bytes]:
    """invoke with stdin and stderr on a terminal and stdout to a pipe (`-j > out.json`):
    answers the prompt with `answer`; returns (exit code, stdout, what the terminal showed)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "invoke", *args], cwd=REPO, stdin=slave, stderr=slave,
                            stdout=subprocess.PIPE, start_new_session=True)
    os.close(slave)
    shown, answered = b"", False
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    shown += os.read(master, 4096)
                except OSError:
                    break
            if not answered and b"[y/N]" in shown:
                os.write(master, answer)
                answered = True
        if not answered:  # no prompt on the terminal: it went elsewhere (stdout)
            os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        os.close(master)
    assert answered, shown.decode(errors="replace")
    return proc.returncode, out, shown


# -- --json with the confirmation prompt ---------------------------------------------------------

def test_json_teardown_on_a_terminal_keeps_stdout_json(ps, hosts_env):
    holder = ps.role("hold")
    hosts_env(local_env(ps))
    code, out, shown = on_terminal(["teardown", "-H", "local", "-g", "1", "-s", "0", "-j"], b"y\n")
    assert code == 0, (out, shown)
    doc = json.loads(out)  # the plan and the prompt went to the terminal (stderr), not here
    assert set(doc) == {"local"} and doc["local"]["verdict"]
    assert b"[y/N]" in shown and b"[y/N]" not in out
    wait_for(lambda: not alive(holder), "the approved target to be gone", timeout=10)


def test_json_teardown_declined_prints_its_record(ps, hosts_env):
    holder = ps.role("hold")
    hosts_env(local_env(ps))
    code, out, shown = on_terminal(["teardown", "-H", "local", "-j"], b"n\n")
    assert code == codes.EXIT_DECLINED, shown
    assert json.loads(out) == {"local": {"error": "declined: nothing was signalled",
                                         "exit_code": codes.EXIT_DECLINED}}
    assert alive(holder)


def test_json_pivot_declined_prints_its_record(ps, hosts_env):
    holder = ps.role("hold")
    hosts_env(local_env(ps))
    code, out, shown = on_terminal(["pivot", "-H", "local", "--to", "serve", "--no-drain", "-j"], b"n\n")
    assert code == codes.EXIT_DECLINED, shown
    doc = json.loads(out)
    assert doc["exit_code"] == codes.EXIT_DECLINED and doc["verdict"].startswith("declined")
    assert doc["to"] == "serve" and doc["steps"] == []
    assert alive(holder)


# -- logs --follow -------------------------------------------------------------------------------

def test_follow_a_phase_never_started_is_one_line_not_a_raw_frame(ps, hosts_env):
    hosts_env(local_env(ps))
    # its own run dir: the session's is shared, and another test's phase "serve" may be recorded there
    env = dict(os.environ, GPU_PIVOT_RUN_DIR=str(ps.base / "run"))
    out = invoke("logs", "-H", "local", "-p", "serve", "-f", env=env, timeout=60)
    assert out.returncode == codes.EXIT_NOT_FREE, out
    assert b"gpu-pivot-result" not in out.stdout + out.stderr
    lines = out.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and "local:" in lines[0] and "never started" in lines[0], lines


def test_follow_against_a_tarpit_times_out_with_one_line(sshd, hosts_env):
    pit = fleet_faults.Tarpit()
    try:
        hosts_env(f"GPU1_SSH={sshd.dest()}\nGPU1_SSH_OPTS='-p {pit.port} -o ConnectTimeout=2 "
                  f"-o UserKnownHostsFile={sshd.known_hosts} -o StrictHostKeyChecking=yes'\n"
                  "GPU1_PHASE_SERVE_ARGV='[\"sleep\", \"60\"]'\n")
        out = invoke("logs", "-H", "gpu1", "-p", "serve", "-f", timeout=60)
    finally:
        pit.close()
    err = out.stderr.decode()
    assert out.returncode == codes.EXIT_TIMED_OUT, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1 and "gpu1: host timed out" in err, err


def test_follow_streams_and_ctrl_c_is_130_then_stop_twice_says_so(ps, hosts_env):
    hosts_env(local_env(ps, ARGV=json.dumps(["sh", "-c", "echo line-from-the-phase; exec sleep 60"])))
    assert invoke("start", "-H", "local", "-p", "serve").returncode == 0
    try:
        proc = subprocess.Popen([sys.executable, "-m", "invoke", "logs", "-H", "local", "-p", "serve", "-f"],
                                cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        try:
            assert proc.stdout is not None
            first = proc.stdout.readline()  # the log's line, streamed
            os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C: the whole foreground group
            rest, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        assert b"line-from-the-phase" in first + rest
        assert proc.returncode == 130, err
        lines = err.decode().strip().splitlines()
        assert len(lines) == 1 and "interrupted" in lines[0], lines
    finally:
        first_stop = invoke("stop", "-H", "local", "-p", "serve")
    assert first_stop.returncode == 0 and b"stopped [" in first_stop.stdout, first_stop
    again = invoke("stop", "-H", "local", "-p", "serve")
    assert again.returncode == 0, again
    assert b"stopped []" not in again.stdout and b"nothing to stop" in again.stdout, again.stdout


# -- a terminal of 0 columns ---------------------------------------------------------------------

def test_a_terminal_reporting_0_columns_is_unknown_width():
    master, slave = pty.openpty()  # a new pty reports 0 rows, 0 columns (serial consoles, `script`)
    try:
        env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
        proc = subprocess.run([sys.executable, "-c", "import os, sys; from scripts.views.render import width; "
                               "os.write(2, b'%d %d' % (os.get_terminal_size(1).columns, width()))"],
                              cwd=REPO, stdout=slave, stderr=subprocess.PIPE, env=env, timeout=30)
    finally:
        os.close(slave)
        os.close(master)
    assert proc.stderr.decode() == "0 100"


# -- values as typed; where the host came from --------------------------------------------

def test_bad_pattern_is_shown_as_typed(hosts_env):
    hosts_env("")
    out = invoke("plan", "-H", "local", "--match", "sglang\\.x(")
    err = out.stderr.decode()
    assert out.returncode == 2 and "'sglang\\.x('" in err and "\\\\" not in err, err


def test_bad_ssh_option_is_shown_as_typed(hosts_env):
    hosts_env("GPU9_SSH=nobody@127.0.0.1\nGPU9_SSH_OPTS='-o ProxyCommand=touch\\ /tmp/pwn'\n")
    out = invoke("ping", "-H", "gpu9")
    err = out.stderr.decode()
    assert out.returncode == 2 and "ProxyCommand=touch\\ /tmp/pwn" in err and "\\\\" not in err, err


def test_empty_gpu_pivot_host_names_the_variable(hosts_env):
    hosts_env("")
    out = invoke("status", env=dict(os.environ, GPU_PIVOT_HOST=""))
    err = out.stderr.decode()
    assert out.returncode == 2 and "GPU_PIVOT_HOST" in err and "--host" not in err.split(":")[1], err


# -- --json for a failed host --------------------------------------------------------------------

@pytest.mark.parametrize("args", [
    ["status"], ["verify"], ["plan"], ["teardown", "-y"], ["reset", "--gpu", "0"], ["start", "-p", "serve"],
    ["stop", "-p", "serve"], ["logs", "-p", "serve"], ["lint-launch", "-j", "--", "python3", "x.py"],
])
def test_json_for_an_unreachable_host_is_its_error_and_code(hosts_env, args):
    hosts_env(DEAD + "GPU9_PHASE_SERVE_ARGV='[\"sleep\", \"60\"]'\n")
    argv = [args[0], "-H", "gpu9"] + ([] if "-j" in args else ["-j"]) + args[1:]
    out = invoke(*argv, timeout=60)
    assert out.returncode == codes.EXIT_UNREACHABLE, out
    doc = json.loads(out.stdout)
    assert set(doc) == {"gpu9"} and doc["gpu9"]["exit_code"] == codes.EXIT_UNREACHABLE
    assert "gpu9: host unreachable" in doc["gpu9"]["error"]


def test_json_ping_lists_a_failed_host_too(hosts_env):
    hosts_env(DEAD)
    out = invoke("ping", "-H", "local,gpu9", "-j", timeout=60)
    assert out.returncode == codes.EXIT_UNREACHABLE, out
    docs = {d["host"]: d for d in json.loads(out.stdout)}
    assert set(docs) == {"local", "gpu9"} and docs["gpu9"]["exit_code"] == codes.EXIT_UNREACHABLE
    assert "error" not in docs["local"]


# -- run's exit for a signal death; -T 0 ----------------------------------------------------

@pytest.fixture
def gpu1(sshd, hosts_env):
    hosts_env(sshd.hosts_env("gpu1"))


@pytest.mark.parametrize("host", ["local", "gpu1"])
def test_run_of_a_command_killed_by_a_signal_is_128_plus_n(gpu1, host):
    out = invoke("run", "-H", host, "--", "sh", "-c", "kill -9 $$", timeout=60)
    assert out.returncode == 128 + signal.SIGKILL, out


def test_missing_command_over_ssh_names_the_host(gpu1):
    out = invoke("run", "-H", "gpu1", "--", "nosuchcmd-gpu-pivot", timeout=60)
    assert out.returncode == 127, out
    assert out.stderr.decode().strip() == "gpu-pivot: gpu1: nosuchcmd-gpu-pivot: command not found"


def test_ping_timeout_0_is_no_limit(hosts_env):
    hosts_env("")
    out = invoke("ping", "-H", "local", "-T", "0", timeout=60)
    assert out.returncode == 0, out
    assert "0: no limit" in invoke("ping", "--help").stdout.decode()


# -- completion with invoke typed by path -------------------------------------------------------

def test_completion_works_when_invoke_is_typed_by_path():
    invoke_path = os.path.join(os.path.dirname(sys.executable), "invoke")
    script = (f"source {REPO / 'scripts' / 'completion.bash'}; COMP_WORDS=({invoke_path} teardown --ho); "
              "COMP_CWORD=2; _gpu_pivot_complete; printf '%s\\n' \"${COMPREPLY[@]}\"")
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60, cwd="/")
    assert "--host" in out.stdout.split(), out


# -- what the docs promise ---------------------------------------------------------------------

def test_invokes_own_parse_errors_are_documented():
    out = invoke("teardown", "--hots", "sandbox")
    assert out.returncode == 2 and b"has no flag '--hots' (did you mean --host?)" in out.stderr
    readme = (REPO / "docs" / "verdicts-and-exit-codes.md").read_text()
    tasks_doc = (REPO / "tasks.py").read_text()
    assert "did you mean" in readme and "did you mean" in tasks_doc
    assert "128+N" in readme and "128+N" in invoke("run", "-h").stdout.decode()  # a command's own code, as run says


def test_the_docs_say_when_a_frozen_host_is_noticed():
    from scripts.reach import ssh

    readme = " ".join((REPO / "docs" / "hosts-env.md").read_text().split())
    total = ssh.ALIVE_INTERVAL_S * (ssh.ALIVE_COUNT + 1)
    assert f"within about {total} s" in readme
    assert f"{ssh.ALIVE_INTERVAL_S} × ({ssh.ALIVE_COUNT} + 1)" in readme
    assert "within 15 s" not in readme


# -- undrain's error, audit's bad line, wording -----------------------------------------

def test_undrain_failure_is_one_line(hosts_env):
    hosts_env("")
    out = invoke("undrain", "-H", "local", timeout=60)
    if out.returncode == codes.EXIT_UNREACHABLE:  # sinfo failed (no slurmctld here) or is missing
        assert len(out.stderr.decode().strip().splitlines()) == 1, out.stderr


def test_audit_skips_a_line_that_is_json_but_not_a_record(tmp_path):
    state = tmp_path / "state"
    (state / "gpu-pivot").mkdir(parents=True, mode=0o700)
    state.chmod(0o700)
    log = state / "gpu-pivot" / "audit.jsonl"
    log.write_text('[1,2]\n{"time": "2026-11-30T10:48:44+0100", "alias": "gpu1", "operator": "o@h", '
                   '"event": "pivot", "to": "serve", "verdict": "done"}\n"text"\n')
    log.chmod(0o600)
    out = invoke("audit", env=dict(os.environ, XDG_STATE_HOME=str(state), COLUMNS="80"))
    assert out.returncode == 0, out
    assert "Traceback" not in out.stderr.decode() and "2 line(s)" in out.stderr.decode()
    assert re.search(r"2026-11-30 09:48:44\s+gpu1", out.stdout.decode())  # in UTC
    assert all(len(line) <= 80 for line in out.stdout.decode().splitlines() if " " in line.strip())  # a path: whole


@pytest.mark.parametrize("args,says", [
    (["start", "-H", "local"], "--phase is required"),
    (["pivot", "-H", "local"], "--to is required"),
    (["pivot", "-H", "local", "--to", "serve", "--no-drain", "--drain", "http://127.0.0.1:1/metrics", "-n"],
     "--no-drain: pick one"),
    (["status", "-H", "local", "--", "foo"], "status: takes no words after `--` (got: foo)"),
])
def test_refusals_say_what_is_wrong(ps, hosts_env, args, says):
    hosts_env(local_env(ps))
    out = invoke(*args)
    assert out.returncode == 2, out
    assert says in out.stderr.decode()
