"""The durations file that orders the suite's work (tests/support/durations.py)."""
from __future__ import annotations

from tests.support import durations

LOG = """\
============================= slowest durations =============================
60.12s call     tests/a.py::test_cron
0.40s setup    tests/a.py::test_cron
1.90s call     tests/b.py::test_short
1.50s call     tests/c.py::test_three_parts[x]
0.60s teardown tests/c.py::test_three_parts[x]
(1 durations < 0.005s hidden.)
"""


def test_a_log_gives_each_long_tests_seconds_summed_over_its_phases():
    assert durations.from_log(LOG) == {"tests/a.py::test_cron": 60.5, "tests/c.py::test_three_parts[x]": 2.1}


def test_a_missing_or_broken_file_orders_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(durations, "FILE", tmp_path / "durations.json")
    assert durations.known() == {}
    (tmp_path / "durations.json").write_text("[not json")
    assert durations.known() == {}
    (tmp_path / "durations.json").write_text('{"t::a": 3, "t::b": "x"}')
    assert durations.known() == {"t::a": 3.0}


def test_the_committed_file_names_tests_that_exist():
    """A renamed test leaves its old id behind: harmless, but the file is then refreshed."""
    from tests.conftest import REPO

    ids = durations.known()
    assert ids, "tests/support/durations.json is missing: make test-durations"
    files = {nodeid.split("::")[0] for nodeid in ids}
    missing = sorted(f for f in files if not (REPO / f).exists())
    assert not missing, f"durations for files that are gone (make test-durations): {missing}"
