#!/usr/bin/env bash
# The verdict's GPU cases on the GPU machine (device tool), results in $OUT: the GPU tests
# (tests/system/test_gpu*.py: pinned-pool server FREED while it unpins, monitors, health) and
# bench/exiting_pinned.py (the SIGKILL floor and the teardown of a 120 GiB + 48 GiB pinned server).
# Usage there: bash bench/gpu_verdict.sh   (wheels for invoke/dotenv/ClusterShell in .whl/)
set -uo pipefail
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site
fi
export PYTHONUNBUFFERED=1 XDG_STATE_HOME=/tmp/gp-state
{
  nvidia-smi -L; free -g | head -2
  read -r -a tests <<< "${GPU_TESTS:-tests/system/test_gpu.py tests/system/test_gpu_monitors.py tests/system/test_gpu_health.py}"
  python3 -m pytest -m gpu -rs -q -p no:cacheprovider "${tests[@]}"
} 2>&1 | tee "$OUT/gpu-tests.txt" | tail -25
python3 bench/exiting_pinned.py --gpu-gib "${GPU_GIB:-120}" --pinned-gib "${PINNED_GIB:-48}" \
    --out "$OUT/exiting-pinned.json" 2>&1 | tail -60
