"""The pins live twice: pyproject.toml (metadata, `pip install .[dev]`) and the requirements
files (what `make setup` and CI install). They must say the same, or CI tests other versions
than a `pip install .` gets; test-only tools must stay out of the runtime list."""
import re
import tomllib

import pytest

from tests.conftest import REPO

PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;#]+)$")


def pins(lines) -> dict:
    """{normalised name: version} of `name==version` lines; anything else is an error."""
    out = {}
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("-r "):
            continue
        match = PIN.match(line)
        assert match, f"not an exact pin: {line!r}"
        out[re.sub(r"[-_.]+", "-", match[1]).lower()] = match[2]
    return out


def project():
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def test_runtime_pins_agree():
    assert pins((REPO / "requirements.txt").read_text().splitlines()) == pins(project()["dependencies"])


def test_dev_pins_agree_and_include_runtime():
    text = (REPO / "requirements-dev.txt").read_text()
    assert "-r requirements.txt" in text.splitlines()
    assert pins(text.splitlines()) == pins(project()["optional-dependencies"]["dev"])


def test_test_tools_are_not_runtime():
    runtime = pins(project()["dependencies"])
    for tool in ("pytest", "hypothesis", "ruff", "mypy", "sh"):
        assert tool not in runtime, f"{tool} is a runtime requirement"


def test_pin_parser_rejects_ranges():
    with pytest.raises(AssertionError, match="not an exact pin: 'invoke>=3'"):
        pins(["invoke>=3"])
