"""The agent imports only its own modules and the standard library, never a file from the
directory it was started in.

Why: `python3 -c ...` and `python3 -` put the working directory first on sys.path, and the
agent runs as root wherever the operator stands (a shared /tmp, a colleague's checkout). A
`zlib.py` or `json.py` another user left there would run as root before any signal. Tested
with a real second user planting both in its own home, and the agent started there in the
two forms the transport and the Ansible module use (call.BOOT stream, `python3 -` payload).
"""
from __future__ import annotations

import subprocess
import sys

import pytest

from scripts.agent.wire import call, frame, requests
from scripts.reach import bundle

PLANT = "import os\nopen(os.path.join(os.path.dirname(os.path.abspath(__file__)), 'RAN-' + __name__), 'w').close()\n" \
        "raise SystemExit('planted module imported')\n"


@pytest.mark.parametrize("form", ["stream", "payload"])
def test_modules_planted_in_the_working_directory_are_never_imported(second_user, form):
    home = second_user.home
    for name in ("zlib", "json", "binascii", "marshal", "argparse"):
        done = second_user.run(["sh", "-c", 'cat > "$1"', "sh", f"{home}/{name}.py"], input=PLANT.encode())
        assert done.returncode == 0, done.stderr
    nonce = frame.new_nonce()
    argv = call.agent_argv(sys.executable, requests.Ping(), nonce, devices="/nonexistent/nvidia*",
                           stream=(form == "stream"))
    stdin = bundle.agent_stream() if form == "stream" else bundle.agent_payload()
    out = subprocess.run(argv, input=stdin, cwd=home, capture_output=True, timeout=60)
    ran = sorted(p for p in __import__("os").listdir(home) if p.startswith("RAN-"))
    assert ran == [], f"the agent imported {ran} from its working directory: {out.stderr[-500:]!r}"
    assert out.returncode == 0, out.stderr[-800:]
    assert nonce.encode() in out.stdout


def test_a_crash_names_the_agents_own_frame_with_its_folder(capsys):
    """Two agent modules are called run.py (teardown/, phases/): the one-line failure names
    the folder, and the last frame outside the standard library (who passed json a bad
    document, not json's decoder)."""
    import json

    from scripts.agent import cli
    from scripts.agent.teardown import run

    try:
        run.parse_approved("not-a-pid")
    except Exception as exc:
        line = cli.failure(exc)
    assert "(agent/teardown/run.py:" in line and "in parse_approved)" in line, line
    assert cli._agent_file("<gpu-pivot>/agent/phases/run.py") == "agent/phases/run.py"
    assert cli._agent_file("/usr/lib/python3.11/json/decoder.py") is None
    with pytest.raises(json.JSONDecodeError) as caught:
        json.loads("{")
    assert "(test_agent_imports.py:" in cli.failure(caught.value)  # the caller, not json's decoder
    capsys.readouterr()
