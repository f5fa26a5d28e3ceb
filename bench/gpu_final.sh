#!/usr/bin/env bash
# The closing GPU run (device tool, a 2-GPU host), results in $OUT: the GPU tests, the health
# and MPS session, and the teardown-vs-floor benchmark for 1 GPU (CUDA_VISIBLE_DEVICES=0) and
# 2 GPUs. The operator's CLI runs from its own venv as `make setup` makes one (no system
# site-packages: the GPU image's .pth files cost ~55 ms a start that an operator's venv does not
# pay); the agent runs on the system python3 that has pynvml, as on a GPU host.
# Usage there: bash bench/gpu_final.sh   (wheels for invoke/dotenv/ClusterShell in .whl/; another
# Invoke wheel in .whl-alt/ adds bench/cli_probe.py's side-by-side of the two)
# shellcheck source=bench/gpu_cli_venv.sh
. "$(dirname "$0")/gpu_cli_venv.sh"
{ echo "## pytest -m gpu"; timeout 200 python3 -m pytest -m gpu -rs -q tests/; echo "pytest exit $?"; } \
    > "$OUT/gpu-tests-full.txt" 2>&1  # whole: a failure's traceback comes before its captured output
grep -E "^(FAILED|ERROR|E  )|passed|failed|pytest exit" "$OUT/gpu-tests-full.txt" | tail -15 | tee "$OUT/gpu-tests.txt"
N=$(nvidia-smi -L | wc -l)
for n in $(printf "%s\n" 1 "$N" | sort -un); do
    if [ "$n" = 1 ]; then export CUDA_VISIBLE_DEVICES=0; else unset CUDA_VISIBLE_DEVICES; fi
    timeout 200 env -u PYTHONPATH PYTHONPATH=/tmp/site python3 bench/gpu_teardown.py --reps "${REPS:-5}" \
        --cli-python /tmp/cli-venv/bin/python --out "$OUT/gpu-teardown-${n}gpu.json" 2>&1 \
        | grep -v "resource_tracker\|warnings.warn" | tail -40 > "$OUT/gpu-teardown-${n}gpu.txt"
    grep -E '^rep|targets|median' "$OUT/gpu-teardown-${n}gpu.txt" | head -20
done
unset CUDA_VISIBLE_DEVICES
if [ -x /tmp/cli-venv-alt/bin/python ]; then  # the Invoke pin's cost, both CLI venvs alternately
    timeout 120 python3 bench/cli_probe.py --cli-python /tmp/cli-venv/bin/python \
        --against-python /tmp/cli-venv-alt/bin/python --reps 15 > "$OUT/cli-probe.txt" 2>&1
    cat "$OUT/cli-probe.txt"
fi
if [ "${HEALTH:-1}" = 1 ]; then timeout 150 bash bench/gpu_health_session.sh >/dev/null 2>&1; echo "health session exit $?"; else echo "health session: skipped (HEALTH=0)"; fi
ls "$OUT"
