# gpu-pivot emergency teardown, POSIX sh, for hosts without python3 or without this repo.
# Run as: sh -c "$(cat this file)" gpu-pivot-teardown DEVICE_GLOB GRACE_SECONDS
# Same order as the agent: holders of the GPU device files -> skip protected -> TERM all
# at once -> poll every 50 ms up to GRACE -> KILL what is left -> 2 s settle -> report.
# It says "free" only as root (others' fds are unreadable otherwise) and after the settle.
# It selects by device holders and PIDs only (never a name pattern), skips itself and its
# ancestors, and checks each PID's start time before every signal (no reused PID is hit).
# Report lines end with @@ so scripts/fuser_parse.py can read the PID lists.
set -u
glob=$1
grace=${2:-30}
st() { sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f20; }
state() { sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -c1; }
parent() { sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f2; }
anc=" "
p=$$
while [ -n "$p" ] && [ "$p" -gt 1 ]; do anc="$anc$p "; p=$(parent "$p"); done
protected() {
    [ "$1" = 1 ] && return 0
    case "$anc" in *" $1 "*) return 0 ;; esac
    names="$(cat "/proc/$1/comm" 2>/dev/null) $(tr '\0' '\n' <"/proc/$1/cmdline" 2>/dev/null | head -n 2 | sed 's#.*/##' | tr '\n' ' ')"
    for n in $names; do
        case "$n" in
            # protected names: generated from scripts/agent/contract.py PROTECTED_NAMES (a test keeps them equal)
            Xorg|Xwayland|dcgm-exporter|gpustat|lxc-attach|lxc-monitord|lxc-start|nv-fabricmanager|nv-hostengine|nvidia-cuda-mps-control|nvidia-cuda-mps-server|nvidia-dcgm|nvidia-fabricmanager|nvidia-persiste|nvidia-persistenced|nvidia-smi|nvitop|nvtop|pct|sshd|systemd|*-exporter|*_exporter|sshd*) return 0 ;;
        esac
    done
    return 1
}
holders() {
    if command -v fuser >/dev/null 2>&1; then
        # shellcheck disable=SC2086 # the glob must expand to the device files
        fuser $glob 2>/dev/null
    else
        find /proc/[0-9]*/fd -lname "$glob" 2>/dev/null | cut -d/ -f3
    fi | tr ' ' '\n' | grep -E '^[0-9]+$' | sort -un | tr '\n' ' '
}
alive() { [ "$(st "${1%%:*}")" = "${1#*:}" ] && [ "$(state "${1%%:*}")" != Z ]; }
say() { k=$1; shift; printf '%s:' "$k"; for x in "$@"; do printf ' %6s' "${x%%:*}"; done; printf '@@\n'; }
send() {
    s=$1; shift; sent=""
    for t in "$@"; do alive "$t" && kill "-$s" "${t%%:*}" 2>/dev/null && sent="$sent $t"; done
    # shellcheck disable=SC2086
    say "sig$s" $sent
}
wait_gone() {
    n=0; max=$(($1 * 20)); shift; left="$*"
    while [ -n "$left" ] && [ "$n" -lt "$max" ]; do
        sleep 0.05 2>/dev/null || sleep 1
        n=$((n + 1)); now=""
        for t in $left; do alive "$t" && now="$now $t"; done
        left=$now
    done
}
before=$(holders)
targets=""; prot=""
for p in $before; do
    if protected "$p"; then prot="$prot $p"; else targets="$targets $p:$(st "$p")"; fi
done
echo "==gpu-pivot-oneliner begin=="
# shellcheck disable=SC2086
say holders $before
# shellcheck disable=SC2086
say protected $prot
# shellcheck disable=SC2086
send TERM $targets
# shellcheck disable=SC2086
wait_gone "$grace" $targets
# shellcheck disable=SC2086
[ -n "$left" ] && send KILL $left && wait_gone 5 $left
# settle: the GPUs must stay free for 2 s (a supervisor's respawn is caught, not blessed)
ticks=0; remaining=""
while [ "$ticks" -lt 40 ]; do
    remaining=""
    for p in $(holders); do protected "$p" || remaining="$remaining $p"; done
    [ -n "$remaining" ] && break
    sleep 0.05 2>/dev/null || sleep 1
    ticks=$((ticks + 1))
done
# shellcheck disable=SC2086
say remaining $remaining
busy=0
if command -v nvidia-smi >/dev/null 2>&1; then
    busy=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | grep -cv '^ *0 *$')
    printf 'gpus-with-memory-used: %s@@\n' "$busy"
fi
# as another user than root, other users' open files cannot be read: never say free
uninspected=0
[ "$(id -u)" = 0 ] || { uninspected=1; printf 'not-root: other users%s processes could not be inspected; run as root@@\n' "'"; }
if [ -z "$remaining" ] && [ "$busy" = 0 ] && [ "$uninspected" = 0 ]; then verdict=free; else verdict=not-free; fi
printf 'verdict: %s@@\n' "$verdict"
echo "==gpu-pivot-oneliner end=="
[ "$verdict" = free ]
