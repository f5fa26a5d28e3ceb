"""Each agent subcommand's required flags, with values it accepts: what a test gives a
subcommand's parser to reach the rest of it (the wire's table and the typed options both)."""
from scripts.agent.wire import frame

REQUIRED = {
    "phase-start": ["--spec", frame.encode_spec({"name": "x"})],
    "phase-ready": ["--spec", frame.encode_spec({"name": "x"})],
    "phase-stop": ["--spec", frame.encode_spec({"name": "x"})],
    "phase-logs": ["--spec", frame.encode_spec({"name": "x"})],
    "smoke": ["--spec", frame.encode_spec({"name": "x"})],
    "gates": ["--spec", frame.encode_spec({"name": "x"})],
    "deploy": ["--spec", frame.encode_spec({"name": "x"}), "--action", "apply"],
    "drain": ["--url", "http://127.0.0.1:9/metrics"],
    "lint": ["--argv", "[]"],
    "gpu-settings": ["--settings", '{"power_limit_w": 700}'],
    "release": ["--token", "0123456789abcdef"],
}
