# gpu-pivot emergency teardown, POSIX sh, for hosts without python3 or without this repo.
# Run as: sh -c "$(cat this file)" gpu-pivot-teardown DEVICE_GLOB SCOPE SCOPE_UID TARGETS TARGETS_SPACED PROTECT GRACE_SECONDS SETTLE_SECONDS
# scripts/emergency/shell_teardown.py passes the host's hosts.env values (TARGETS and PROTECT as
# POSIX EREs, scripts/emergency/ere.py; TARGETS split into single names and `program subcommand`
# names, as the agent's program.match; an empty SCOPE, SCOPE_UID or PROTECT: none) and the
# agent's waits in whole seconds (scripts/agent/wire/defaults.py).
# Same selection as the agent (scripts/agent/teardown/plan.py), by device holders and program
# names, never by a command-line pattern: the holders of the GPU device files and the processes
# whose PROGRAM a TARGETS pattern names whole (comm, argv[0], the module or script an
# interpreter runs, `program subcommand`) are targets, and what those programs started (their
# trees; not what they left in their session, not their wrappers), unless protected (PID 1, itself and its
# ancestors, a protected name, a command line PROTECT finds) or outside the scope (SCOPE: text
# the command line must contain; SCOPE_UID: the owner); a holder outside the scope is reported,
# never signalled, and keeps the verdict not-free.
# Same order as the agent: TERM all at once -> poll every 50 ms up to GRACE, saying who it waits
# for each second -> KILL what is left -> SETTLE s settle -> report.
# It says "free" only as root (others' fds are unreadable otherwise) and after the settle; where no
# device file matches the glob and nvidia-smi lists no GPU it says "NO GPU VISIBLE", exit 1, as the agent.
# It checks each PID's start time before every signal (no reused PID is hit).
# A name protects only a process of system uids running a root-owned program (as the agent's
# rules.trusted_names), and a protected process that maps a device file (a CUDA context) keeps
# the verdict not-free, as the agent's verify does.
# Every process is printed as `PID (NAME)`, NAME its comm with anything but [A-Za-z0-9._:+@=-]
# shown as `?` (so it is one word and a report line stays one line); each is also printed on a
# line of its own with why it is signalled or kept and its command line (cut to 100 characters).
set -u
# -f: no pathname expansion anywhere (a process's name such as `*` stays text); holders() and
# listing() turn it back on in their own subshells for /proc and the device glob only.
set -f
# byte ranges and classes in grep -E, as ere.py writes them
LC_ALL=C
export LC_ALL
if [ $# -ne 8 ]; then
    echo "usage: sh -c SCRIPT gpu-pivot-teardown DEVICE_GLOB SCOPE SCOPE_UID TARGETS TARGETS_SPACED PROTECT GRACE_SECONDS SETTLE_SECONDS" >&2
    exit 2
fi
glob=$1
scope=$2
scope_uid=$3
tw=$4
ts=$5
protect=$6
grace=$7
settle=$8
case "${grace:-x}${settle:-x}" in *[!0-9]*)
    echo "GRACE_SECONDS and SETTLE_SECONDS: whole seconds (got \"$grace\" \"$settle\"); nothing was signalled" >&2
    exit 2 ;;
esac
case "$scope_uid" in *[!0-9]*)
    echo "SCOPE_UID: a uid (got \"$scope_uid\"); nothing was signalled" >&2
    exit 2 ;;
esac
# A pattern this grep cannot read, or one that matches an empty name (it would name every process).
for re in "TARGETS=$tw" "TARGETS_SPACED=$ts" "PROTECT=$protect"; do
    [ -n "${re#*=}" ] || continue
    printf '\n' | grep -E -e "${re#*=}" >/dev/null 2>&1
    case $? in
        0) echo "${re%%=*} \"${re#*=}\": matches the empty string; nothing was signalled" >&2; exit 2 ;;
        1) ;;
        *) echo "${re%%=*} \"${re#*=}\": this host's grep -E cannot read it; nothing was signalled" >&2; exit 2 ;;
    esac
done
tab=$(printf '\t')
# Field $2 of /proc/PID/stat after the comm: the file read whole (a comm may hold a line break),
# the comm ending at its last ") ".
statf() { awk -v n="$2" '{ s = s $0 " " } END { sub(/.*\) /, "", s); split(s, f, " "); print f[n] }' "/proc/$1/stat" 2>/dev/null; }
st() { statf "$1" 20; }
state() { statf "$1" 1; }
parent() { statf "$1" 2; }
anc=" "
p=$$
while [ -n "$p" ] && [ "$p" -gt 1 ]; do anc="$anc$p "; p=$(parent "$p"); done
# A person's first uid (login.defs UID_MIN, 1000 where it says none), as scripts/agent/policy/rules.py uid_min.
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
# The names a process goes by for the protect list: its comm and the last part of its argv[0],
# never its arguments (`python3 ~/nvitop` is python3). Each is matched whole (a comm "x Xorg" is not Xorg).
comm_of() { cat "/proc/$1/comm" 2>/dev/null; }
arg0_of() { tr '\n\0' '?\n' <"/proc/$1/cmdline" 2>/dev/null | head -n 1 | sed 's#.*/##'; }
# The command line as the agent matches PROTECT and SCOPE on it: the arguments joined by spaces
# (a line break in one read as ?), `[comm]` when there are none.
cmd_of() {
    c=$(tr '\000\n' ' ?' <"/proc/$1/cmdline" 2>/dev/null)
    [ -n "$c" ] || c="[$(comm_of "$1")]"
    printf '%s\n' "${c% }"
}
# For people: one word, one line (anything else shown as ?), and the command line cut.
name_of() { c=$(comm_of "$1"); printf '%s\n' "$c" | tr '\n' '?' | sed 's/?$//; s/[^A-Za-z0-9._:+@=-]/?/g'; }
shown() { printf '%s\n' "$1" | sed 's/[^ -~]/?/g' | cut -c1-100; }
protected_name() {
    case "$1" in
        # protected names: generated from scripts/agent/policy/builtin.py PROTECTED_NAMES (a test keeps them equal)
        Xorg|Xwayland|dcgm-exporter|gpustat|lxc-attach|lxc-monitord|lxc-start|nv-fabricmanager|nv-hostengine|nvidia-cuda-mps-control|nvidia-cuda-mps-server|nvidia-dcgm|nvidia-fabricmanager|nvidia-persiste|nvidia-persistenced|nvidia-smi|nvitop|nvtop|pct|sshd|systemd|*-exporter|*_exporter|sshd*) return 0 ;;
    esac
    return 1
}
# Why this process is never signalled (in $why), as the agent's rules.protect_reason.
protected() {
    why=""
    if [ "$1" = 1 ]; then why="PID 1"; return 0; fi
    case "$anc" in *" $1 "*) why="this shell or its ancestor"; return 0 ;; esac
    if trusted "$1"; then
        for nm in "$(comm_of "$1")" "$(arg0_of "$1")"; do
            protected_name "$nm" && why="protected name $(shown "$nm") (system uids, a root-owned program)" && return 0
        done
    fi
    if [ -n "$protect" ] && cmd_of "$1" | grep -E -e "$protect" >/dev/null 2>&1; then
        why="its command line matches the host's PROTECT"
        return 0
    fi
    return 1
}
# May this process be a target (SCOPE text in its command line, SCOPE_UID its owner)?
in_scope() {
    uid_ok "$1" || return 1
    [ -z "$scope" ] && return 0
    case "$(cmd_of "$1")" in *"$scope"*) return 0 ;; esac
    return 1
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
# Who holds the device files: fuser (psmisc), else find -lname (GNU), else every fd's link as ls -l
# shows it (busybox has neither fuser nor -lname on some builds: a lister that cannot run must never
# read as "no holder").
if command -v fuser >/dev/null 2>&1; then
    lister="fuser"
elif find /proc/self/fd -lname x >/dev/null 2>&1; then
    lister="find"
else
    lister="ls"
fi
holders() {
    (
    set +f
    # shellcheck disable=SC2086,SC2254,SC2012 # the glob expands to the device files (fuser), is a pattern (case)
    case $lister in
        fuser) fuser $glob 2>/dev/null ;;
        find) find /proc/[0-9]*/fd -lname "$glob" 2>/dev/null | cut -d/ -f3 ;;
        # the text before the glob's first pattern character, to keep only links that may match
        ls) ls -l /proc/[0-9]*/fd 2>/dev/null | awk -v pre="${glob%%[*?[]*}" '
            /^\/proc\/[0-9]+\/fd\/?:$/ { split($0, h, "/"); pid = h[3]; next }
            / -> / { t = $0; sub(/.* -> /, "", t); if (index(t, pre) == 1) print pid "\t" t }' |
            while IFS="$tab" read -r pid target; do
                case "$target" in $glob) echo "$pid" ;; esac
            done ;;
    esac
    ) | tr ' ' '\n' | grep -E '^[0-9]+$' | sort -un | tr '\n' ' '
}
# Every process's stat, comm and cmdline, each line led by the file it came from (grep -H writes
# that prefix itself: no process can forge another's), NULs as \001. One grep for the whole host.
listing() {
    (
    set +f
    a=-a
    printf 'x\n' | grep -a x >/dev/null 2>&1 || a=""
    for f in stat comm cmdline; do printf '%s\n' /proc/[0-9]*/"$f"; done | tr '\n' '\000' |
        xargs -0 grep $a -H '' 2>/dev/null
    ) | tr '\000' '\001'
}
# One line per name a process's program goes by: PID TAB START TAB KIND TAB NAME, KIND s for a
# name with a space (`program subcommand`), else w. As scripts/agent/policy/program.py names().
# And one line per process with its parent: PID TAB START TAB P TAB PPID.
# shellcheck disable=SC2016 # an awk program: its $ are awk's
names_awk='
function base(s) { sub(/.*\//, "", s); return s }
function strip(s) { sub(/^[ \t\r\f\v]+/, "", s); sub(/[ \t\r\f\v]+$/, "", s); return s }
function plain(s) { return s ~ /^[a-z][a-z0-9_-]*$/ }
function emit(name,    kind) {
    if (name == "") return
    gsub(/\t/, "?", name)
    kind = index(name, " ") ? "s" : "w"
    if ((kind SUBSEP name) in seen) return
    seen[kind SUBSEP name] = 1
    printf "%s\t%s\t%s\t%s\n", pid, start, kind, name
}
function names(args, comm,    a, n, argv0, w, b, py, i, arg, kind, value, rest, sub1, parts, np, k, j, m, sb, stem) {
    n = split(args, a, "\001")
    if (n > 0 && a[n] == "") n--
    if (n == 0) { emit(comm); return }
    argv0 = strip(a[1])
    if (argv0 == "") argv0 = strip(comm)
    if (argv0 == "") return
    split(argv0, w, /[ \t\r\f\v]+/)
    b = base(w[1])
    if (b ~ interp) {
        py = b ~ /^(python|pypy)/
        i = 2
        kind = ""
        while (i <= n) {
            arg = a[i]
            if (py && arg == "-m" && i < n) { kind = "module"; value = a[i + 1]; rest = i + 2; break }
            if (py && arg ~ /^-m./) { kind = "module"; value = substr(arg, 3); rest = i + 1; break }
            if (arg ~ /^(-c|-e|-E|--eval|-p|--print)$/ || (py && arg ~ /^-c/)) { kind = "code"; break }
            if (arg == "--") { i++; break }
            if (arg ~ /^-/ && arg != "-") {
                if ((py && arg ~ /^-[XWQ]$/) || (!py && arg ~ /^-[XWQIeEroO]$/)) i += 2; else i++
                continue
            }
            break
        }
        if (kind == "" && i <= n && a[i] != "-") { kind = "script"; value = a[i]; rest = i + 1 }
        sub1 = (kind != "" && kind != "code" && rest <= n && plain(a[rest])) ? a[rest] : ""
        if (kind == "module") {
            np = split(value, parts, ".")
            for (k = np; k >= 1; k--) {
                m = parts[1]
                for (j = 2; j <= k; j++) m = m "." parts[j]
                emit(m)
            }
            if (sub1 != "") emit(value " " sub1)
            return
        }
        if (kind == "script") {
            sb = base(value)
            emit(sb)
            emit(value)
            stem = sb
            if (match(sb, /[^.]\.[^.]*$/)) stem = substr(sb, 1, RSTART)
            emit(stem)
            if (sub1 != "") emit(sb " " sub1)
            return
        }
        emit(b)
        return
    }
    if (argv0 != w[1] || index(argv0, "::")) { emit(argv0); emit(w[1]) }
    emit(b)
    emit(argv0)
    if (comm !~ interp) emit(comm)
    if (n >= 2 && plain(a[2])) emit(b " " a[2])
}
{
    if (!match($0, /^\/proc\/[0-9]+\/(stat|comm|cmdline):/)) next
    split(substr($0, 1, RLENGTH - 1), h, "/")
    key = h[3] SUBSEP h[4]
    text = substr($0, RLENGTH + 1)
    if (key == last) { val[key] = val[key] "?" text; next }
    last = key
    val[key] = text
    if (h[4] == "cmdline") order[++count] = h[3]
}
END {
    for (c = 1; c <= count; c++) {
        pid = order[c]
        s = val[pid SUBSEP "stat"]
        sub(/.*\) /, "", s)
        split(s, f, " ")
        start = f[20]
        if (start == "" || f[1] == "Z") continue
        printf "%s\t%s\tP\t%s\n", pid, start, f[2]
        split("", seen)
        names(val[pid SUBSEP "cmdline"], val[pid SUBSEP "comm"])
    }
}'
# interpreters: generated from scripts/agent/policy/program.py INTERPRETERS (a test keeps them equal)
interp='^(python[0-9.]*m?|pypy[0-9.]*|perl[0-9.]*|ruby[0-9.]*|node|nodejs|bash|sh|dash|zsh|ksh)$'
# PID TAB START TAB NAME of each process whose program a TARGETS alternative names whole (grep -x):
# single names only by TARGETS, `program subcommand` names only by TARGETS_SPACED.
named() {
    for k in w s; do
        if [ "$k" = w ]; then re=$tw; else re=$ts; fi
        [ -n "$re" ] || continue
        hits=$(printf '%s\n' "$all" | awk -F "$tab" -v k="$k" '{ print ($3 == k) ? $4 : "" }' |
            grep -n -x -E -e "$re" | cut -d: -f1 | tr '\n' ' ')
        printf '%s\n' "$all" | awk -F "$tab" -v want="$hits" -v k="$k" '
            BEGIN { n = split(want, a, " "); for (i = 1; i <= n; i++) hit[a[i]] = 1 }
            (NR in hit) && $3 == k { print $1 "\t" $2 "\t" $4 }'
    done | awk -F "$tab" '!($1 in seen) { seen[$1] = 1; print }'
}
# PID TAB PPID TAB START TAB ROOT of each process the roots ($1) started, breadth first (a parent
# before its children), as the agent's plan.trees: a "child" that started before its parent is
# not its child (its parent died and the pid went to another) and is not walked.
tree_of() {
    printf '%s\n' "$all" | awk -F "$tab" -v roots="$1" '
        $3 == "P" { start[$1] = $2; n = ++nkids[$4]; kid[$4, n] = $1 }
        END {
            nq = split(roots, queue, " ")
            for (i = 1; i <= nq; i++) { root[queue[i]] = queue[i]; seen[queue[i]] = 1 }
            for (i = 1; i <= nq; i++) {
                parent = queue[i]
                for (j = 1; j <= nkids[parent]; j++) {
                    child = kid[parent, j]
                    if (child in seen || start[child] + 0 < start[parent] + 0) continue
                    seen[child] = 1
                    root[child] = root[parent]
                    queue[++nq] = child
                    print child "\t" parent "\t" start[child] "\t" root[child]
                }
            }
        }'
}
# shellcheck disable=SC2012 # ls -n is the POSIX way to read a numeric owner
owner_of() { ls -dn "/proc/$1" 2>/dev/null | awk '{ print $3 }'; }
# Owned by the scope uid, when there is one (the agent stops a target's tree within that uid only).
uid_ok() { [ -z "$scope_uid" ] || [ "$(owner_of "$1")" = "$scope_uid" ]; }
# Who runs this: the uid sudo was called by (a host whose hosts.env says BECOME=sudo), else ours.
operator=$(id -u)
if [ "$operator" = 0 ]; then case "${SUDO_UID:-}" in '' | *[!0-9]*) ;; *) operator=$SUDO_UID ;; esac; fi
# Is this another person's process (a uid of UID_MIN or more, not the operator's), with no scope
# uid naming whose processes are meant? As the agent's plan.another_persons (without --all-users).
another_persons() {
    [ -z "$scope_uid" ] || return 1
    owner=$(owner_of "$1")
    case "$owner" in '' | *[!0-9]*) return 1 ;; esac
    [ "$owner" -ge "$uid_min" ] && [ "$owner" != "$operator" ]
}
# Does this process, or anything it started, hold a device file?
tree_holds() {
    for q in $1 $(tree_of "$1" | cut -f1); do case " $before " in *" $q "*) return 0 ;; esac; done
    return 1
}
# A process as the report writes it: pid:start,name (one word); shown as `PID (NAME)`.
token() { printf '%s:%s,%s' "$1" "$2" "$(name_of "$1")"; }
alive() { x=${1%%,*}; [ "$(st "${x%%:*}")" = "${x#*:}" ] && [ "$(state "${x%%:*}")" != Z ]; }
say() {
    k=$1; shift; printf '%s:' "$k"
    [ $# -gt 0 ] || printf ' none'
    for x in "$@"; do printf ' %s (%s)' "${x%%:*}" "${x#*,}"; done
    printf '\n'
}
# One line per process: what is done to it, why, and its command line.
decide() { printf '%s %s (%s): %s; cmd: %s\n' "$1" "$2" "$(name_of "$2")" "$3" "$(shown "$(cmd_of "$2")")"; }
send() {
    s=$1; shift; sent=""
    for t in "$@"; do alive "$t" && kill "-$s" "${t%%:*}" 2>/dev/null && sent="$sent $t"; done
    # shellcheck disable=SC2086
    say "sig$s" $sent
}
# Wait up to $1 s for the rest to exit, saying each second who it still waits for.
wait_gone() {
    n=0; max=$(($1 * 20)); secs=$1; shift; left="$*"
    while [ -n "$left" ] && [ "$n" -lt "$max" ]; do
        if [ $((n % 20)) = 0 ]; then
            # shellcheck disable=SC2086
            say "waiting up to $((secs - n / 20)) s for these to exit" $left
        fi
        sleep 0.05 2>/dev/null || sleep 1
        n=$((n + 1)); now=""
        for t in $left; do alive "$t" && now="$now $t"; done
        left=$now
    done
}
before=$(holders)
echo "==gpu-pivot-oneliner begin=="
echo "config: device files $glob; TERM, then KILL after $grace s; then $settle s watching for a holder coming back"
echo "config: targets: their holders, the programs named by TARGETS ${tw:-(none)} | TARGETS_SPACED ${ts:-(none)}, and what those started"
echo "config: never signalled: PID 1, this shell and its ancestors, protected names, PROTECT ${protect:-(none)}"
if [ -n "$scope$scope_uid" ]; then
    echo "config: scope: targets only among processes${scope:+ whose command line contains $scope}${scope_uid:+ owned by uid $scope_uid}"
else
    echo "config: scope: the whole host"
fi
# every process's names and parent, read once (TARGETS always has the agent's defaults at least)
all=""
[ -z "$tw$ts" ] || all=$(listing | awk -v interp="$interp" "$names_awk")
named_list=$(named)
named_pids=" $(printf '%s\n' "$named_list" | cut -f1 | tr '\n' ' ')"
targets=""; prot=""; outside=""; held=""; roots=""
for p in $before; do
    t=$(token "$p" "$(st "$p")")
    held="$held $t"
    if protected "$p"; then
        prot="$prot $t"; decide keep "$p" "$why"
    elif ! in_scope "$p"; then
        outside="$outside $t"
    else
        targets="$targets $t"; decide TERM "$p" "holds a GPU device file"
        case "$named_pids" in *" $p "*) roots="$roots $p" ;; esac
    fi
done
while IFS="$tab" read -r p s n; do
    [ -n "$p" ] || continue
    case " $before " in *" $p "*) continue ;; esac
    [ "$(st "$p")" = "$s" ] || continue
    if protected "$p"; then
        [ "$why" = "this shell or its ancestor" ] && continue
        prot="$prot $(token "$p" "$s")"; decide keep "$p" "$why; TARGETS names its program $(shown "$n")"
    elif in_scope "$p"; then
        # another person's copy of a target program that holds no GPU here (a client, one waiting for
        # its turn): freeing the GPUs needs none of that, as invoke teardown leaves it
        if another_persons "$p" && ! tree_holds "$p"; then
            decide leave "$p" "TARGETS names its program $(shown "$n"), but it is another person's (uid $owner) and neither it nor what it started holds a GPU here"
            continue
        fi
        targets="$targets $(token "$p" "$s")"; decide TERM "$p" "TARGETS names its program $(shown "$n")"
        roots="$roots $p"
    fi
done <<EOF
$named_list
EOF
# What the programs TARGETS names started (their trees), as the agent: a protected process, or one
# of another uid than the scope's, is not signalled and neither is what it started; the scope's
# text is asked of the named program only, so a holder outside it that such a program started is
# stopped with it.
blocked=" "
tree_list=""
[ -z "$roots" ] || tree_list=$(tree_of "$roots")
while IFS="$tab" read -r p pp s r; do
    [ -n "$p" ] || continue
    case "$blocked" in *" $pp "*) blocked="$blocked$p "; continue ;; esac
    case " $targets " in *" $p:"*) continue ;; esac
    case " $prot " in *" $p:"*) blocked="$blocked$p "; continue ;; esac
    [ "$(st "$p")" = "$s" ] || { blocked="$blocked$p "; continue; }
    if protected "$p"; then
        blocked="$blocked$p "
        [ "$why" = "this shell or its ancestor" ] && continue
        prot="$prot $(token "$p" "$s")"; decide keep "$p" "$why; started by target $r"
        continue
    fi
    uid_ok "$p" || { blocked="$blocked$p "; continue; }
    kept=""
    for t in $outside; do [ "${t%%:*}" = "$p" ] || kept="$kept $t"; done
    outside=$kept
    targets="$targets $(token "$p" "$s")"; decide TERM "$p" "started by target $r"
done <<EOF
$tree_list
EOF
for t in $outside; do decide leave "${t%%:*}" "holds a GPU device file, outside the scope"; done
# shellcheck disable=SC2086
say holders $held
# shellcheck disable=SC2086
say protected $prot
# shellcheck disable=SC2086
say outside-scope $outside
# shellcheck disable=SC2086
send TERM $targets
left=""
# shellcheck disable=SC2086
[ -n "$sent" ] && wait_gone "$grace" $sent
if [ -n "$left" ]; then
    # shellcheck disable=SC2086
    send KILL $left
    # shellcheck disable=SC2086
    wait_gone 5 $sent
fi
# settle: the GPUs must stay free for SETTLE s (a supervisor's respawn is caught, not blessed)
# it looks at least once, whatever SETTLE is: a SETTLE of 0 must not skip the look
echo "watching $settle s for a holder coming back"
ticks=0; remaining=""; looks=$((settle * 20)); [ "$looks" -gt 0 ] || looks=1
while [ "$ticks" -lt "$looks" ]; do
    remaining=""
    for p in $(holders); do protected "$p" || remaining="$remaining $(token "$p" "$(st "$p")")"; done
    [ -n "$remaining" ] && break
    sleep 0.05 2>/dev/null || sleep 1
    ticks=$((ticks + 1))
done
# shellcheck disable=SC2086
say remaining $remaining
mapped=""
for t in $prot; do p=${t%%:*}; alive "$t" && maps_device "$p" && mapped="$mapped $t"; done
# shellcheck disable=SC2086
say protected-mapped $mapped
busy=0
source="nvidia-smi: not found"
if command -v nvidia-smi >/dev/null 2>&1; then
    busy=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | grep -cv '^ *0 *$')
    printf 'gpus-with-memory-used: %s\n' "$busy"
    listed=$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | grep -c '^ *[0-9][0-9]* *$')
    if [ "$listed" = 0 ]; then source="nvidia-smi: lists no GPU"; else source=""; fi
fi
# No device file matches the glob and no GPU memory source lists a GPU: nothing here is a GPU to
# call free (a wrong glob, a driver not loaded). The agent's words and its exit 1, as verify says
# (scripts/agent/teardown/verify.evaluate); an empty holder list there proves nothing.
# shellcheck disable=SC2086 # the glob expands to the device files
if [ -n "$source" ] && ! (set +f; for f in $glob; do [ -e "$f" ] && exit 0; done; exit 1); then
    printf 'NO GPU VISIBLE: no device file matches %s and no GPU memory source (%s)\n' "$glob" "$source"
    no_gpu=1
else
    no_gpu=0
fi
# as another user than root, other users' open files cannot be read: never say free
uninspected=0
[ "$(id -u)" = 0 ] || { uninspected=1; printf 'not-root: other users%s processes could not be inspected; run as root\n' "'"; }
if [ "$no_gpu" = 1 ]; then
    verdict="NO GPU VISIBLE"
elif [ -z "$remaining" ] && [ -z "$mapped" ] && [ "$busy" = 0 ] && [ "$uninspected" = 0 ]; then
    verdict=free
else
    verdict=not-free
fi
# what started the targets is neither frozen nor judged here (invoke teardown does: the restart
# rule), so a free verdict says so: a loop or watchdog above the server may start it again
printf 'restarters: not checked (a loop or watchdog that started the server may start it again; invoke teardown checks them)\n'
printf 'verdict: %s\n' "$verdict"
echo "==gpu-pivot-oneliner end=="
[ "$verdict" = free ]
