#!/usr/bin/env bash
# The everyday commands on the GPU machine (device tool), results in $OUT: `invoke status --host
# local` beside nvidia-smi and fuser (bench/everyday.py --sections gpu), what each call ships,
# and the teardown's floor rows again (bench/gpu_teardown.py, 1 GPU), so a change for status
# shows it made nothing slower there. The CLI runs from its own venv as `make setup` makes
# one; the agent on the system python3 that has pynvml, as on a GPU host.
# Usage there: bash bench/gpu_everyday.sh   (wheels for invoke/dotenv/ClusterShell in .whl/)
# shellcheck source=bench/gpu_cli_venv.sh
. "$(dirname "$0")/gpu_cli_venv.sh"
nvidia-smi -L | tee "$OUT/gpu-everyday.txt"
/tmp/cli-venv/bin/python -m invoke status --host local >> "$OUT/gpu-everyday.txt" 2>&1  # warm the caches once
timeout 90 python3 bench/everyday.py --sections gpu,bytes --reps "${REPS:-15}" --cli-python /tmp/cli-venv/bin/python \
    --json "$OUT/gpu-everyday.json" 2>&1 | tee -a "$OUT/gpu-everyday.txt"
export CUDA_VISIBLE_DEVICES=0
timeout "${FLOOR_S:-150}" env -u PYTHONPATH PYTHONPATH=/tmp/site python3 bench/gpu_teardown.py \
    --reps "${FLOOR_REPS:-3}" --cli-python /tmp/cli-venv/bin/python --out "$OUT/gpu-teardown-1gpu.json" 2>&1 \
    | grep -v "resource_tracker\|warnings.warn" | tail -40 > "$OUT/gpu-teardown-1gpu.txt"
cat "$OUT/gpu-teardown-1gpu.txt"
ls "$OUT"
