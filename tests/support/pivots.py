"""What the pivot tests start a deploy from: a server's code directory and a patch that breaks it."""
from __future__ import annotations


def broken_deploy(tmp_path) -> tuple:
    """A server's code dir (healthy config) and a patch that makes it unhealthy: (code, patch)."""
    from scripts.ops.sandbox import BROKEN_PATCH

    code = tmp_path / "code"
    code.mkdir()
    (code / "server_config.json").write_text('{"healthy": true}\n')
    patch = tmp_path / "broken.patch"
    patch.write_text(BROKEN_PATCH)
    return code, patch
