"""The Ansible module's arguments, checked before anything runs (engines/ansible_task._params)."""
from __future__ import annotations

import pytest

from scripts.agent.wire import call, frame, requests
from scripts.config.errors import ConfigError
from scripts.engines import ansible_task


@pytest.mark.parametrize("scope", ["", "   "])
def test_a_scope_that_narrows_nothing_is_refused_in_one_line(scope):
    """A variable that expanded to nothing must not widen the teardown to the whole host: the
    empty scope was once dropped from the argv, and the agent then targeted every match."""
    with pytest.raises(ConfigError) as refused:
        ansible_task.agent_call({"scope": scope}, check_mode=False)
    text = str(refused.value)
    assert text.startswith(f"scope={scope!r}: an empty scope narrows nothing") and "\n" not in text


def test_an_empty_scope_reaches_the_agent_as_given_never_dropped():
    """The argv keeps --scope= so the agent's own check refuses it (options/record.py)."""
    argv = call.agent_argv("python3", requests.Teardown(), frame.new_nonce(), scope="")
    assert "--scope=" in argv


def test_a_real_scope_is_carried():
    argv = ansible_task.agent_call({"scope": "job-42"}, check_mode=False)["argv"]
    assert "--scope=job-42" in argv
