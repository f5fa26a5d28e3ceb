#!/usr/bin/env bash
# Start-up costs on the GPU machine, for issue 15 (what sits between Enter and the first signal):
# interpreter start with and without site, the agent bundle's start, and where its imports go.
# Usage there (after the wheels are on PYTHONPATH, as in gpu_session.sh): bash bench/gpu_probe.sh
set -u
t() { local s; s=$(date +%s.%N); eval "$1" >/dev/null 2>&1; python3 -S -c "print(round($(date +%s.%N) - $s, 3))"; }
med3() { for _ in 1 2 3; do t "$1"; done | sort -n | sed -n 2p; }
python3 -c "from scripts.reach import bundle; open('/tmp/gp-payload.py', 'wb').write(bundle.agent_payload())"
for what in "python3 -c pass" "python3 -S -c pass" "python3 -I -c pass" "python3 -c 'import invoke'" \
            "python3 -m invoke --list" "python3 - ping --json < /tmp/gp-payload.py" \
            "python3 - teardown --help < /tmp/gp-payload.py"; do
    echo "$what: $(med3 "$what") s (median of 3, includes this shell's fork)"
done
echo "## agent bundle imports (teardown --help), cumulative us, top 12"
python3 -X importtime - teardown --help < /tmp/gp-payload.py 2>&1 >/dev/null | sort -t'|' -k2 -n | tail -12
echo "## python3 -c pass imports (site), top 6"
python3 -X importtime -c pass 2>&1 | sort -t'|' -k2 -n | tail -6
