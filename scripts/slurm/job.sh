#!/bin/sh
# What the prolog and epilog wrappers run: check the checkout, then scripts/engines/slurm_job.py from it.
# Why the check: slurmd runs this as root, and root would run whatever the checkout holds
# (its .venv's python and site-packages, scripts/, any module beside them on sys.path). A
# checkout another user owns or may write to - or a directory above it they may rename - is
# their code run as root, so it is refused (exit 2, one line; Slurm drains the node) before
# any Python starts. A root-owned sticky directory above it (/tmp) is fine: no one else can
# replace root's entries there; so is group write for group root (only root is in it).
set -eu
kind=$1
root=$(dirname "$(dirname "$(dirname "$(readlink -f "$0")")")")
py="$root/.venv/bin/python"
[ -x "$py" ] || py=/usr/bin/python3

refuse() {
    echo "gpu-pivot $kind: $1 is $(stat -L -c 'owned by uid %u, gid %g, mode %a' "$1"): the checkout and the" \
        "directories above it must be root's and writable by no one else (root would run its code); nothing was run" >&2
    exit 2
}

d=$root
while [ "$d" != / ]; do
    d=$(dirname "$d")
    bad=$(find -L "$d" -maxdepth 0 \( ! -user 0 -o \( -perm /002 -o -perm /020 ! -group 0 \) ! -perm -1000 \) -print)
    [ -z "$bad" ] || refuse "$bad"
done
venv=/nonexistent
case $py in "$root"/*) venv="$root/.venv" ;; esac
# the checkout's own entries, and all of what Python runs from it (links followed: their targets count)
bad=$( { find -L "$root" -maxdepth 1 \( ! -user 0 -o -perm /002 -o -perm /020 ! -group 0 \) -print -quit
         find -L "$root/scripts" "$venv" \( ! -user 0 -o -perm /002 -o -perm /020 ! -group 0 \) -print -quit
       } 2>/dev/null | head -n 1)
[ -z "$bad" ] || refuse "$bad"
cd "$root"
exec "$py" -m scripts.engines.slurm_job "$kind"
