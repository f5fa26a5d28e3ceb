#!/usr/bin/env bash
# make test-stress [RUNS=5]: run `make test` RUNS times in a row on a machine made busy the way
# issue 25 found it, and write what happened (wall time, passed/failed of each run) to
# bench/results/local-stress-<date>.md (git-ignored; README.md keeps the numbers of record).
#
# The load, started before the first run and ended (by process group, each its own) after the last:
#   - a CPU hog on every core (`nproc` busy loops);
#   - a process whose argv[0] is empty (`exec -a '' sleep`);
#   - a foreign holder of fake devices: it maps /dev/zero, whose numbers the Slurm and identity
#     tests give their fake GPUs, and holds a plain file named nvidia0;
#   - another root's teardown in a loop: `invoke teardown --host local` with the default root
#     paths (the lock in /run/gpu-pivot), in a mount namespace whose /run is its own tmpfs, scoped
#     to its own directory and to its own target's token, so it can stop only what it started.
# The machine's gpu-pivot state (/run/gpu-pivot, /var/lib/gpu-pivot, ~/.local/state/gpu-pivot)
# is fingerprinted before and after: the summary says whether it is byte-for-byte the same.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
repo=$(pwd)
runs=${1:-5}
py=${PYTHON:-$repo/.venv/bin/python}
work=$(mktemp -d /tmp/gpu-pivot-stress.XXXXXX)
chmod 755 "$work"
token="gpvstress$$"
groups=()
cleanup() {
    for g in "${groups[@]}"; do kill -KILL -- "-$g" 2>/dev/null; done
    for g in "${groups[@]}"; do while kill -0 -- "-$g" 2>/dev/null; do sleep 0.1; done; done
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Each load process leads a process group of its own (setsid in a non-interactive shell execs in
# place, so its pid is its pgid): the cleanup signals those groups and nothing else.
start() { setsid "$@" </dev/null >/dev/null 2>&1 & groups+=("$!"); }

state_fingerprint() {
    local d
    for d in /run/gpu-pivot /var/lib/gpu-pivot "$(getent passwd "$(id -u)" | cut -d: -f6)/.local/state/gpu-pivot"; do
        if [ -e "$d" ]; then
            find "$d" -printf '%p %y %s %m %T@\n' 2>/dev/null | sort
            find "$d" -type f -print0 2>/dev/null | sort -z | xargs -0 -r sha256sum 2>/dev/null
        else
            echo "$d absent"
        fi
    done | sha256sum | cut -c1-16
}

mkdir -p "$work/dev" "$work/xdg" bench/results
: > "$work/dev/nvidia0"
: > "$work/dev/nvidia1"
printf 'LOCAL_DEVICES=%s/dev/nvidia*\nLOCAL_FAKE_DEVICES=yes\nLOCAL_SCOPE=%s\nLOCAL_TARGETS=%s\n' \
    "$work" "$work" "$token" > "$work/hosts.env"
chmod 600 "$work/hosts.env"
cat > "$work/teardown-loop.sh" <<EOF
#!/bin/sh
# runs with /run as its own tmpfs: as root, gpu-pivot's lock and state are /run/gpu-pivot there
export GPU_PIVOT_HOSTS_FILE=$work/hosts.env XDG_STATE_HOME=$work/xdg
cd $repo
while :; do
    $py -c 'import sys, time; f = open(sys.argv[1], "rb"); time.sleep(600)' $work/dev/nvidia0 $token &
    sleep 0.5
    $py -m invoke teardown --host local --yes --grace 1 --settle 0.2 >/dev/null 2>&1
    wait
done
EOF

before=$(state_fingerprint)
# HOG_NICE: the hogs' niceness (0: they compete with the tests as equals; 10 leaves the tests
# most of the CPU, for a quicker run on a machine someone else is also using)
for _ in $(seq "$(nproc)"); do start nice -n "${HOG_NICE:-0}" sh -c 'while :; do :; done'; done
start bash -c "exec -a '' sleep 100000"
start "$py" -c 'import mmap, sys, time
z = open("/dev/zero", "rb")
m = mmap.mmap(z.fileno(), 4096, prot=mmap.PROT_READ)
f = open(sys.argv[1], "rb")
time.sleep(100000)' "$work/dev/nvidia0"
start unshare --mount --propagation private sh -c "mount -t tmpfs -o mode=755 gpu-pivot-stress /run && exec sh $work/teardown-loop.sh"
sleep 2
echo "load: $(nproc) CPU hogs (nice ${HOG_NICE:-0}), an empty argv[0], a /dev/zero mapper, a root teardown loop (groups ${groups[*]})"

out="bench/results/local-stress-$(date -u +%Y%m%d-%H%M%S).md"
{
    echo "# make test under load, $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) CPUs, commit $(git rev-parse --short HEAD)"
    echo
    echo "Load: a CPU hog per core (nice ${HOG_NICE:-0}), a process with an empty argv[0], a process mapping /dev/zero and"
    echo "holding a fake nvidia0, another root teardown in a loop (bench/stress_tests.sh)."
    echo
    echo "| run | wall | passed | failed | errors | skipped | exit |"
    echo "| --- | --- | --- | --- | --- | --- | --- |"
} > "$out"
green=0
for i in $(seq "$runs"); do
    log="$work/run-$i.log"
    t0=$(date +%s.%N)
    make test > "$log" 2>&1
    code=$?
    t1=$(date +%s.%N)
    wall=$(awk -v a="$t0" -v b="$t1" 'BEGIN { s = b - a; printf "%dm%02ds", s / 60, s % 60 }')
    last=$(grep -E '^=* ?[0-9]+ (passed|failed)|^=* ?[0-9]+ (passed|failed|error)' "$log" | tail -1)
    count() { echo "$last" | grep -oE "[0-9]+ $1" | grep -oE '^[0-9]+' || echo 0; }
    row="| $i | $wall | $(count passed) | $(count failed) | $(count error) | $(count skipped) | $code |"
    echo "$row" | tee -a "$out"
    [ "$code" = 0 ] && green=$((green + 1))
    if [ "$code" != 0 ]; then
        grep -E '^(FAILED|ERROR) ' "$log" | sed 's/^/    /' | tee -a "$out"
        cp "$log" "bench/results/local-stress-run-$i.log"
    fi
done
after=$(state_fingerprint)
{
    echo
    echo "$green of $runs runs green."
    if [ "$before" = "$after" ]; then
        echo "The machine's gpu-pivot state (/run/gpu-pivot, /var/lib/gpu-pivot, ~/.local/state/gpu-pivot): byte-for-byte as before."
    else
        echo "The machine's gpu-pivot state CHANGED during the runs ($before -> $after): a test, or someone else on this machine, wrote there."
    fi
} | tee -a "$out"
echo "written: $out"
[ "$green" = "$runs" ]
