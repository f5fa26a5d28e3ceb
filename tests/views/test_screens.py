"""The screens an operator reads at 3 a.m.: tables that fit the width and name each process by
what it runs, headers on every column, reasons in words, colour on a terminal only, what
`verify --wait` waits for, the teardown plan in `pivot --dry-run`, and a server's log not
reported as data a stop could lose. Run against the real SANDBOX host and real processes."""
from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import sys

import pytest

from scripts.views.render import Col, Command, table
from tests.conftest import REPO, invoke, sandbox_session
from tests.support import scenario


@pytest.fixture(scope="module")
def sandbox():
    yield from sandbox_session()


def env(**extra) -> dict:
    """The test's environment without NO_COLOR (unless given), plus `extra`."""
    e = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    e.update(extra)
    return e


def rules_have_headers(text: str) -> list:
    """Columns whose rule (----) has no header word above its first character."""
    bad, lines = [], text.splitlines()
    for n, line in enumerate(lines[1:], 1):
        if not re.fullmatch(r"\s*-+(\s+-+)+", line):
            continue
        above = lines[n - 1]
        for m in re.finditer(r"-+", line):
            if m.start() >= len(above) or above[m.start()] == " ":
                bad.append((above, m.start()))
    return bad


def row_of(text: str, pid: int) -> str:
    [line] = [line for line in text.splitlines() if line.split()[:1] == [str(pid)]]
    return line


@pytest.mark.parametrize("columns", [80, 100, 160])
def test_status_fits_columns_and_names_programs(sandbox, columns):
    out = invoke("status", "--host", "sandbox", env=env(COLUMNS=str(columns)))
    assert out.returncode == 0, out.stderr
    text = out.stdout.decode()
    too_wide = [line for line in text.splitlines() if len(line) > columns]
    assert not too_wide, too_wide
    server = row_of(text, sandbox["processes"]["server"]["pid"])
    # the program and its arguments, not the interpreter (at 80 columns, beside the ppid column,
    # the program and `...`)
    assert ("sglang.launch_server --" if columns > 80 else "sglang.launch_server") in server
    assert sys.executable not in text and "/bin/python" not in server
    if columns >= 100:  # key arguments kept when others are left out: the port, or the model path before it
        assert f"--port {sandbox['ports']['server']}" in server or "--model-path /" in server, server
    assert "sglang::scheduler_TP0" in row_of(text, sandbox["processes"]["worker0"]["pid"])
    assert not rules_have_headers(text)
    persistenced = row_of(text, sandbox["processes"]["persistenced"]["pid"])
    assert "PROTECTED" in persistenced and "nvidia-persistenced" in persistenced
    assert "protected: NVIDIA persistence daemon" in " ".join(text.split())  # why, in words (maybe wrapped)


def test_plan_reasons_in_words_regex_unescaped_and_whole(sandbox):
    text = invoke("plan", "--host", "sandbox", env=env(COLUMNS="100")).stdout.decode()
    assert "why: runs module sglang.launch_server (target pattern" in text
    joined = " ".join(text.split())  # the reason may wrap; it is never cut
    assert "why: runs module sglang.launch_server (target pattern sglang\\.launch_server)" in joined
    assert "\\\\" not in text and "..." not in joined.split("why: ")[1].split(")")[0]
    assert not rules_have_headers(text)
    assert all(len(line) <= 100 for line in text.splitlines())


def test_teardown_dry_run_and_pivot_dry_run_show_the_plan(sandbox):
    server = sandbox["processes"]["server"]["pid"]
    for argv in (["teardown", "-H", "sandbox", "-n"], ["pivot", "-H", "sandbox", "--to", "datagen", "-n"]):
        out = invoke(*argv, env=env(COLUMNS="100"))
        text = out.stdout.decode()
        assert out.returncode == 0, text + out.stderr.decode()
        assert "Targets (3;" in text and "sglang.launch_server" in row_of(text, server), text
        assert "Protected, never signalled" in text


def test_verify_wait_says_what_it_waits_for(sandbox):
    """Off a terminal: a line per progress report (at most twice a second), naming GPU memory
    still used and the holders by pid and program."""
    procs = sandbox["processes"]
    out = invoke("verify", "--host", "sandbox", "--wait", "1.5", env=env(COLUMNS="100"))
    assert out.returncode == 1
    waiting = [line for line in out.stdout.decode().splitlines() if line.startswith("sandbox: waiting")]
    assert 2 <= len(waiting) <= 6, waiting
    assert "40960 MiB used" in waiting[0]
    assert f"pid {procs['server']['pid']} sglang.launch_server" in waiting[0]
    assert "\r" not in out.stdout.decode() and all(len(line) <= 100 for line in waiting)


def run_in_pty(argv: list, extra_env: dict) -> str:
    """Run invoke with its stdout on a pseudo-terminal, as on an operator's screen."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "invoke", *argv], cwd=REPO, stdout=slave, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, env=env(**extra_env))
    os.close(slave)
    chunks = []
    while True:
        ready, _, _ = select.select([master], [], [], 60)
        if not ready:
            break
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(timeout=60)
    os.close(master)
    return b"".join(chunks).decode(errors="replace")


def test_colour_on_a_terminal_only_and_never_with_no_color(sandbox):
    on_tty = run_in_pty(["status", "--host", "sandbox"], {"COLUMNS": "100", "TERM": "xterm"})
    assert "\x1b[1;33mPROTECTED\x1b[0m" in on_tty
    assert not re.search("\x1b\\[[0-9;]*m(?!PROTECTED|\x1b)", on_tty.replace("\x1b[0m", ""))  # only those words
    no_color = run_in_pty(["status", "--host", "sandbox"], {"COLUMNS": "100", "TERM": "xterm", "NO_COLOR": "1"})
    assert "PROTECTED" in no_color and "\x1b[" not in no_color
    piped = invoke("status", "--host", "sandbox", env=env(TERM="xterm")).stdout.decode()
    assert "PROTECTED" in piped and "\x1b[" not in piped


def test_verify_wait_on_a_terminal_is_one_live_line(sandbox):
    text = run_in_pty(["verify", "--host", "sandbox", "--wait", "1.5"], {"COLUMNS": "100", "TERM": "xterm"})
    live = text.split("== sandbox")[0]
    assert live.count("\rsandbox: waiting") >= 2 and "\x1b[K" in live
    assert live.count("\n") <= 2  # the updates rewrite one line; a newline ends it


def test_teardown_report_fits_and_names_programs(sandbox):
    """Last of the tests on the module's sandbox: it tears the sandbox's server down."""
    out = invoke("teardown", "--host", "sandbox", "--yes", "--grace", "5", env=env(COLUMNS="100"))
    text = out.stdout.decode()
    assert out.returncode == 0, text + out.stderr.decode()
    assert all(len(line) <= 100 for line in text.splitlines()), text
    server = sandbox["processes"]["server"]["pid"]
    assert re.search(rf"^  SIGTERM\s+{server}\s+sent\s+sglang\.launch_server --", text, re.M), text
    assert sys.executable not in text and not rules_have_headers(text)
    assert "FREED and verified" in " ".join(text.split())


def test_a_server_log_is_not_data_a_stop_could_lose(ps, hosts_env, tmp_path):
    """A GPU job whose stdout goes to `> server.log` and that keeps an append-mode log and a
    checkpoint open: only the checkpoint is what a stop may leave incomplete."""
    job = tmp_path / "train_job.py"
    job.write_text(
        "import os, sys, time\n"
        "d, dev = sys.argv[1], sys.argv[2]\n"
        "ready = sys.argv[sys.argv.index('--ready') + 1]\n"
        "log = os.open(d + '/server.log', os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)\n"
        "os.dup2(log, 1); os.dup2(log, 2); os.close(log)\n"
        "app = open(d + '/app.log', 'a'); ckpt = open(d + '/ckpt.pt', 'wb'); gpu = open(dev, 'rb')\n"
        "open(ready + '.tmp', 'w').close(); os.rename(ready + '.tmp', ready)\n"
        "time.sleep(300)\n")
    hosts_env(scenario.env_lines(ps))
    pid = ps.start(["python3", str(job), str(tmp_path), str(ps.devdir / "nvidia0")], executable=sys.executable)
    text = invoke("plan", "--host", "local", env=env(COLUMNS="100")).stdout.decode()
    assert "train_job.py" in row_of(text, pid)
    joined = " ".join(text.split())
    assert f"pid {pid} is writing {tmp_path}/ckpt.pt: stopping it may leave that file incomplete" in joined, text
    assert "server.log" not in text and "app.log" not in text
    status = invoke("status", "--host", "local", env=env(COLUMNS="100")).stdout.decode()
    assert "ckpt.pt" in status and "server.log" not in status and "app.log" not in status


# -- the renderer on its own ----------------------------------------------------------------------


def test_command_keeps_program_and_key_arguments():
    argv = ["/opt/conda/envs/serve/bin/python3.11", "-u", "-m", "sglang.launch_server", "--trust-remote-code",
            "--model-path", "/models/k2", "--mem-fraction-static", "0.88", "--tp", "8", "--port", "30000"]
    c = Command(argv)
    assert str(c) == "sglang.launch_server --trust-remote-code --model-path /models/k2 " \
                     "--mem-fraction-static 0.88 --tp 8 --port 30000"
    assert c.fit(64) == "sglang.launch_server --model-path /models/k2 --port 30000 ..."
    assert c.fit(40) == "sglang.launch_server --port 30000 ..."
    assert Command(["/usr/bin/python3", "/usr/local/bin/torchrun", "--nproc-per-node", "8", "train.py"]).fit(200) \
        == "torchrun --nproc-per-node 8 train.py"
    assert str(Command(["/usr/bin/nvidia-persistenced", "--user", "nvidia"])) == "nvidia-persistenced --user nvidia"
    assert str(Command(cmdline="VLLM::EngineCore")) == "VLLM::EngineCore"
    assert str(Command(["x\x1b[2Jy"])) == "x\\x1b[2Jy"  # escape sequences from a host stay visible, harmless


def test_table_fits_and_never_cuts_a_detail():
    why = "runs module sglang.launch_server (target pattern sglang\\.launch_server) " * 2
    argv = ["python3", "-m", "sglang.launch_server", "--port", "1"] * 9
    text = table(["pid", Col("command", "command")], [[1, Command(argv)]], columns=50, details=[why])
    assert all(len(line) <= 50 for line in text.splitlines())
    assert " ".join(text.split()).count("sglang\\.launch_server)") == 2


def test_shortened_command_keeps_its_words_in_order_and_quotes_scripts():
    """A cut command must still read as the command: kept arguments in their own order,
    a `sh -c` script quoted as one word (seen reordered in the docker host's report)."""
    from scripts.views.render import Command
    c = Command(["sh", "-c", "trap 'exit 0' TERM; sleep 9", "--tp", "8", "--port", "30000", "--log-level", "info"])
    short = c.fit(32)
    assert short.startswith("sh --tp 8 --port 30000"), short
    assert "'trap '\"'\"'exit 0'\"'\"' TERM; sleep 9'" in str(c)


# -- tables that fit COLUMNS ---------------------------------------------------------------------

def section(text: str, title: str) -> list:
    """The lines of one titled block of a screen (up to the next unindented line)."""
    lines = text.splitlines()
    start = next(n for n, line in enumerate(lines) if line.startswith(title))
    out = [lines[start]]
    for line in lines[start + 1:]:
        if line and not line.startswith(" "):
            break
        out.append(line)
    return out


def test_status_gpu_memory_and_health_fit_60_columns(sandbox):
    text = invoke("status", "--host", "sandbox", env=env(COLUMNS="60")).stdout.decode()
    for title in ("GPU memory", "GPU health"):
        block = section(text, title)
        assert len(block) > 3 and all(len(line) <= 60 for line in block), block


def test_gpu_memory_table_wraps_between_processes_at_60_columns(monkeypatch):
    """Long pids (pid_max 4194304) and H200 sizes: each pid(MiB) stays whole on its line."""
    from types import SimpleNamespace

    from scripts.views.status import gpu_table

    monkeypatch.setenv("COLUMNS", "60")
    gpus = [{"index": i, "name": "NVIDIA H200 NVL", "used_mib": 143000, "reserved_mib": 512, "total_mib": 143771,
             "processes": [{"pid": pid, "used_mib": 142000}, {"pid": pid + 1, "used_mib": 1000}]}
            for i, pid in ((0, 4194301), (1, 123456))]
    text = gpu_table(SimpleNamespace(scan=SimpleNamespace(gpus=gpus, gpu_source="nvml", gpu_source_tried=[])))
    assert all(len(line) <= 60 for line in text.splitlines()), text
    for whole in ("4194301(142000)", "4194302(1000)", "123456(142000)", "123457(1000)"):
        assert re.search(rf"(^|\s){re.escape(whole)}($|\s)", text, re.M), text


def test_reset_preconditions_fit_and_keep_every_detail(sandbox):
    out = invoke("reset", "--host", "sandbox", "--gpu", "0", env=env(COLUMNS="100"))
    text = out.stdout.decode()
    assert "precondition" in text and all(len(line) <= 100 for line in text.splitlines()), text
    assert "systemctl stop nvidia-persistenced" in " ".join(text.split())  # wrapped, never cut


def test_pivot_step_table_fits_80_columns(monkeypatch):
    from scripts.views.pivot import step_table

    monkeypatch.setenv("COLUMNS", "80")
    long = ("NOT READY after 600.0s: http://127.0.0.1:30000/health answered 503 Service Unavailable; "
            "the server's log ends with CUDA out of memory")
    text = step_table([{"step": "ready", "result": long, "exit": 1, "seconds": 600.04},
                       {"step": "rollback stop", "result": "stopped [4242]", "exit": 0, "seconds": 1.5}])
    assert all(len(line) <= 80 for line in text.splitlines()), text
    assert " ".join(text.split()).count("CUDA out of memory") == 1 and not rules_have_headers(text)


def test_health_reasons_are_wrapped_never_cut_at_any_width(monkeypatch):
    from types import SimpleNamespace

    from scripts.views.health import health

    reasons = ["Xid 79 (GPU has fallen off the bus) at 2026-11-30T03:12:09 in dmesg: " + "x" * 60,
               "remapped rows: 3 pending, the GPU needs a reset for them to take effect"]
    scan = SimpleNamespace(gpus=[{"index": 0, "health": {"verdict": "reset needed", "reasons": reasons}}])
    for columns in ("200", "80"):
        monkeypatch.setenv("COLUMNS", columns)
        text = health(scan, "gpu1")
        assert all(len(line) <= int(columns) for line in text.splitlines()), text
        assert "".join("; ".join(reasons).split()) in "".join(text.split()), text  # whole, maybe wrapped
        assert "..." not in text


def test_a_plans_manager_unit_and_empty_target_lines_fit_80_columns(monkeypatch):
    """The lines under a plan's tables (a supervisord program stopped through supervisorctl, a
    unit inside a CT, a container, no target at all) wrap between words at 80 columns: the
    supervisorctl line was 117 columns and "Targets: none (...)" 92, folded by the terminal."""
    from scripts.agent.wire import records
    from scripts.views.teardown import plan_tables

    monkeypatch.setenv("COLUMNS", "80")
    conf = "/etc/supervisor/conf.d/inference-cluster-prod.conf"
    plan = records.Plan(targets=[], protected=[], managers=[
        {"kind": "supervisord", "name": "infer:vllm-llama3-70b-instruct", "pids": [481516, 481517], "run": True,
         "command": f"supervisorctl -c {conf} stop infer:vllm-llama3-70b-instruct", "why": "it runs only targets"}],
        units=[{"unit": "vllm-llama3-70b-instruct-tp8.service", "ctid": "129", "pids": [4242], "disable": True,
                "pending": "a restart systemd scheduled runs a target"}],
        containers=[{"id": "0123456789abcdef0123", "name": "vllm-llama3-70b-instruct", "pids": [77], "disable": True}])
    text = plan_tables(plan)
    assert all(len(line) <= 80 for line in text.splitlines()), text
    flat = " ".join(text.split())
    for whole in (f"(pid 481516, 481517) will be stopped with supervisorctl -c {conf} stop "
                  "infer:vllm-llama3-70b-instruct", "Targets: none (nothing matches the target patterns and no "
                  "unprotected process holds a GPU)", "with pct exec 129 -- systemctl and disabled",
                  "vllm-llama3-70b-instruct (0123456789ab) will be stopped with docker stop (its restart policy"):
        assert whole in flat, text


def test_a_ready_progress_line_names_the_log_only_when_it_has_a_line():
    from scripts.views.phase import ready_progress

    waiting = {"elapsed_s": 12.0, "detail": "http://127.0.0.1:30000/health: connection refused"}
    assert ready_progress(dict(waiting, last_log=None)) == (
        "waiting 12s: http://127.0.0.1:30000/health: connection refused")  # no empty `log: `
    assert ready_progress(dict(waiting, last_log="  ")).endswith("connection refused")
    assert ready_progress(dict(waiting, last_log="Loading weights 3/8")).endswith("| log: Loading weights 3/8")
