#!/usr/bin/env bash
# Sets up and tears down a real shared store with two or three client mounts ("machines"), for
# the shared-storage tests and bench (docs/SHARED-STORAGE.md). As root.
#
#   scripts/shared-store.sh up gluster DIR [N]  replica-2 GlusterFS volume, N FUSE clients (2, 3)
#   scripts/shared-store.sh up sshfs DIR [N]    sshd on 127.0.0.1, N sshfs mounts (2 or 3)
#   scripts/shared-store.sh down DIR            unmounts, stops every daemon, deletes the netns
#   scripts/shared-store.sh brick-kill DIR [B]  kills GlusterFS brick B (1 or 2, default 2) and
#                                               waits until glusterd has seen it go
#   scripts/shared-store.sh brick-start DIR [B] starts brick B again, waits until it is online
#   scripts/shared-store.sh heal-pending DIR    prints how many entries wait for self-heal
#   scripts/shared-store.sh outage DIR [silent] the whole store unreachable (GlusterFS: the
#                                               namespace's lo down; sshfs: sshd stopped, or
#                                               with `silent` frozen: it no longer answers)
#   scripts/shared-store.sh restore DIR         the store reachable again
#   scripts/shared-store.sh info DIR            the store's kind and settings, one per line
#
# The clients are DIR/m1, DIR/m2 (and DIR/m3). GlusterFS refuses loopback addresses, so
# glusterd, its bricks and its clients run in a network namespace of their own (cfsh-<pid>, or
# $SHARED_STORE_PREFIX-<pid>) with an address on that namespace's lo: no traffic leaves it.
# Its state lives under DIR, not /var/lib. `down` is idempotent and also cleans up after a
# partial `up`. Every wait is bounded (see `wait_for`).
set -euo pipefail

die() { echo "shared-store.sh: $*" >&2; exit 1; }
usage="usage: shared-store.sh up gluster|sshfs DIR [2|3] | down DIR | brick-kill DIR [1|2] |
       brick-start DIR [1|2] | heal-pending DIR | outage DIR [silent] | restore DIR | info DIR"
[ $# -ge 2 ] || die "$usage"

addr=10.231.0.1
glfsheal=/usr/lib/x86_64-linux-gnu/glusterfs/glfsheal

# wait_for SECONDS WHAT COMMAND...: runs COMMAND every 0.2 s until it succeeds; fails with
# "WHAT" after SECONDS.
wait_for() {
    local limit=$1 what=$2 deadline
    shift 2
    deadline=$((SECONDS + limit))
    until "$@"; do
        [ "$SECONDS" -lt "$deadline" ] || die "$what: not after ${limit} s"
        sleep 0.2
    done
}

clients() { # DIR: the client mounts' names
    seq -f 'm%g' "$(cat "$1/clients" 2>/dev/null || echo 2)"
}

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
    mkdir -p "$d/wd" "$d/b1" "$d/b2" "$d/log"
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
    wait_for 10 "glusterd's socket" test -S "$d/glusterd.socket"
    gluster_cli "$d" volume create "$vol" replica 2 "$addr:$d/b1" "$addr:$d/b2" force >/dev/null
    # A client that loses every brick fails its calls after this many seconds (default 42).
    gluster_cli "$d" volume set "$vol" network.ping-timeout 5 >/dev/null
    # Each client keeps whole small files (quick-read) and their attributes (md-cache) for a
    # second without asking the bricks, also past another client's write and lock: a
    # read-modify-write across clients (cloakfs's, or any application's) would read stale
    # bytes. docs/SHARED-STORAGE.md.
    gluster_cli "$d" volume set "$vol" performance.quick-read off >/dev/null
    gluster_cli "$d" volume set "$vol" performance.stat-prefetch off >/dev/null
    # While a file is written without pause (eager lock), its replicas' changelog is updated
    # only when the writes stop: a brick killed and started again meanwhile is blamed by
    # nobody and serves reads (size, blocks) of the file before self-heal reaches it, and a
    # read-modify-write there writes old bytes back (cloakfs's appends then left zeros).
    # Updated at once, the returning brick is read only once healed. docs/SHARED-STORAGE.md.
    gluster_cli "$d" volume set "$vol" cluster.post-op-delay-secs 0 >/dev/null
    gluster_cli "$d" volume start "$vol" >/dev/null
    local m
    for m in $(clients "$d"); do
        mkdir -p "$d/$m"
        nsenter --net="/run/netns/$ns" glusterfs --volfile-server="$addr" --volfile-id="$vol" \
            --log-file="$d/log/$m.log" "$d/$m"
    done
    for m in $(clients "$d"); do
        mountpoint -q "$d/$m" || die "GlusterFS client $d/$m did not mount"
    done
}

up_sshfs() {
    local d=$1 port m
    echo sshfs >"$d/kind"
    mkdir -p "$d/export" "$d/ssh"
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
    start_sshd "$d"
    for m in $(clients "$d"); do
        mkdir -p "$d/$m"
        # dir_cache=no: another client's new and removed names show at once; the kernel still
        # caches attributes for its default second. reconnect: a new SSH connection after the
        # old one broke (files open across it must be opened again). ServerAlive*: a server
        # that stops answering is given up after 3 x 2 s, ConnectTimeout: so is a reconnect
        # (docs/SHARED-STORAGE.md, "Faults of the store").
        sshfs -o port="$port",IdentityFile="$d/ssh/client_key",StrictHostKeyChecking=no \
            -o UserKnownHostsFile=/dev/null,LogLevel=ERROR,dir_cache=no,reconnect \
            -o ServerAliveInterval=2,ServerAliveCountMax=3,ConnectTimeout=5 \
            "root@127.0.0.1:$d/export" "$d/$m"
    done
}

start_sshd() { # DIR
    local d=$1
    rm -f "$d/ssh/sshd.pid"
    mkdir -p /run/sshd
    /usr/sbin/sshd -f "$d/ssh/sshd_config" -E "$d/ssh/sshd.log"
    wait_for 10 "sshd's pid file" test -s "$d/ssh/sshd.pid"
}

# sshd's processes: the listener and every session it forked (each serves one sshfs client).
sshd_pids() { # DIR
    local pid
    pid=$(cat "$1/ssh/sshd.pid")
    echo "$pid" $(ps -o pid= --ppid "$pid")
}

stop_sshd() { # DIR
    local d=$1 pids p
    [ -f "$d/ssh/sshd.pid" ] || return 0
    thaw_sshd "$d"
    pids=$(sshd_pids "$d")
    for p in $pids; do kill "$p" 2>/dev/null || true; done
    rm -f "$d/ssh/sshd.pid"
    for p in $pids; do wait_for 10 "sshd gone" not_running "$p"; done
}

# A server that no longer answers (hung, or cut off without a word): sshd's processes stopped,
# their connections left open.
freeze_sshd() { # DIR
    sshd_pids "$1" >"$1/ssh/frozen"
    kill -STOP $(cat "$1/ssh/frozen")
}

thaw_sshd() { # DIR
    [ -f "$1/ssh/frozen" ] || return 0
    kill -CONT $(cat "$1/ssh/frozen") 2>/dev/null || true
    rm -f "$1/ssh/frozen"
}

# Whether process PID is gone, also as a zombie: glusterd takes a brick whose pid still shows
# in /proc for running (below), and a killed brick, now a child of init, stays a zombie until
# init reaps it (seconds, in some containers).
not_running() { # PID
    [ ! -e "/proc/$1" ]
}

down() {
    local d=$1 m
    for m in m1 m2 m3; do
        if mountpoint -q "$d/$m" 2>/dev/null; then
            umount "$d/$m" 2>/dev/null || umount -l "$d/$m"
        fi
    done
    stop_sshd "$d" || true
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
            # The logs glusterd and glfsheal keep outside DIR (bricks named by their path).
            local path=${d#/}
            rm -f /var/log/glusterfs/glfsheal-"$vol".log \
                /var/log/glusterfs/bricks/"${path//\//-}"-b[12].log
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

brick_pidfile() { # DIR BRICK: glusterd names it after the brick's address and path
    local path=${1#/}
    echo "/var/run/gluster/vols/$(cat "$1/volume")/$addr-${path//\//-}-b$2.pid"
}

# Whether glusterd shows brick BRICK online (Y) or offline (N).
brick_online() { # DIR BRICK Y|N
    local d=$1
    gluster_cli "$d" volume status "$(cat "$d/volume")" 2>/dev/null |
        awk -v b="Brick $addr:$d/b$2" -v want="$3" '
            $1 " " $2 == b { found = ($(NF-1) == want) }
            END { exit !found }'
}

brick_kill() { # DIR BRICK
    local d=$1 b=$2 pidf pid
    pidf=$(brick_pidfile "$d" "$b")
    pid=$(cat "$pidf" 2>/dev/null) || die "brick $b has no pid file ($pidf)"
    not_running "$pid" && die "brick $b is not running"
    kill -9 "$pid"
    # A `volume start force` while the old pid is still in /proc finds the brick "already
    # running", only waits for it to connect and ignores further starts until that fails.
    wait_for 30 "brick $b's process gone" not_running "$pid"
    wait_for 30 "glusterd seeing brick $b offline" brick_online "$d" "$b" N
}

brick_start() { # DIR BRICK
    local d=$1 b=$2 deadline=$((SECONDS + 60)) i
    until brick_online "$d" "$b" Y; do
        [ "$SECONDS" -lt "$deadline" ] || die "brick $b not online after 60 s (logs in $d/log)"
        gluster_cli "$d" volume start "$(cat "$d/volume")" force >/dev/null
        for i in $(seq 25); do
            brick_online "$d" "$b" Y && break
            sleep 0.2
        done
    done
}

# The number of entries waiting for self-heal on either brick, after asking the self-heal
# daemon to heal now. Not `gluster volume heal VOL info`: its helper glfsheal then asks
# glusterd's default socket (/var/run/glusterd.socket) for the volume, not ours.
heal_pending() { # DIR
    local d=$1 vol out
    vol=$(cat "$d/volume")
    gluster_cli "$d" volume heal "$vol" >/dev/null 2>&1 || true
    out=$(nsenter --net="/run/netns/$(cat "$d/netns")" "$glfsheal" "$vol" \
        glusterd-sock "$d/glusterd.socket") || die "glfsheal failed: $out"
    # A brick that is not connected shows "Number of entries: -".
    echo "$out" | awk '/^Number of entries:/ { if ($4 !~ /^[0-9]+$/) bad = 1; n += $4 }
        END { if (bad) { print "unknown"; exit 1 } print n }'
}

outage() { # DIR [silent]
    local d=$1 how=${2:-}
    case $(cat "$d/kind"):$how in
    # A network partition: nothing answers and nothing resets a connection, so the clients
    # find out by their network.ping-timeout. The addresses stay on lo while it is down.
    gluster:*) ip -n "$(cat "$d/netns")" link set lo down ;;
    sshfs:silent) freeze_sshd "$d" ;;
    sshfs:) stop_sshd "$d" ;;
    *) die "outage: '$how' is not a kind of outage (silent)" ;;
    esac
}

restore() { # DIR
    local d=$1
    case $(cat "$d/kind") in
    gluster) ip -n "$(cat "$d/netns")" link set lo up ;;
    sshfs)
        if [ -f "$d/ssh/frozen" ]; then thaw_sshd "$d"; else start_sshd "$d"; fi
        ;;
    esac
}

cmd=$1
d=$(realpath -m "$2")
case "$cmd" in
up)
    [ $# -eq 3 ] || [ $# -eq 4 ] || die "$usage"
    d=$(realpath -m "$3")
    n=${4:-2}
    [ "$n" = 2 ] || [ "$n" = 3 ] || die "clients: 2 or 3, not '$n'"
    mkdir -p "$d"
    echo "$n" >"$d/clients"
    case "$2" in
    gluster) up_gluster "$d" || { down "$d"; die "GlusterFS set-up failed (logs in $d/log)"; } ;;
    sshfs) up_sshfs "$d" || { down "$d"; die "sshfs set-up failed"; } ;;
    *) die "unknown store '$2' (gluster or sshfs)" ;;
    esac
    ;;
down) down "$d" ;;
brick-kill | brick-start)
    b=${3:-2}
    [ "$b" = 1 ] || [ "$b" = 2 ] || die "brick: 1 or 2, not '$b'"
    [ "$(cat "$d/kind" 2>/dev/null)" = gluster ] || die "$cmd: $d is no GlusterFS store"
    if [ "$cmd" = brick-kill ]; then brick_kill "$d" "$b"; else brick_start "$d" "$b"; fi
    ;;
heal-pending)
    [ "$(cat "$d/kind" 2>/dev/null)" = gluster ] || die "$cmd: $d is no GlusterFS store"
    heal_pending "$d"
    ;;
outage | restore)
    [ -f "$d/kind" ] || die "$cmd: $d is no store"
    "$cmd" "$d" "${3:-}"
    ;;
info) info "$d" ;;
*) die "unknown command '$cmd'" ;;
esac
