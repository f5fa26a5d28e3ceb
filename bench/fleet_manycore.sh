#!/usr/bin/env bash
# The fleet benchmark on the GPU machine (many CPUs, root, no ssh installed, no package access):
# openssh from the .deb files in .debs/ (extracted into a private prefix with dpkg-deb -x, never
# installed, run with its own loader and libraries so the machine's libc does not matter), then
# bench/fleet_manycore.py: loopback sshds, `invoke teardown` of 1, 8, 32 hosts in parallel and
# one after another, and the local side's CPU per host. Results in $OUT: fleet-manycore.md (the
# block for bench/RESULTS.md) and fleet-manycore.json.
# Usage there: bash bench/fleet_manycore.sh      (SIZES="1 8 32" REPS=3; .debs/ and .whl/ carried)
#   FLEET_ARGS="--status --fanout 32": `invoke status` and `invoke teardown --fanout 32` side by side
# Make .debs/ here first: see the comment at the end of this file.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/fleet-out}; mkdir -p "$OUT"
SIZES=${SIZES:-1 8 32}; REPS=${REPS:-3}
ls .debs/openssh-server_*.deb .debs/openssh-client_*.deb .debs/libc6_*.deb >/dev/null

PREFIX=$(mktemp -d /tmp/gp-openssh.XXXXXX)   # 0700, ours: nothing in it is anyone else's
trap 'rm -rf "$PREFIX"' EXIT
for deb in .debs/*.deb; do
    dest=$PREFIX/root; case $deb in .debs/libc6_*) dest=$PREFIX/libc;; esac  # kept apart: see below
    if command -v dpkg-deb >/dev/null; then
        dpkg-deb -x "$deb" "$dest"
    else  # not a Debian-family machine: a .deb is an ar archive holding data.tar.*
        python3 - "$deb" "$dest" <<'PY'
import io, sys, tarfile
data = open(sys.argv[1], "rb").read()
assert data[:8] == b"!<arch>\n", sys.argv[1]
pos = 8
while pos < len(data):
    name, size = data[pos:pos + 16].strip().decode(), int(data[pos + 48:pos + 58])
    body = data[pos + 60:pos + 60 + size]
    pos += 60 + size + (size % 2)
    if name.rstrip("/").startswith("data.tar"):
        tar = tarfile.open(fileobj=io.BytesIO(body))
        try:
            tar.extractall(sys.argv[2], filter="tar")
        except TypeError:  # a Python without extraction filters; these are Debian's own archives
            tar.extractall(sys.argv[2])
PY
    fi
done
R=$PREFIX/root; C=$PREFIX/libc
LIBS="$R/lib/x86_64-linux-gnu:$R/usr/lib/x86_64-linux-gnu"
mkdir -p "$PREFIX/bin"
wrap() {  # wrap MODE: "host" = this machine's loader and libc + the extracted libraries; "own" = Debian's loader and libc too
    for tool in usr/bin/ssh usr/bin/ssh-keygen usr/sbin/sshd; do
        name=$(basename "$tool")
        extra=""; [ "$name" = sshd ] && extra="-r"   # no re-exec: it would lose the wrapper
        if [ "$1" = host ]; then
            printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s %s "$@"\n' "$LIBS" "$R/$tool" "$extra" > "$PREFIX/bin/$name"
        else
            printf '#!/bin/sh\nexec %s --library-path %s %s %s "$@"\n' "$C/lib64/ld-linux-x86-64.so.2" \
                "$C/lib/x86_64-linux-gnu:$LIBS" "$R/$tool" "$extra" > "$PREFIX/bin/$name"
        fi
        chmod 755 "$PREFIX/bin/$name"
    done
}
# The machine's own libc first (newer glibc runs Debian 12's binaries); Debian's loader only where that fails.
wrap host; "$PREFIX/bin/ssh" -V 2>/dev/null || { wrap own; echo "using Debian's loader and libc"; }
export PATH="$PREFIX/bin:$PATH"
[ "$(command -v sshd)" = "$PREFIX/bin/sshd" ]
ssh -V
# sshd refuses to start without its privilege-separation user
python3 -c 'import pwd; pwd.getpwnam("sshd")' 2>/dev/null \
    || useradd --system --no-create-home --home-dir /run/sshd --shell /usr/sbin/nologin sshd 2>/dev/null \
    || echo 'sshd:x:74:65534:privsep:/run/sshd:/usr/sbin/nologin' >> /etc/passwd
mkdir -p /run/sshd

if ls .whl/*.whl >/dev/null 2>&1; then  # as bench/gpu_session.sh: invoke, dotenv, ClusterShell
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site
fi
export PYTHONUNBUFFERED=1
echo "CPUs: $(nproc); $(uname -sr); $(python3 --version)" | tee "$OUT/fleet-manycore-machine.txt"
# shellcheck disable=SC2086  # SIZES is a list of numbers
python3 bench/fleet_manycore.py --sizes $SIZES --reps "$REPS" --out "$OUT" ${FLEET_ARGS:-} 2>&1 | tee "$OUT/fleet-manycore.txt"

# Making .debs/ (on a Debian 12 machine with apt; the libraries are what `ldd` lists for
# sshd, ssh and ssh-keygen, libc6 included):
#   mkdir -p .debs && cd .debs && apt-get download openssh-server openssh-client openssh-sftp-server \
#     libc6 libaudit1 libcap-ng0 libcap2 libcom-err2 libcrypt1 libgcrypt20 libgpg-error0 libgssapi-krb5-2 \
#     libk5crypto3 libkeyutils1 libkrb5-3 libkrb5support0 liblz4-1 liblzma5 libnsl2 libpam0g libpcre2-8-0 \
#     libselinux1 libssl3 libsystemd0 libtirpc3 libwrap0 libzstd1 zlib1g
#   for f in *%3a*; do mv "$f" "${f//%3a/_}"; done    # epoch colons, as apt names the files
