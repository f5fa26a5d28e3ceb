"""`make bench` you can run: a failure is recorded in its row and the run goes on, a
section says what it does while a step lasts (a heartbeat naming the step), and results go to a
git-ignored file unless --publish asks for the tracked bench/RESULTS.md. The mechanics only:
the sections here are small stand-ins (the full benchmark takes many minutes)."""
from __future__ import annotations

import subprocess
import time
from argparse import Namespace

from bench import run as bench
from tests.conftest import REPO

FLEET_ROWS = [{"hosts": 1, "mode": "parallel", "walls": [1.0, 1.2], "cpu_s": [None], "failed": []},
              {"hosts": 2, "mode": "parallel", "walls": [], "cpu_s": [],
               "failed": ["exit 3: node02: host unreachable"]},
              {"hosts": 2, "mode": "one after another", "walls": [2.0], "cpu_s": [None], "failed": []}]


def sections(lasts=lambda: None):
    def oneliners(args, work):
        raise RuntimeError("fleet host node03: host unreachable (ssh exit 255)\nmore detail")

    def ssh(args, work):
        return {"connections_per_teardown": 1, "cold": [0.3, 0.4], "warm": [0.1, 0.2]}

    def scans(args, work):
        bench.progress("scanning 100 extra processes")
        lasts()  # a section that takes a while: the heartbeat speaks for it
        return [{"processes": 100, "median_ms": 1.0, "min_ms": 0.9, "max_ms": 1.2, "gpu_source": "none",
                 "holder_scan_ms": 0.8}]

    return (("1/4 one-liners", "oneliners", oneliners), ("2/4 ssh", "ssh", ssh), ("3/4 scan", "scans", scans),
            ("4/4 fleet", "fleet", lambda args, work: FLEET_ROWS))


def test_a_failed_section_is_recorded_and_the_run_goes_on(tmp_path, capsys):
    results, failed = bench.run_all(Namespace(), tmp_path, sections(), every=5)
    assert set(results) == {"oneliners", "ssh", "scans", "fleet"} and results["oneliners"] is None
    assert failed == {"oneliners": "RuntimeError: fleet host node03: host unreachable (ssh exit 255)"}
    assert "FAILED (RuntimeError: fleet host node03" in capsys.readouterr().out
    text = bench.report(Namespace(), results, failed)
    assert "**This run is incomplete**: 1 section(s) failed (oneliners)" in text
    assert "**Not measured in this run**: FAILED (RuntimeError: fleet host node03" in text
    assert "**1**" in text and "median **0.350 s**" in text  # the sections after it were measured
    fleet_lines = text.split("## 4. Fleet", 1)[1].split("##", 1)[0]
    failed_row = next(line for line in fleet_lines.splitlines() if line.startswith("2      parallel"))
    assert "1/1: exit 3: node02: host unreachable" in failed_row and " -  " in failed_row  # in its row, untimed
    assert "Ratio:" not in fleet_lines  # no ratio from a row with no timing


BEAT = "still running: scanning 100 extra processes"


def test_a_section_that_lasts_says_what_step_it_is_in_until_it_ends(tmp_path, capsys):
    """Rule: while a step lasts, the section repeats it (a run silent for minutes looked hung),
    and it stops when the section ends. The step here lasts until 3 heartbeats were printed,
    so the test waits on the heartbeats themselves, never on how far apart they come."""
    seen = []

    def until_three_beats():
        deadline = time.monotonic() + 60  # only a heartbeat that never comes fails here
        while sum(BEAT in line for line in seen) < 3 and time.monotonic() < deadline:
            seen.extend(capsys.readouterr().out.splitlines())
            time.sleep(0.02)

    bench.run_all(Namespace(), tmp_path, sections(until_three_beats)[2:3], every=0.1)
    seen.extend(capsys.readouterr().out.splitlines())
    step = next(i for i, line in enumerate(seen) if line.endswith("] scanning 100 extra processes"))
    beats = [i for i, line in enumerate(seen) if BEAT in line]
    assert len(beats) >= 3 and beats[0] > step, seen  # the step first, then the heartbeats naming it
    assert all("3/4 scan [" in seen[i] for i in beats), seen  # each names its section
    time.sleep(0.3)  # three heartbeat intervals after the section ended: none may come
    assert BEAT not in capsys.readouterr().out
    assert bench.HEARTBEAT_S <= 10


def test_results_go_to_an_ignored_file_and_results_md_only_when_asked(tmp_path, monkeypatch, capsys):
    tracked = tmp_path / "RESULTS.md"
    tracked.write_text("the published run\n")
    monkeypatch.setattr(bench, "RESULTS_MD", tracked)
    out = tmp_path / "local-2026-01-01.md"
    assert bench.write_results("run A\n", out, publish=False, failed={}) == 0
    assert out.read_text() == "run A\n" and tracked.read_text() == "the published run\n"
    assert bench.write_results("run B\n", out, publish=True, failed={"fleet": "x"}) == 1
    assert tracked.read_text() == "the published run\n" and "NOT published" in capsys.readouterr().out
    assert bench.write_results("run C\n", out, publish=True, failed={}) == 0
    assert tracked.read_text() == "run C\n"
    # the default place is under bench/results/ and git-ignored; make bench does not publish, bench-publish does
    default = bench.local_results()
    assert default.parent == REPO / "bench" / "results" and default.name.startswith("local-")
    assert subprocess.run(["git", "check-ignore", "-q", str(default)], cwd=REPO).returncode == 0
    plain = subprocess.run(["make", "-n", "bench"], cwd=REPO, capture_output=True, text=True).stdout
    publish = subprocess.run(["make", "-n", "bench-publish"], cwd=REPO, capture_output=True, text=True).stdout
    assert [x for x in plain.splitlines() if "bench/run.py" in x] == [".venv/bin/python bench/run.py"]
    assert [x for x in publish.splitlines() if "bench/run.py" in x] == [".venv/bin/python bench/run.py --publish"]


def test_a_failed_fleet_run_is_recorded_in_its_row_and_the_fleet_goes_on(tmp_path):
    """bench.run.fleet with the teardown of the 2-host parallel run failing (a host unreachable):
    its row says so and the one-after-another run of the same size is still measured."""
    calls = []

    def runner(argv, env):
        calls.append(argv)
        failing = "node[01-02]" in argv and argv[argv.index("--fanout") + 1] == "16"
        res = subprocess.CompletedProcess(argv, 3 if failing else 0, "",
                                          "gpu-pivot: node02: host unreachable (ssh exit 255)\n" if failing else "")
        return res, 0.5, None

    rows = bench.fleet(tmp_path, [1, 2], 1, runner=runner)
    assert len(calls) == 3
    by = {(r["hosts"], r["mode"]): r for r in rows}
    assert by[(1, "parallel")]["walls"] == [0.5] and by[(1, "parallel")]["failed"] == []
    assert by[(2, "parallel")]["walls"] == []
    assert by[(2, "parallel")]["failed"] == ["exit 3: gpu-pivot: node02: host unreachable (ssh exit 255)"]
    assert by[(2, "one after another")]["walls"] == [0.5]
