#!/usr/bin/env bash
# GPU run (device tool) for teardowns while someone watches the GPUs: the GPU tests, then
# bench/gpu_teardown.py with a one-process 8 GiB server and, side by side in each rep, no
# watcher / nvidia-smi every 1 s / every 0.2 s / a renamed copy every 0.2 s / a pynvml loop.
# Results in $OUT. Usage there: bash bench/gpu_monitors.sh   (wheels in .whl/, as gpu_final.sh)
# shellcheck source=bench/gpu_cli_venv.sh
. "$(dirname "$0")/gpu_cli_venv.sh"
{ echo "## pytest -m gpu"; timeout 240 python3 -m pytest -m gpu -rs -q tests/; echo "pytest exit $?"; } \
    > "$OUT/gpu-tests-full.txt" 2>&1
grep -E "^(FAILED|ERROR|E  )|passed|failed|pytest exit" "$OUT/gpu-tests-full.txt" | tail -15 | tee "$OUT/gpu-tests.txt"
timeout 330 env -u PYTHONPATH PYTHONPATH=/tmp/site python3 bench/gpu_teardown.py --reps "${REPS:-5}" \
    --children 0 --gib-per-proc 8 --pollers none,smi-1s,smi-0.2s,renamed-smi-0.2s,pynvml-0.2s \
    --cli-python /tmp/cli-venv/bin/python --out "$OUT/gpu-monitors.json" 2>&1 \
    | grep -v "resource_tracker\|warnings.warn" > "$OUT/gpu-monitors.txt"
grep -E '^rep' "$OUT/gpu-monitors.txt" | cut -c1-160
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(json.dumps(d['pollers'], indent=1)); print('floor', d['floor_s'])" "$OUT/gpu-monitors.json"
