"""The runbook index routes the 3 a.m. case: memory still used after the server was killed is
often a server its manager (systemd, docker, supervisord, Kubernetes...) started again, which
the memory runbook alone never says. The index row names both runbooks, and the memory runbook
sends the reader to the manager runbook before its resolution when the plan names a manager."""
import re

from tests.conftest import REPO

RUNBOOKS = REPO / "runbooks"
MEMORY, MANAGER = "gpu-memory-not-freed.md", "gpu-server-under-a-manager.md"


def test_index_row_for_memory_still_used_names_the_manager_runbook():
    rows = [line for line in (RUNBOOKS / "README.md").read_text().splitlines()
            if line.startswith("|") and "memory still used after the server was killed" in line]
    assert len(rows) == 1, rows
    links = re.findall(r"\]\(([^)]+)\)", rows[0])
    assert links == [MEMORY, MANAGER], rows[0]
    assert "MANAGED" in rows[0] and "unit or container stop" in rows[0], rows[0]
    assert all((RUNBOOKS / link).exists() for link in links)


def test_memory_runbook_links_the_manager_runbook_in_its_first_steps():
    text = (RUNBOOKS / MEMORY).read_text()
    first_steps = text.split("## Resolution", 1)[0]
    assert f"]({MANAGER})" in first_steps, "the memory runbook must route a managed server before its resolution"
    routing = first_steps[first_steps.index("## Pre-checks"):first_steps.index(f"]({MANAGER})")]
    # the plan's own words for a manager, as scripts/views/teardown.py prints them
    for words in ("MANAGED pid", "will be stopped with systemctl", "will be stopped with docker stop"):
        assert words in " ".join(routing.split()), words
