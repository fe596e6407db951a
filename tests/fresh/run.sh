#!/usr/bin/env bash
# A fresh Debian 12 machine, as a new user gets it: debootstrap a bookworm root, add Rust and a
# clone of this repository, enter it with a mount namespace of its own and pivot_root (a plain
# chroot breaks the tests that make user namespaces and mount over /), and run the README's
# commands exactly as written: the from-source build, scripts/demo.sh, scripts/test.sh.
#   tests/fresh/run.sh [WORKDIR]      (as root; default /var/tmp/cloakfs-fresh; 30-50 minutes)
# Slow: not part of scripts/test.sh. Its result goes into the closing note of a change to the
# README's commands, scripts/install-deps.sh or scripts/demo.sh.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
work=${1:-/var/tmp/cloakfs-fresh}
root=$work/root
log() { echo "fresh: $*"; }
fail() { echo "fresh: FAILED: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || fail "run as root"

if [ "${CLOAKFS_FRESH_INSIDE:-}" != 1 ]; then
    command -v debootstrap >/dev/null || {
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap >/dev/null
    }
    # The bootstrapped system is kept pristine in $work/base; every run starts from a copy.
    base=$work/base
    if [ ! -x "$base/usr/bin/apt-get" ]; then
        rm -rf "$base"
        mkdir -p "$base"
        log "debootstrap bookworm into $base"
        debootstrap --variant=minbase bookworm "$base" http://deb.debian.org/debian \
            >"$work/debootstrap.log" 2>&1 || { tail -20 "$work/debootstrap.log"; fail debootstrap; }
    fi
    rm -rf "$root"
    cp -a "$base" "$root"
    # What the new machine gets from outside: name resolution, the CA certificates this host
    # trusts (crates.io, PyPI), Rust as rustup installs it, and the clone. Nothing else.
    cp /etc/resolv.conf "$root/etc/resolv.conf"
    mkdir -p "$root/usr/local/share/ca-certificates/host"
    cp -L /etc/ssl/certs/ca-certificates.crt "$root/usr/local/share/ca-certificates/host/host.crt"
    mkdir -p "$root/etc/ssl/certs"
    cp -L /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
    # Packages install but never start daemons here (they would join the host's network).
    printf '#!/bin/sh\nexit 101\n' > "$root/usr/sbin/policy-rc.d"
    chmod 755 "$root/usr/sbin/policy-rc.d"
    cp -a "${RUSTUP_HOME:-$HOME/.rustup}" "$root/root/.rustup"
    mkdir -p "$root/root/.cargo"
    cp -a "${CARGO_HOME:-$HOME/.cargo}/bin" "$root/root/.cargo/bin"
    # fsx is one of the tests' tools that install-deps.sh itself installs: not the host's.
    rm -f "$root/root/.cargo/bin/fsx"
    git clone -q "$repo" "$root/root/cloakfs"
    log "entering $root (mount namespace, pivot_root)"
    rc=0
    CLOAKFS_FRESH_INSIDE=1 unshare -m --propagation private "$0" "$work" || rc=$?
    [ $rc = 0 ] && log "ok: build, demo.sh and test.sh passed on a fresh Debian 12" \
        || echo "fresh: FAILED (exit $rc); logs in $root/root/*.log" >&2
    exit $rc
fi

# --- inside the new mount namespace: make $root the root ---
mount --bind "$root" "$root"
mount -t proc proc "$root/proc"
mount --rbind /sys "$root/sys"
mount --rbind /dev "$root/dev"
mount -t tmpfs tmpfs "$root/run"
mount -t tmpfs tmpfs "$root/tmp"
mkdir -p "$root/.old"
cd "$root"
pivot_root . .old
umount -l /.old
rmdir /.old 2>/dev/null || true
export HOME=/root PATH=/root/.cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export RUSTUP_HOME=/root/.rustup CARGO_HOME=/root/.cargo
unset CLOAKFS_FRESH_INSIDE
cd /root/cloakfs

step() {
    local name=$1; shift
    log "$name"
    if ! "$@" >"/root/$name.log" 2>&1; then
        tail -40 "/root/$name.log" >&2
        fail "$name (log: $root/root/$name.log)"
    fi
}
# README, "From source": the prerequisites, then the build.
step source-prerequisites bash -c 'apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q gcc libpam0g-dev fuse3'
step source-build cargo build --release
# README, "Two commands for a newcomer".
step demo scripts/demo.sh
target/release/cloakfs unmount /tmp/cloakfs-demo/plain
step test scripts/test.sh
grep -E "^test result:" /root/test.log | awk '{p+=$4; f+=$6} END {print "fresh: tests passed", p, "failed", f}'
