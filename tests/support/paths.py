"""Where things are, for tests at any depth: a test finds the repository from here, never by
counting parents of its own path (a test file moved to another folder would look elsewhere)."""
from pathlib import Path

SUPPORT = Path(__file__).resolve().parent
REPO = SUPPORT.parent.parent
STANDIN = SUPPORT / "standin"
FIXTURES = REPO / "tests" / "fixtures" / "h200-driver580"  # real H200 captures; see tests/fixtures/README.md
