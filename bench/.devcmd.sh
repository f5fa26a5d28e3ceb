set -uo pipefail
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"
python3 -m venv --without-pip /tmp/cli-venv
SITE=$(/tmp/cli-venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
python3 -m pip install -q --no-index --no-deps --no-cache-dir --target "$SITE" .whl/*.whl
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
timeout 200 env -u PYTHONPATH PYTHONPATH=/tmp/site python3 bench/gpu_teardown.py --reps 5 --cli-python /tmp/cli-venv/bin/python --out "$OUT/t.json" 2>&1 | grep -v "resource_tracker\|warnings.warn" | grep -E '^rep' 
python3 -c "
import json; d=json.load(open('$OUT/t.json'))
for k in ['floor_s','agent_free_at_s','cli_freed_line_s','enter_to_agent_started_s','ratio_agent_free_vs_floor','cli_freed_minus_floor_s']: print(k, d[k])"
timeout 60 python3 bench/cli_probe.py --cli-python /tmp/cli-venv/bin/python --reps 7
for i in 1 2 3; do env -u PYTHONPATH /tmp/cli-venv/bin/python -X importtime -c 'import invoke' 2>&1 | tail -1; done
