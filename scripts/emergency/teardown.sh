# gpu-pivot emergency teardown, POSIX sh, for hosts without python3 or without this repo.
# Run as: sh -c "$(cat this file)" gpu-pivot-teardown DEVICE_GLOB GRACE_SECONDS SETTLE_SECONDS
# (whole seconds; scripts/emergency/shell_teardown.py passes the agent's defaults, scripts/agent/waits.py).
# Same order as the agent: holders of the GPU device files -> skip protected -> TERM all
# at once -> poll every 50 ms up to GRACE -> KILL what is left -> SETTLE s settle -> report.
# It says "free" only as root (others' fds are unreadable otherwise) and after the settle.
# It selects by device holders and PIDs only (never a name pattern), skips itself and its
# ancestors, and checks each PID's start time before every signal (no reused PID is hit).
# A name protects only a process of system uids running a root-owned program (as the agent's
# rules.trusted_names), and a protected process that maps a device file (a CUDA context) keeps
# the verdict not-free, as the agent's verify does.
# Report lines end with @@ so scripts/emergency/fuser_parse.py can read the PID lists.
set -u
# -f: no pathname expansion anywhere (a process's name such as `*` stays text); holders() turns
# it back on in its own subshell for the device glob only.
set -f
if [ $# -ne 3 ]; then
    echo "usage: sh -c SCRIPT gpu-pivot-teardown DEVICE_GLOB GRACE_SECONDS SETTLE_SECONDS" >&2
    exit 2
fi
glob=$1
grace=$2
settle=$3
case "${grace:-x}${settle:-x}" in *[!0-9]*)
    echo "GRACE_SECONDS and SETTLE_SECONDS: whole seconds (got \"$grace\" \"$settle\"); nothing was signalled" >&2
    exit 2 ;;
esac
st() { sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f20; }
state() { sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -c1; }
parent() { sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f2; }
anc=" "
p=$$
while [ -n "$p" ] && [ "$p" -gt 1 ]; do anc="$anc$p "; p=$(parent "$p"); done
# A person's first uid (login.defs UID_MIN, 1000 where it says none), as scripts/agent/teardown/rules.py uid_min.
uid_min=$(awk '$1 == "UID_MIN" && $2 ~ /^[0-9]+$/ { v = $2 } END { print v }' /etc/login.defs 2>/dev/null)
case "$uid_min" in '' | *[!0-9]*) uid_min=1000 ;; esac
# May this process's names protect it? As rules.trusted_names: every uid (real, effective, saved,
# fs) is a system uid - no user can take one - and its executable is a root-owned regular file
# that group and others cannot write. Anyone can call a program Xorg or nvitop.
trusted() {
    ids=$(sed -n 's/^Uid:[[:space:]]*//p' "/proc/$1/status" 2>/dev/null)
    [ -n "$ids" ] || return 1
    # the kernel writes this line (digits and tabs): splitting it is safe
    for u in $ids; do
        case "$u" in *[!0-9]*) return 1 ;; esac
        [ "$u" -lt "$uid_min" ] || return 1
    done
    exe=$(stat -L -c '%u %a %F' "/proc/$1/exe" 2>/dev/null) || {
        # not root: another user's executable cannot be read; such an agent cannot signal it either
        [ "$(id -u)" != 0 ] && return 0
        return 1
    }
    case "$exe" in
        "0 "*[2367]" regular file" | "0 "*[2367]?" regular file") return 1 ;;
        "0 "*" regular file") return 0 ;;
    esac
    return 1
}
# The names a process goes by: its comm and the last part of its argv[0], never its arguments
# (`python3 ~/nvitop` is python3). Each is matched whole (a comm "x Xorg" is not Xorg).
comm_of() { cat "/proc/$1/comm" 2>/dev/null; }
arg0_of() { tr '\n\0' '?\n' <"/proc/$1/cmdline" 2>/dev/null | head -n 1 | sed 's#.*/##'; }
protected_name() {
    case "$1" in
        # protected names: generated from scripts/agent/contract.py PROTECTED_NAMES (a test keeps them equal)
        Xorg|Xwayland|dcgm-exporter|gpustat|lxc-attach|lxc-monitord|lxc-start|nv-fabricmanager|nv-hostengine|nvidia-cuda-mps-control|nvidia-cuda-mps-server|nvidia-dcgm|nvidia-fabricmanager|nvidia-persiste|nvidia-persistenced|nvidia-smi|nvitop|nvtop|pct|sshd|systemd|*-exporter|*_exporter|sshd*) return 0 ;;
    esac
    return 1
}
protected() {
    [ "$1" = 1 ] && return 0
    case "$anc" in *" $1 "*) return 0 ;; esac
    trusted "$1" || return 1
    protected_name "$(comm_of "$1")" || protected_name "$(arg0_of "$1")"
}
# Does this (protected) process map a device file: a CUDA context, which keeps GPU memory
# (as scripts/agent/teardown/verify.evaluate; the MPS control daemon maps and holds none).
maps_device() {
    [ "$(comm_of "$1")" = nvidia-cuda-mps-control ] && return 1
    while read -r _ _ _ _ _ path; do
        # shellcheck disable=SC2254 # the device glob is a pattern here
        case "$path" in $glob | $glob" (deleted)") return 0 ;; esac
    done <"/proc/$1/maps" 2>/dev/null
    return 1
}
holders() {
    (
    set +f
    if command -v fuser >/dev/null 2>&1; then
        # shellcheck disable=SC2086 # the glob must expand to the device files
        fuser $glob 2>/dev/null
    else
        find /proc/[0-9]*/fd -lname "$glob" 2>/dev/null | cut -d/ -f3
    fi
    ) | tr ' ' '\n' | grep -E '^[0-9]+$' | sort -un | tr '\n' ' '
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
# settle: the GPUs must stay free for SETTLE s (a supervisor's respawn is caught, not blessed)
# it looks at least once, whatever SETTLE is: a SETTLE of 0 must not skip the look
ticks=0; remaining=""; looks=$((settle * 20)); [ "$looks" -gt 0 ] || looks=1
while [ "$ticks" -lt "$looks" ]; do
    remaining=""
    for p in $(holders); do protected "$p" || remaining="$remaining $p"; done
    [ -n "$remaining" ] && break
    sleep 0.05 2>/dev/null || sleep 1
    ticks=$((ticks + 1))
done
# shellcheck disable=SC2086
say remaining $remaining
mapped=""
for p in $prot; do alive "$p:$(st "$p")" && maps_device "$p" && mapped="$mapped $p"; done
# shellcheck disable=SC2086
say protected-mapped $mapped
busy=0
if command -v nvidia-smi >/dev/null 2>&1; then
    busy=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | grep -cv '^ *0 *$')
    printf 'gpus-with-memory-used: %s@@\n' "$busy"
fi
# as another user than root, other users' open files cannot be read: never say free
uninspected=0
[ "$(id -u)" = 0 ] || { uninspected=1; printf 'not-root: other users%s processes could not be inspected; run as root@@\n' "'"; }
if [ -z "$remaining" ] && [ -z "$mapped" ] && [ "$busy" = 0 ] && [ "$uninspected" = 0 ]; then verdict=free; else verdict=not-free; fi
printf 'verdict: %s@@\n' "$verdict"
echo "==gpu-pivot-oneliner end=="
[ "$verdict" = free ]
