# shellcheck shell=bash
# hooks.sh - cloakfs for ../shared/bench/peers.sh (FSB_HOOKS=bench/hooks.sh).
#
# peers.sh SOURCES this file after defining its own init_/mount_ functions, so it must not
# change shell options (no `set -e`): peers.sh runs with plain `set -u`.
#
#   init_cloakfs  CIPHERDIR        cloakfs init --passfile $FSB_PASSFILE CIPHERDIR
#   mount_cloakfs CIPHERDIR MNT    cloakfs mount --foreground ... &  DAEMON_PID=$!
#
# The binary is $CLOAKFS_BIN (default: target/release/cloakfs of this repo).  Extra mount
# flags can be passed in $CLOAKFS_MOUNT_OPTS (word-split), extra init flags in
# $CLOAKFS_INIT_OPTS, extra gocryptfs mount flags in $GOCRYPTFS_MOUNT_OPTS.  The default init
# (default KDF cost) is used: mount speed is not measured.
#
# Daemon memory: every FUSE daemon peers.sh starts (cloakfs and the peers alike) gets a small
# sampler that reads VmHWM (peak RSS) and Threads from /proc/PID/status every
# $FSB_MEM_INTERVAL s (0.5) until the daemon exits, and writes $RES/<fs>.r<round>.mem:
#     peak_rss_kib N
#     max_threads N
# VmHWM is a high-water mark, so sampling loses nothing but the last moments before exit
# (the unmount).  The sampler only reads /proc (bash builtins and one `sleep` per sample).
# FSB_MEM_SAMPLE=0 turns it off.  bench/report.py reads the .mem files.

_CLOAKFS_HOOKS_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
: "${CLOAKFS_BIN:=$_CLOAKFS_HOOKS_DIR/../target/release/cloakfs}"

init_cloakfs() {
    # shellcheck disable=SC2086  # CLOAKFS_INIT_OPTS is a list of flags
    "$CLOAKFS_BIN" init ${CLOAKFS_INIT_OPTS:-} --passfile "$FSB_PASSFILE" "$1"
}

mount_cloakfs() {
    # shellcheck disable=SC2086  # CLOAKFS_MOUNT_OPTS is a list of flags
    "$CLOAKFS_BIN" mount --foreground ${CLOAKFS_MOUNT_OPTS:-} --passfile "$FSB_PASSFILE" "$1" "$2" &
    DAEMON_PID=$!
}

# gocryptfs with extra flags: peers.sh's mount_gocryptfs (its flags unchanged) plus
# $GOCRYPTFS_MOUNT_OPTS (bench/run.sh --store sets -sharedstorage).
if [ -n "${GOCRYPTFS_MOUNT_OPTS:-}" ]; then
    mount_gocryptfs() {
        # shellcheck disable=SC2086  # GOCRYPTFS_MOUNT_OPTS is a list of flags
        gocryptfs -fg -q -nosyslog ${GOCRYPTFS_MOUNT_OPTS} -passfile "$FSB_PASSFILE" "$1" "$2" &
        DAEMON_PID=$!
    }
fi

# cloakfsxts: a size-preserving volume (init --cipher aes-256-xts, no integrity), mounted as
# cloakfs is, to set XTS against the default AES-256-GCM in the same run.
init_cloakfsxts() { CLOAKFS_INIT_OPTS="${CLOAKFS_INIT_OPTS:-} --cipher aes-256-xts" init_cloakfs "$@"; }
mount_cloakfsxts() { mount_cloakfs "$@"; }

# cloakfsdev: cloakfs mounted with --no-io-uring, serving /dev/fuse as it does on a kernel
# without FUSE over io_uring (Debian 12's 6.1), beside the io_uring column in the same run.
init_cloakfsdev() { init_cloakfs "$@"; }
mount_cloakfsdev() { CLOAKFS_MOUNT_OPTS="${CLOAKFS_MOUNT_OPTS:-} --no-io-uring" mount_cloakfs "$@"; }

# cloakfsbase: cloakfs as built by another commit ($CLOAKFS_BASE_BIN), mounted as cloakfs is,
# so that a change is measured before and after in one run (ratios between the two columns).
init_cloakfsbase() { CLOAKFS_BIN=${CLOAKFS_BASE_BIN:?set CLOAKFS_BASE_BIN} init_cloakfs "$@"; }
mount_cloakfsbase() { CLOAKFS_BIN=${CLOAKFS_BASE_BIN:?set CLOAKFS_BASE_BIN} mount_cloakfs "$@"; }

# cloakfsd: the same volume served by the multi-user daemon as an attach (every request goes
# through the authorization gate and per-thread credential switching, no writeback cache), to
# price those checks against the single-user mount.  The daemon's tree lives next to MNT; the
# attach is bind-mounted on MNT so fsbench runs unchanged, and a watcher stops the daemon once
# peers.sh unmounts MNT.
init_cloakfsd() { init_cloakfs "$@"; }

mount_cloakfsd() {
    local tree=$2.tree sock=$2.sock i
    mkdir -p "$tree"
    "$CLOAKFS_BIN" daemon --root "$tree" --socket "$sock" > /dev/null &
    DAEMON_PID=$!
    for ((i = 0; i < 300; i++)); do
        "$CLOAKFS_BIN" status --socket "$sock" > /dev/null 2>&1 && break
        kill -0 "$DAEMON_PID" 2> /dev/null || return 1
        sleep 0.1
    done
    "$CLOAKFS_BIN" attach --socket "$sock" --passfile "$FSB_PASSFILE" "$1" bench || return 1
    # The attaching session alone is authorized, and fio's job processes start sessions of
    # their own (setsid): authorize the bench's user, as a user working in several terminals
    # would.
    local authz
    authz=$("$CLOAKFS_BIN" authz add --socket "$sock" bench --user "$(id -u)" \
        --perms read,write,exec | awk '{print $3}') || return 1
    "$CLOAKFS_BIN" auth --socket "$sock" --authz "$authz" bench || return 1
    mount --bind "$tree/bench" "$2" || return 1
    (
        while mountpoint -q "$2"; do sleep 0.5; done
        kill "$DAEMON_PID" 2> /dev/null
    ) > /dev/null 2>&1 &
}

# _fsb_mem_sampler PID OUT: write OUT with the peak RSS and thread count of PID until it exits.
# A marker OUT.running exists while the sampler runs (bench/run.sh waits for it to go).
_fsb_mem_sampler() {
    local pid=$1 out=$2 k v hwm=0 thr=0 ok=0 dt=${FSB_MEM_INTERVAL:-0.5}
    : > "$out.running"
    while [ -e "/proc/$pid/status" ]; do
        # A zombie has no Vm* lines: the last values stand.
        while read -r k v _; do
            case $k in
                VmHWM:) hwm=$v; ok=1 ;;
                Threads:) [ "$v" -gt "$thr" ] && thr=$v ;;
            esac
        done 2>/dev/null < "/proc/$pid/status"
        [ $ok = 1 ] && printf 'peak_rss_kib %s\nmax_threads %s\n' "$hwm" "$thr" > "$out"
        sleep "$dt"
    done
    rm -f "$out.running"
}

# _fsb_start_sampler CIPHERDIR: start the sampler for $DAEMON_PID (set by a mount_ function).
# peers.sh makes CIPHERDIR as $FSB_BASE/run/<fs>.r<round>.<epoch>/cipher; the .mem file is named
# after the "<fs>.r<round>" part so it sits next to peers.sh's <fs>.r<round>.txt.
_fsb_start_sampler() {
    [ "${FSB_MEM_SAMPLE:-1}" = 1 ] && [ -n "${DAEMON_PID:-}" ] && [ -n "${RES:-}" ] || return 0
    local tag=${1%/}
    tag=${tag%/cipher}
    tag=${tag##*/}
    tag=${tag%.*}
    case $tag in *.r[0-9]*) ;; *) return 0 ;; esac
    _fsb_mem_sampler "$DAEMON_PID" "$RES/$tag.mem" &
}

# Wrap every FUSE file system's mount function (peers.sh's and ours) with the sampler.
for _fsb_fs in passthrough gocryptfs securefs encfs cryfs cloakfs cloakfsxts cloakfsd cloakfsdev cloakfsbase ${FSB_MEM_EXTRA_FS:-}; do
    if declare -F "mount_$_fsb_fs" > /dev/null && ! declare -F "_fsb_orig_mount_$_fsb_fs" > /dev/null; then
        eval "$(declare -f "mount_$_fsb_fs" | sed "1s/^mount_$_fsb_fs /_fsb_orig_mount_$_fsb_fs /")"
        eval "mount_$_fsb_fs() { _fsb_orig_mount_$_fsb_fs \"\$@\"; _fsb_start_sampler \"\$1\"; }"
    fi
done
unset _fsb_fs
