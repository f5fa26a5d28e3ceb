# Sourced by the GPU runs (gpu_final.sh, gpu_exit_probe.sh) on the device machine: $OUT, and the
# operator's CLI in its own venv as `make setup` makes one (/tmp/cli-venv: no system
# site-packages, whose .pth files on the GPU image cost ~55 ms a start an operator's venv does
# not pay), plus the same wheels under /tmp/site for the system python3 that runs the tests and
# the agent (it has pynvml, as a GPU host does). Wheels for invoke/dotenv/ClusterShell in .whl/.
# shellcheck shell=bash
set -uo pipefail
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"
python3 -m venv --without-pip /tmp/cli-venv
SITE=$(/tmp/cli-venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
python3 -m pip install -q --no-index --no-deps --no-cache-dir --upgrade --target "$SITE" .whl/*.whl
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
# With .whl-alt/ (another Invoke wheel): /tmp/cli-venv-alt, the same CLI venv with that Invoke
# instead, for bench/cli_probe.py --against-python (the pin's cost side by side in one run).
if ls .whl-alt/invoke-*.whl >/dev/null 2>&1; then
    python3 -m venv --without-pip /tmp/cli-venv-alt
    ALT=$(/tmp/cli-venv-alt/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    WHEELS=(.whl-alt/invoke-*.whl)
    for w in .whl/*.whl; do case $w in .whl/invoke-*) ;; *) WHEELS+=("$w") ;; esac; done
    python3 -m pip install -q --no-index --no-deps --no-cache-dir --upgrade --target "$ALT" "${WHEELS[@]}"
fi
export OUT PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
