#!/usr/bin/env bash
# Everything that needs a real GPU, in one run on the GPU machine (device tool), results in $OUT:
#   GPU tests, status/verify before and after a real load, scan cost, teardown vs floor.
# Usage there: bash bench/gpu_session.sh   (wheels for invoke/dotenv/ClusterShell in .whl/)
set -uo pipefail
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site
fi
export PYTHONUNBUFFERED=1 XDG_STATE_HOME=/tmp/gp-state GPU_PIVOT_HOSTS_FILE=/tmp/gp-hosts.env
echo "LOCAL_PYTHON=python3" > "$GPU_PIVOT_HOSTS_FILE"
inv() { python3 -m invoke "$@"; }
N=$(nvidia-smi -L | wc -l)  # results are named by GPU count: *-1gpu.*, *-2gpu.*
{
  echo "## machine"; nvidia-smi -L; python3 -c 'import torch; print("torch", torch.__version__, torch.cuda.device_count())'
  echo "## ping"; inv ping --host local
  echo "## pytest -m gpu"; python3 -m pytest -m gpu -rs -q -s tests/system/test_gpu.py
} 2>&1 | tee "$OUT/gpu-tests-${N}gpu.txt"
{
  echo "## status/verify before a load"; inv status --host local; inv verify --host local; echo "verify exit $?"
  python3 tests/support/gpu_tree.py --token demo-load-server --children 3 --gib 20 --ready /tmp/demo.ready >/tmp/demo.log 2>&1 &
  while [ ! -f /tmp/demo.ready ]; do sleep 0.2; done
  python3 tests/support/gpu_monitor.py /tmp/mon.ready >/tmp/mon.log 2>&1 & MON=$!
  sleep 1
  echo "## fuser -v /dev/nvidia* under load"; fuser -v /dev/nvidia* 2>&1 | head -30
  echo "## status under load"; inv status --host local
  echo "## verify under load"; inv verify --host local; echo "verify exit $?"
  echo "## plan"; printf 'LOCAL_PYTHON=python3\nLOCAL_TARGETS=gpu_tree\\.py\nLOCAL_SCOPE=demo-load-server\n' > /tmp/gp-hosts2.env
  GPU_PIVOT_HOSTS_FILE=/tmp/gp-hosts2.env inv plan --host local
  echo "## teardown"; GPU_PIVOT_HOSTS_FILE=/tmp/gp-hosts2.env inv teardown --host local --yes; echo "teardown exit $?"
  echo "## verify after"; inv verify --host local; echo "verify exit $?"
  echo "## status after"; inv status --host local
  echo "## monitor alive after teardown?"; kill -0 $MON && echo "monitor pid $MON alive"; kill $MON
} 2>&1 | tee "$OUT/gpu-demo-${N}gpu.txt"
{
  echo "## pivot on the GPU: a torch 'server' tree -> a GPU training-job phase (setsid path; no systemd here)"
  mkdir -p /tmp/extracted && for i in 1 2 3 4; do : > /tmp/extracted/sample_$i.pt; done
  cat > /tmp/gp-pivot.env <<ENV
LOCAL_PYTHON=python3
LOCAL_TARGETS='gpu_tree\.py'
LOCAL_SCOPE=--token
LOCAL_PHASE_TRAIN_ARGV='["python3", "$PWD/tests/support/gpu_tree.py", "--token", "train-job", "--children", "1", "--gib", "10", "--ready", "/tmp/train.ready"]'
LOCAL_PHASE_TRAIN_DIR=$PWD
LOCAL_PHASE_TRAIN_READY=holding
LOCAL_PHASE_TRAIN_READY_TIMEOUT=300
LOCAL_PHASE_TRAIN_GATES='[{"glob": "/tmp/extracted/*.pt", "min": 4}, "test -d /tmp/extracted"]'
ENV
  python3 tests/support/gpu_tree.py --token torch-server --children 3 --gib 20 --ready /tmp/srv.ready >/tmp/srv.log 2>&1 & SRV=$!
  while [ ! -f /tmp/srv.ready ]; do sleep 0.2; done
  export GPU_PIVOT_HOSTS_FILE=/tmp/gp-pivot.env
  inv status --host local
  inv pivot --host local --to train --dry-run
  inv pivot --host local --to train --yes; echo "pivot exit $?"
  sleep 8; inv status --host local
  inv logs --host local --phase train --lines 5
  inv stop --host local --phase train; echo "stop exit $?"
  inv verify --host local --wait 10; echo "verify exit $?"
  inv audit --lines 12
  kill -9 "$SRV" 2>/dev/null  # if the pivot did not stop it, later benches would wait on its memory
  # (every background process here writes to a file, not to the tee pipe: one left alive
  # would keep the pipe open and the block would never end)
} 2>&1 | tee "$OUT/gpu-pivot-${N}gpu.txt"
python3 bench/scan_cost.py --extra 100 1000 5000 --out "$OUT/scan-cost-${N}gpu.json" 2>&1 | tee "$OUT/scan-cost-${N}gpu.txt"
python3 bench/gpu_teardown.py --reps "${REPS:-5}" --children 3 --gib-per-proc 20 --out "$OUT/gpu-teardown-${N}gpu.json" 2>&1 | tee "$OUT/gpu-teardown-${N}gpu.txt"
