"""What the agent reads before and while a phase runs: the launch lint (a draft model's
architecture against --speculative-algorithm, tensor parallel size against the GPUs visible,
a port already taken, a model path that does not exist: exit 5, each named) and the drain's
count of running requests from a server's Prometheus metrics (None when none is listed)."""
import json

from tests.conftest import invoke
from tests.support.loopback_sshd import free_port


def out_text(res):
    return res.stdout.decode() + res.stderr.decode()


def test_launch_lint_eagle_vs_eagle3(tmp_path):
    from scripts.config.sandbox import sandbox_dir
    from scripts.ops.sandbox import make_devices

    invoke("sandbox", "down")
    make_devices(sandbox_dir() / "dev")  # the sandbox's 2 fake GPUs, whatever ran before in this worker
    draft = tmp_path / "draft"
    draft.mkdir()
    (draft / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"]}))
    model = tmp_path / "model"
    model.mkdir()
    base = ["lint-launch", "--host", "sandbox", "--", "python3", "-m", "sglang.launch_server",
            "--model-path", str(model), "--tp", "2", "--port", str(free_port()),
            "--speculative-draft-model-path", str(draft), "--speculative-algorithm"]
    bad = invoke(*base, "EAGLE")
    assert bad.returncode == 5
    assert b"is EAGLE-3" in bad.stdout and b"use EAGLE3" in bad.stdout
    good = invoke(*base, "EAGLE3")
    assert good.returncode == 0, out_text(good)
    assert b"launch command OK" in good.stdout


def test_launch_lint_tp_port_paths():
    from scripts.config.sandbox import sandbox_dir
    from scripts.ops.sandbox import make_devices
    make_devices(sandbox_dir() / "dev")  # the sandbox's 2 fake GPUs, whatever ran before
    port = free_port()
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        res = invoke("lint-launch", "--host", "sandbox", "--", "vllm", "serve", "--model", "/no/such/model",
                     "--tensor-parallel-size", "8", "--port", str(port))
    text = " ".join(res.stdout.decode().split())  # a finding wraps at the terminal's width, between words
    assert res.returncode == 5
    assert "tensor parallel size 8 is larger than the 2 GPU(s) visible" in text
    assert f"port {port} is already taken" in text
    assert "model path /no/such/model does not exist" in text


def test_drain_metric_parsing():
    from scripts.agent.phases.drain import running_requests
    text = ('# HELP sglang:num_running_reqs x\nsglang:num_running_reqs{model_name="m",engine="0"} 3.0\n'
            'sglang:num_running_reqs{model_name="m",engine="1"} 2.0\nvllm:num_requests_waiting 9\n')
    assert running_requests(text) == 5.0
    assert running_requests("vllm:num_requests_running{model_name=\"m\"} 0.0 1700000000\n") == 0.0
    assert running_requests("other_metric 1\n") is None
