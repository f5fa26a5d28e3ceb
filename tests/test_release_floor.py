"""The release floor (how long an H200's driver takes to release a process's memory) read from
its capture, as the bench and the reports quote it."""
from tests.conftest import FIXTURES


def test_release_floor_fixture():
    from bench.floor import release_floor

    floor = release_floor(FIXTURES / "release-floor.json")
    assert floor == {"min_s": 0.2595, "max_s": 0.3661, "median_s": 0.33050000000000002, "runs": 4}
