"""The pins are written once, in pyproject.toml; the requirements files (what `make setup` and
CI install) are made from it (`make requirements`, scripts/pins.py) and must be what that makes,
or CI tests other versions than a `pip install .` gets; test-only tools stay out of the runtime
list, and `make demo` installs only that list."""
import re
import subprocess
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


def test_the_requirements_files_are_made_from_pyproject():
    from scripts import pins

    assert (REPO / "requirements.txt").read_text() == pins.text("runtime"), "run `make requirements`"
    assert (REPO / "requirements-dev.txt").read_text() == pins.text("dev"), "run `make requirements`"


def test_python_dotenv_is_a_test_tool_only():
    """hosts.env is read by scripts/config/envfile.py; python-dotenv is what the tests compare it with."""
    assert "python-dotenv" not in pins(project()["dependencies"])
    assert "python-dotenv" in pins(project()["optional-dependencies"]["dev"])


def make_plan(target: str, tmp_path) -> str:
    """What `make TARGET` would run in a fresh checkout's venv (make -n: nothing runs)."""
    out = subprocess.run(["make", "-n", target, f"VENV={tmp_path / 'venv'}"], cwd=REPO, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_make_demo_installs_the_runtime_requirements_only(tmp_path):
    demo = make_plan("demo", tmp_path)
    assert "-r requirements.txt" in demo and "requirements-dev.txt" not in demo, demo
    for target in ("setup", "test"):  # the tests still get the development requirements
        assert "-r requirements-dev.txt" in make_plan(target, tmp_path), target
