"""Fixtures the agent's tests in several folders share."""
import pytest

from tests.support.hung_mounts import hung_mount


@pytest.fixture
def hung_fuse(tmp_path):
    """A FUSE mount that stops answering once its file is opened (tests/support/hung_mounts.py)."""
    with hung_mount(tmp_path) as mount:
        yield mount
