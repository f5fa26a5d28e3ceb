#!/usr/bin/env bash
# Everything that needs a real GPU, in one run on the GPU machine (device tool), results in $OUT:
#   GPU tests, status/verify before and after a real load, scan cost, teardown vs floor.
# Usage there: bash bench/gpu_session.sh   (wheels for invoke/dotenv/sh/ClusterShell in .whl/)
set -uo pipefail
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site
fi
export PYTHONUNBUFFERED=1 XDG_STATE_HOME=/tmp/gp-state GPU_PIVOT_HOSTS_FILE=/tmp/gp-hosts.env
echo "LOCAL_PYTHON=python3" > "$GPU_PIVOT_HOSTS_FILE"
inv() { python3 -m invoke "$@"; }
{
  echo "## machine"; nvidia-smi -L; python3 -c 'import torch; print("torch", torch.__version__, torch.cuda.device_count())'
  echo "## ping"; inv ping --host local
  echo "## pytest -m gpu"; python3 -m pytest -m gpu -rs -q -s tests/test_gpu.py
} 2>&1 | tee "$OUT/gpu-tests.txt"
{
  echo "## status/verify before a load"; inv status --host local; inv verify --host local; echo "verify exit $?"
  python3 tests/gpu_tree.py --token demo-load-server --children 3 --gib 20 --ready /tmp/demo.ready &
  while [ ! -f /tmp/demo.ready ]; do sleep 0.2; done
  python3 tests/gpu_monitor.py /tmp/mon.ready & MON=$!
  sleep 1
  echo "## fuser -v /dev/nvidia* under load"; fuser -v /dev/nvidia* 2>&1 | head -30
  echo "## status under load"; inv status --host local
  echo "## verify under load"; inv verify --host local; echo "verify exit $?"
  echo "## plan"; GPU_PIVOT_HOSTS_FILE=/tmp/gp-hosts2.env; printf 'LOCAL_PYTHON=python3\nLOCAL_TARGETS=demo-load-server\n' > /tmp/gp-hosts2.env
  GPU_PIVOT_HOSTS_FILE=/tmp/gp-hosts2.env inv plan --host local
  echo "## teardown"; GPU_PIVOT_HOSTS_FILE=/tmp/gp-hosts2.env inv teardown --host local --yes; echo "teardown exit $?"
  echo "## verify after"; inv verify --host local; echo "verify exit $?"
  echo "## status after"; inv status --host local
  echo "## monitor alive after teardown?"; kill -0 $MON && echo "monitor pid $MON alive"; kill $MON
} 2>&1 | tee "$OUT/gpu-demo.txt"
python3 bench/scan_cost.py --extra 100 1000 5000 --out "$OUT/scan-cost.json" 2>&1 | tee "$OUT/scan-cost.txt"
python3 bench/gpu_teardown.py --reps "${REPS:-5}" --children 3 --gib-per-proc 20 --out "$OUT/gpu-teardown.json" 2>&1 | tee "$OUT/gpu-teardown.txt"
