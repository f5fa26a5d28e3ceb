"""Every screen of every task fits an 80-column terminal: `invoke --list`, each task's -h, and
each task run for real on the SANDBOX host and on a fleet of two hosts (the sandbox and `far`,
an ssh destination on a port nobody listens on), at COLUMNS=80.

Why one test that runs them all: a line that runs past the screen is folded by the terminal
wherever column 80 falls, inside a pid or a port, and one that a view cut to fit (`syste...`,
`port 476...`) names nothing; each screen was fixed on its own and the next one broke. Here
a new task, or a new line in a view, is run before it reaches an operator.

What is read: stdout, every line of it, no line wider than 80 (a path longer than the screen
alone on its line is allowed: it is never cut, it is copied whole). Not read:
- stderr: an error is one line by contract (`gpu-pivot: ...`, what `2>&1 | tail -1`, a log
  and the tests that grep it read); the screens that say the same in words are on stdout;
- `oneliner`: it prints one shell line to paste whole; split over lines it would not run;
- what a host's command or log printed (`run`, `logs`): the host's own bytes, passed through.
"""
from __future__ import annotations

import json
import re

from tests.conftest import invoke
from tests.support.loopback_sshd import free_port
from tests.support.task_help import columns, help_of, task_names

WIDTH = 80


def too_wide(text: str) -> list:
    """Lines wider than WIDTH, but for a word alone on its line (a path: never cut)."""
    return [line for line in text.splitlines() if len(line) > WIDTH and " " in line.strip()]


def _run(shown: dict, *args: str, timeout: int = 120) -> str:
    """`invoke ARGS` at 80 columns; its stdout kept in `shown` under the command line."""
    out = invoke(*args, env=columns(WIDTH), timeout=timeout)
    text = out.stdout.decode()
    key = " ".join(args)
    while key in shown:  # the same command again, later (audit after the teardowns): kept too
        key += " (again)"
    shown[key] = (out.returncode, text, out.stderr.decode())
    return text


def _summary_rows(text: str, header: str) -> dict:
    """{host: its cells} of the summary table under `header` (cells cut where its rule's dashes are)."""
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.split() == header.split())
    spans = [(m.start(), m.end()) for m in re.finditer(r"-+", lines[at + 1])]
    rows: dict = {}
    for line in lines[at + 2:]:
        if not line.strip() or line.startswith("=="):
            break
        cells = [" ".join(line[a:b].split()) for a, b in spans[:-1]] + [" ".join(line[spans[-1][0]:].split())]
        if cells[0]:
            rows[cells[0]] = cells
        else:
            rows[list(rows)[-1]][-1] += " " + cells[-1]
    return rows


def test_every_tasks_list_line_is_a_whole_sentence():
    """`invoke --list` shows a docstring's first line alone: a sentence that runs on to the next
    line is cut mid-way there (ping's read "... fuser there, and")."""
    import inspect

    import tasks

    listed = " ".join(invoke("--list", env=columns(WIDTH)).stdout.decode().split())
    for name, t in tasks.ns.tasks.items():
        first = (inspect.getdoc(t) or "").splitlines()[0]
        assert first.endswith("."), (name, first)
        assert f"{name} {first}" in listed, (name, first)  # whole, wrapped or not


def test_every_task_on_the_sandbox_and_a_fleet_fits_80_columns(hosts_env):
    from scripts.ops import audit_log

    port = free_port()  # five digits, so a cut inside it would show
    hosts_env(f"FAR_SSH=nobody@127.0.0.1\nFAR_SSH_OPTS='-p {port} -o ConnectTimeout=3 -o ControlPath=none'\n")
    # an audit record of a unit stop: its action is the longest word the audit's table shows
    audit_log.append("sandbox", [{"signal": "systemctl stop vllm-inference.service", "pid": 4242,
                                  "result": "stopped", "time": "2026-01-02T03:04:05+0000", "operator": "ana@ops",
                                  "cmdline": "python3 -m vllm.entrypoints.openai.api_server --port 30000"}])
    shown: dict = {}
    _run(shown, "--list")
    for name in task_names():
        shown[f"{name} -h"] = (0, help_of(name).stdout.decode(), "")
    _run(shown, "sandbox", "up")
    try:
        one, fleet = ["--host", "sandbox"], ["--host", "sandbox,far"]
        for args in (["hosts"], ["version"], ["sandbox", "status"], ["audit"],
                     ["status", *one], ["plan", *one], ["verify", *one], ["teardown", "--dry-run", *one],
                     ["ping", *one], ["pivot", "--dry-run", *one, "--to", "train"],
                     ["lint-launch", *one, "--", "python3", "-m", "sglang.launch_server", "--tp", "4"],
                     ["reset", *one, "--gpu", "0"], ["undrain", *one], ["logs", *one, "--phase", "train"],
                     ["status", *fleet], ["verify", *fleet], ["plan", *fleet], ["ping", *fleet],
                     ["teardown", "--dry-run", *fleet], ["run", *fleet, "--", "true"],
                     # for real: the fleet's teardown stops the sandbox's server, then the pivots and phases
                     ["teardown", "--yes", "--grace", "2", *fleet], ["pivot", "--yes", *one, "--to", "train"],
                     ["stop", *one, "--phase", "train"], ["start", *one, "--phase", "datagen"],
                     ["logs", *one, "--phase", "datagen"], ["stop", *one, "--phase", "datagen"],
                     ["audit", "--lines", "200"]):  # every record: the pivot's GPU settings are 8 of them
            _run(shown, *args)
        pasted = _run(shown, "oneliner", *one, "--", "true")
        assert pasted.strip(), shown["oneliner --host sandbox -- true"]  # it printed its line (not read: see above)
    finally:
        _run(shown, "sandbox", "down")
    del shown["oneliner --host sandbox -- true"]

    assert len(shown) > 2 * len(task_names()), sorted(shown)
    ran = {key.split()[0] for key in shown if not key.endswith(" -h")} | {"oneliner"}
    assert set(task_names()) <= ran, set(task_names()) - ran  # every task ran, not only its help
    assert shown["teardown --yes --grace 2 --host sandbox,far"][0] == 3, shown  # the fleet ran: far unreachable
    assert shown["pivot --yes --host sandbox --to train"][0] == 0, shown["pivot --yes --host sandbox --to train"]
    wide = {key: too_wide(text) for key, (_, text, _) in shown.items() if too_wide(text)}
    assert not wide, json.dumps(wide, indent=1)
    # wrapped, never cut: the port and the unit stop are whole, on a line each
    for key in ("status --host sandbox,far", "teardown --yes --grace 2 --host sandbox,far"):
        assert f" port {port}:" in " ".join(shown[key][1].split()), shown[key][1]
    audit = shown["audit --lines 200"][1]
    words = audit.split()  # the action wrapped in its column: its words whole, none cut to `syste...`
    assert "systemctl" in words and "vllm-inference.service" in words and "syste..." not in audit, audit
    assert audit.count(" SIGTERM ") >= 3, audit  # the fleet's teardown and the pivots were recorded
    assert "GPU 0 power_limit_w 450" in audit and "-> 700" in audit, audit  # the baseline put back (wrapped)


def test_every_row_of_a_fleet_summary_has_its_exit_code(hosts_env):
    """status, verify and teardown over a fleet: an `exit` column, 0 included, on every row
    (the sandbox's and the unreachable host's) - not `(exit N)` on failed rows alone."""
    port = free_port()
    hosts_env(f"FAR_SSH=nobody@127.0.0.1\nFAR_SSH_OPTS='-p {port} -o ConnectTimeout=3 -o ControlPath=none'\n")
    shown: dict = {}
    assert invoke("sandbox", "up").returncode == 0
    try:
        for args in (["status", "--brief"], ["verify", "--brief"], ["teardown", "--yes", "--grace", "2"]):
            _run(shown, *args, "--host", "sandbox,far")
        after = _run({}, "verify", "--brief", "--host", "sandbox,far")  # the sandbox freed: its row says 0
    finally:
        invoke("sandbox", "down")
    status = _summary_rows(shown["status --brief --host sandbox,far"][1], "host GPUs free/total holders exit verdict")
    assert status["sandbox"][3:] == ["0", "NOT FREE"], status  # status reports: not free is no failure
    assert status["far"][1:4] == ["-", "-", "3"] and status["far"][4].startswith("UNREACHABLE: host unreachable")
    verify = _summary_rows(shown["verify --brief --host sandbox,far"][1], "host GPUs free/total holders exit verdict")
    assert verify["sandbox"][3:] == ["1", "NOT FREE"] and verify["far"][3] == "3", verify
    assert _summary_rows(after, "host GPUs free/total holders exit verdict")["sandbox"][3:] == ["0", "FREE"], after
    torn = _summary_rows(shown["teardown --yes --grace 2 --host sandbox,far"][1],
                         "host freed MiB targets protected kept wall exit result")
    assert torn["sandbox"][5:] == ["0", "freed"], torn
    assert torn["far"][5] == "3" and torn["far"][6].startswith("UNREACHABLE: host unreachable"), torn
    assert "(exit" not in "".join(text for _, text, _ in shown.values()), shown
