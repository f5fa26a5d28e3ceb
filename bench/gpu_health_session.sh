#!/usr/bin/env bash
# Issue 14 on the GPU machine (device tool), results in $OUT: the GPU health verdicts with the
# NVML answers behind them, the reset preconditions (dry run only: nothing is reset), and the
# CUDA MPS scenario (server with a live torch client, then none, then `teardown --mps quit`).
# Usage there: bash bench/gpu_health_session.sh   (wheels for invoke/dotenv/ClusterShell in .whl/)
set -uo pipefail
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site
fi
export PYTHONUNBUFFERED=1 XDG_STATE_HOME=/tmp/gp-state GPU_PIVOT_HOSTS_FILE=/tmp/gp-health-hosts.env
echo "LOCAL_PYTHON=python3" > "$GPU_PIVOT_HOSTS_FILE"
inv() { timeout 120 python3 -m invoke "$@"; }
N=$(nvidia-smi -L | wc -l)
{
  echo "## machine"; nvidia-smi -L; nvidia-smi --query-gpu=index,driver_version,persistence_mode,mig.mode.current \
      --format=csv,noheader
  echo "## raw NVML answers behind the verdict (GPU 0)"
  python3 -c 'import pynvml as n
n.nvmlInit(); h = n.nvmlDeviceGetHandleByIndex(0)
fv = n.nvmlDeviceGetFieldValues(h, [230])[0]
print("field 230 (recovery action): return", fv.nvmlReturn, "value", fv.value.uiVal)
print("remapped rows", n.nvmlDeviceGetRemappedRows(h), "mig mode", n.nvmlDeviceGetMigMode(h))
print("display mode", n.nvmlDeviceGetDisplayMode(h), "display active", n.nvmlDeviceGetDisplayActive(h),
      "persistence mode", n.nvmlDeviceGetPersistenceMode(h))'
  echo "## pytest -m gpu tests/system/test_gpu_health.py"
  timeout 900 python3 -m pytest -m gpu -rs -q -s tests/system/test_gpu_health.py; echo "pytest exit $?"
  echo "## verify --json (health per GPU)"
  inv verify --host local --json | python3 -c 'import json, sys
d = json.load(sys.stdin)["local"]
print(json.dumps({"exit_code": d["exit_code"], "health": [dict(gpu=g["index"], **g["health"]) for g in d["gpus"]]},
                 indent=1))'
  echo "## status"; inv status --host local; echo "status exit $?"
  echo "## reset --gpu 0 (dry run: preconditions only, nothing is reset)"; inv reset --host local --gpu 0
  echo "reset dry-run exit $?"
  echo "## Xid lines in the kernel log since boot"; dmesg 2>/dev/null | grep -c "NVRM: Xid"
} 2>&1 | tee "$OUT/gpu-health-${N}gpu.txt"
{
  echo "## CUDA MPS by hand: daemon, torch client, status, client gone, verify, teardown --mps quit"
  PIPE=/tmp/gp-mps-demo; mkdir -p "$PIPE" /tmp/gp-mps-log; chmod 700 "$PIPE"
  printf 'LOCAL_PYTHON=python3\nLOCAL_TARGETS=mps_demo_client\nLOCAL_SCOPE=gp-mps-demo\n' > /tmp/gp-mps-hosts.env
  export CUDA_MPS_PIPE_DIRECTORY=$PIPE CUDA_MPS_LOG_DIRECTORY=/tmp/gp-mps-log
  nvidia-cuda-mps-control -d; echo "mps control -d exit $?"
  cat > /tmp/mps_demo_client.py <<'PY'
import os, sys, time, torch
x = torch.ones(64 * 2**20, device="cuda:0"); torch.cuda.synchronize()
open("/tmp/mps-demo.ready", "w").close(); time.sleep(3600)
PY
  rm -f /tmp/mps-demo.ready
  python3 /tmp/mps_demo_client.py gp-mps-demo >/tmp/mps-demo-client.log 2>&1 & CLIENT=$!
  for _ in $(seq 600); do [ -f /tmp/mps-demo.ready ] && break; kill -0 $CLIENT 2>/dev/null || break; sleep 0.2; done
  echo "## status with the client"; GPU_PIVOT_HOSTS_FILE=/tmp/gp-mps-hosts.env inv status --host local
  kill -9 $CLIENT; wait $CLIENT 2>/dev/null; sleep 2
  echo "## status, client gone"; GPU_PIVOT_HOSTS_FILE=/tmp/gp-mps-hosts.env inv status --host local
  echo "## verify, idle MPS server"; GPU_PIVOT_HOSTS_FILE=/tmp/gp-mps-hosts.env inv verify --host local
  echo "verify exit $?"
  echo "## teardown --mps quit"
  GPU_PIVOT_HOSTS_FILE=/tmp/gp-mps-hosts.env inv teardown --host local --yes --mps quit --timeout 30
  echo "teardown exit $?"
  echo "## verify after"; inv verify --host local --wait 10; echo "verify exit $?"
  pgrep -a nvidia-cuda-mps || echo "no MPS process left"
  echo quit | timeout 10 nvidia-cuda-mps-control 2>/dev/null  # if the teardown did not quit it
} 2>&1 | tee "$OUT/gpu-mps-${N}gpu.txt"
