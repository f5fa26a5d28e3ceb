#!/usr/bin/env bash
# Issue 15's probe run on the GPU machine (device tool), results in $OUT: the driver's release
# under SIGKILL / SIGTERM / a concurrent NVML open (exit_probe.py), where `import invoke` spends
# its time in the CLI's own venv, and the teardown benchmark with Enter -> agent start.
# Usage there: bash bench/gpu_exit_probe.sh   (wheels for invoke/dotenv/ClusterShell in .whl/)
# shellcheck source=bench/gpu_cli_venv.sh
. "$(dirname "$0")/gpu_cli_venv.sh"
nproc; python3 --version; /tmp/cli-venv/bin/python --version
for i in 1 2 3 4 5; do /tmp/cli-venv/bin/python -X importtime -c 'import invoke' 2>"$OUT/importtime-invoke-$i.txt"; done
sort -t'|' -k2 -n "$OUT/importtime-invoke-5.txt" | tail -12
python3 -X importtime -c 'import pynvml' 2>&1 | tail -1
timeout 250 python3 bench/exit_probe.py --reps "${REPS:-5}" --out "$OUT/exit-probe.json" 2>&1 \
    | grep -v "resource_tracker\|warnings.warn" | tail -30
timeout 200 env -u PYTHONPATH PYTHONPATH=/tmp/site python3 bench/gpu_teardown.py --reps "${REPS:-5}" \
    --cli-python /tmp/cli-venv/bin/python --out "$OUT/gpu-teardown-probe.json" 2>&1 \
    | grep -v "resource_tracker\|warnings.warn" | grep -E '^rep|targets|median|enter' | head -30
