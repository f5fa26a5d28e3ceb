#!/usr/bin/env bash
# GPU run (device tool) for a busy host: the GPU tests; the holder scan beside fuser over the
# real /dev/nvidia* at 1k, 5k and 20k extra processes (bench/scan_cost.py); the usual torch
# tree's teardown vs the floor (5 reps: the CLI's exit beside its FREED line, the settle window
# ending at once when nothing can respawn); the same with 20,000 bystander processes (5 reps; REPS= sets both).
# Results in $OUT. Usage there: bash bench/gpu_scale.sh   (wheels in .whl/, as gpu_final.sh; GPU_TESTS=0
# leaves out the GPU tests)
# shellcheck source=bench/gpu_cli_venv.sh
. "$(dirname "$0")/gpu_cli_venv.sh"
ulimit -u unlimited 2>/dev/null
echo "cores $(nproc), pid_max $(cat /proc/sys/kernel/pid_max)"
if [ "${GPU_TESTS:-1}" = 1 ]; then
    { echo "## pytest -m gpu"; timeout 200 python3 -m pytest -m gpu -rs -q tests/; echo "pytest exit $?"; } \
        > "$OUT/gpu-tests-full.txt" 2>&1
    grep -E "^(FAILED|ERROR|E  )|passed|failed|pytest exit" "$OUT/gpu-tests-full.txt" | tail -8
fi
timeout 200 python3 bench/scan_cost.py --extra 1000 5000 20000 --reps 5 --out "$OUT/scan-vs-fuser.json" 2>&1 \
    | tee "$OUT/scan-vs-fuser.txt"
for by in 0 20000; do
    reps=${REPS:-5}
    timeout 200 env -u PYTHONPATH PYTHONPATH=/tmp/site python3 bench/gpu_teardown.py --reps "$reps" \
        --bystanders "$by" --cli-python /tmp/cli-venv/bin/python --out "$OUT/gpu-teardown-by${by}.json" 2>&1 \
        | grep -v "resource_tracker\|warnings.warn" > "$OUT/gpu-teardown-by${by}.txt"
    grep -E '^rep' "$OUT/gpu-teardown-by${by}.txt" | cut -c1-150
    python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[1].rsplit('/',1)[1], {k: d[k] for k in ('ratio_agent_free_vs_floor','cli_freed_minus_floor_s','cli_exit_minus_floor_s','all_exit_0','settle_s')}, 'floor', round(d['floor_s']['median'],3))" "$OUT/gpu-teardown-by${by}.json"
done
