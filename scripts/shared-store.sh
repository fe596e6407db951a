#!/usr/bin/env bash
# Sets up and tears down a real shared store with two client mounts ("two machines"), for the
# shared-storage tests and bench (README "Shared and distributed storage"). As root.
#
#   scripts/shared-store.sh up gluster DIR   replica-2 GlusterFS volume, two FUSE clients
#   scripts/shared-store.sh up sshfs DIR     sshd on 127.0.0.1, two sshfs mounts
#   scripts/shared-store.sh down DIR         unmounts, stops every daemon, deletes the netns
#   scripts/shared-store.sh brick-kill DIR   kills one GlusterFS brick process
#   scripts/shared-store.sh brick-start DIR  starts the killed brick again
#   scripts/shared-store.sh info DIR         the store's kind and settings, one per line
#
# The clients are DIR/m1 and DIR/m2. GlusterFS refuses loopback addresses, so glusterd, its
# bricks and its clients run in a network namespace of their own (cfsh-<pid>, or
# $SHARED_STORE_PREFIX-<pid>) with an address
# on that namespace's lo: no traffic leaves it. Its state lives under DIR, not /var/lib.
# `down` is idempotent and also cleans up after a partial `up`.
set -euo pipefail

die() { echo "shared-store.sh: $*" >&2; exit 1; }
[ $# -ge 2 ] || die "usage: shared-store.sh up gluster|sshfs DIR | down DIR | brick-kill DIR | brick-start DIR | info DIR"

addr=10.231.0.1

gluster_cli() { # DIR ARGS...
    local d=$1; shift
    nsenter --net="/run/netns/$(cat "$d/netns")" gluster --mode=script \
        --glusterd-sock="$d/glusterd.socket" --log-file="$d/log/cli.log" "$@"
}

up_gluster() {
    local d=$1 ns vol
    ns="${SHARED_STORE_PREFIX:-cfsh}-$$"
    vol="$ns"
    echo "$ns" >"$d/netns"
    echo "$vol" >"$d/volume"
    echo gluster >"$d/kind"
    mkdir -p "$d/wd" "$d/b1" "$d/b2" "$d/m1" "$d/m2" "$d/log"
    ip netns add "$ns"
    ip -n "$ns" addr add "$addr/32" dev lo
    ip -n "$ns" link set lo up
    cat >"$d/glusterd.vol" <<EOF
volume management
    type mgmt/glusterd
    option working-directory $d/wd
    option glusterd-sockfile $d/glusterd.socket
    option transport-type socket
    option transport.socket.listen-port 24007
    option ping-timeout 0
    option event-threads 1
end-volume
EOF
    nsenter --net="/run/netns/$ns" glusterd -f "$d/glusterd.vol" -p "$d/glusterd.pid" \
        --log-file="$d/log/glusterd.log"
    local i
    for i in $(seq 100); do
        [ -S "$d/glusterd.socket" ] && break
        sleep 0.1
    done
    gluster_cli "$d" volume create "$vol" replica 2 "$addr:$d/b1" "$addr:$d/b2" force >/dev/null
    # A client that loses every brick fails its calls after this many seconds (default 42).
    gluster_cli "$d" volume set "$vol" network.ping-timeout 5 >/dev/null
    # Each client keeps whole small files (quick-read) and their attributes (md-cache) for a
    # second without asking the bricks, also past another client's write and lock: a
    # read-modify-write across clients (cloakfs's, or any application's) would read stale
    # bytes. README: Shared and distributed storage.
    gluster_cli "$d" volume set "$vol" performance.quick-read off >/dev/null
    gluster_cli "$d" volume set "$vol" performance.stat-prefetch off >/dev/null
    gluster_cli "$d" volume start "$vol" >/dev/null
    local m
    for m in m1 m2; do
        nsenter --net="/run/netns/$ns" glusterfs --volfile-server="$addr" --volfile-id="$vol" \
            --log-file="$d/log/$m.log" "$d/$m"
    done
    for m in m1 m2; do
        mountpoint -q "$d/$m" || die "GlusterFS client $d/$m did not mount"
    done
}

up_sshfs() {
    local d=$1 port
    echo sshfs >"$d/kind"
    mkdir -p "$d/export" "$d/m1" "$d/m2" "$d/ssh"
    rm -f "$d/ssh/host_key"* "$d/ssh/client_key"*
    ssh-keygen -q -t ed25519 -N '' -f "$d/ssh/host_key"
    ssh-keygen -q -t ed25519 -N '' -f "$d/ssh/client_key"
    cp "$d/ssh/client_key.pub" "$d/ssh/authorized_keys"
    chmod 700 "$d/ssh"
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    cat >"$d/ssh/sshd_config" <<EOF
ListenAddress 127.0.0.1:$port
HostKey $d/ssh/host_key
AuthorizedKeysFile $d/ssh/authorized_keys
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
StrictModes no
UsePAM no
PidFile $d/ssh/sshd.pid
Subsystem sftp internal-sftp
EOF
    mkdir -p /run/sshd
    /usr/sbin/sshd -f "$d/ssh/sshd_config" -E "$d/ssh/sshd.log"
    local i m
    for i in $(seq 100); do
        [ -s "$d/ssh/sshd.pid" ] && break
        sleep 0.1
    done
    for m in m1 m2; do
        # dir_cache=no: another client's new and removed names show at once; the kernel still
        # caches attributes for its default second.
        sshfs -o port="$port",IdentityFile="$d/ssh/client_key",StrictHostKeyChecking=no \
            -o UserKnownHostsFile=/dev/null,LogLevel=ERROR,dir_cache=no,reconnect \
            "root@127.0.0.1:$d/export" "$d/$m"
    done
}

down() {
    local d=$1 m
    for m in m1 m2; do
        if mountpoint -q "$d/$m" 2>/dev/null; then
            umount "$d/$m" 2>/dev/null || umount -l "$d/$m"
        fi
    done
    if [ -f "$d/ssh/sshd.pid" ]; then
        kill "$(cat "$d/ssh/sshd.pid")" 2>/dev/null || true
        rm -f "$d/ssh/sshd.pid"
    fi
    if [ -f "$d/netns" ]; then
        local ns vol pidf
        ns=$(cat "$d/netns")
        vol=$(cat "$d/volume" 2>/dev/null || true)
        if [ -n "$vol" ] && [ -S "$d/glusterd.socket" ]; then
            gluster_cli "$d" volume stop "$vol" force >/dev/null 2>&1 || true
            gluster_cli "$d" volume delete "$vol" >/dev/null 2>&1 || true
        fi
        # Whatever glusterd started for the volume (bricks, self-heal daemon), then glusterd.
        for pidf in /var/run/gluster/vols/"$vol"/*.pid /var/run/gluster/shd/"$vol"/*.pid \
            "$d/glusterd.pid"; do
            [ -n "$vol" ] && [ -f "$pidf" ] && kill "$(cat "$pidf")" 2>/dev/null || true
        done
        if [ -n "$vol" ]; then
            rm -rf /var/run/gluster/vols/"$vol" /var/run/gluster/shd/"$vol"
        fi
        if ip netns list | grep -qw "$ns"; then
            # Any process left in the namespace (a brick glusterd had no pid file for).
            local p
            for p in $(ip netns pids "$ns" 2>/dev/null); do kill "$p" 2>/dev/null || true; done
            ip netns delete "$ns"
        fi
        rm -f "$d/netns"
    fi
}

info() { # DIR
    local d=$1
    case "$(cat "$d/kind" 2>/dev/null)" in
    gluster)
        # Type and size of the volume, then every option set on it (the reconfigured ones).
        gluster_cli "$d" volume info "$(cat "$d/volume")" |
            grep -E '^(Type|Number of Bricks|Transport-type): |^[a-z-]+\.[a-z.-]+: '
        ;;
    sshfs) echo "sshfs $(sshfs --version 2>&1 | awk '/^SSHFS version/ {print $3}') over sshd on 127.0.0.1" ;;
    *) die "no store in $d" ;;
    esac
}

brick_pid() { # DIR
    local d=$1 vol
    vol=$(cat "$d/volume")
    cat /var/run/gluster/vols/"$vol"/*-b2.pid
}

cmd=$1
d=$(realpath -m "$2")
case "$cmd" in
up)
    [ $# -eq 3 ] || die "usage: shared-store.sh up gluster|sshfs DIR"
    d=$(realpath -m "$3")
    mkdir -p "$d"
    case "$2" in
    gluster) up_gluster "$d" || { down "$d"; die "GlusterFS set-up failed (logs in $d/log)"; } ;;
    sshfs) up_sshfs "$d" || { down "$d"; die "sshfs set-up failed"; } ;;
    *) die "unknown store '$2' (gluster or sshfs)" ;;
    esac
    ;;
down) down "$d" ;;
brick-kill) kill -9 "$(brick_pid "$d")" ;;
brick-start) gluster_cli "$d" volume start "$(cat "$d/volume")" force >/dev/null ;;
info) info "$d" ;;
*) die "unknown command '$cmd'" ;;
esac
