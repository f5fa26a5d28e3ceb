"""Fixtures the console's tests in several files share."""
import pytest

from tests.support import fleet_faults
from tests.support.loopback_sshd import LoopbackSshd


@pytest.fixture
def own_sshd(tmp_path, sshd):
    """A loopback sshd of this test's own (with its own run dir), so a test may stop it mid-call."""
    server = LoopbackSshd(tmp_path / "own-sshd", keys_from=sshd,
                          env={"GPU_PIVOT_RUN_DIR": str(tmp_path / "own-run")}).start()
    yield server
    fleet_faults.end_sshd(server)
