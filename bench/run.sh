#!/usr/bin/env bash
# run.sh - build cloakfs, run the shared file-system yardstick (../shared/bench/peers.sh) with
# cloakfs as a column, and write a Markdown report with cloakfs's ratios to every other column.
#
# Usage:  bench/run.sh [options] [FS ...]
#   FS             file systems, in this order (default: plain passthrough gocryptfs securefs cloakfs);
#                  anything peers.sh knows: plain passthrough gocryptfs securefs encfs cryfs cloakfs,
#                  cloakfsd (the same volume as an attach of the multi-user daemon), cloakfsxts
#                  (a size-preserving aes-256-xts volume, mounted as cloakfs), cloakfsdev (cloakfs
#                  with --no-io-uring: /dev/fuse, as on a kernel without FUSE over io_uring) and
#                  cloakfsbase (the binary $CLOAKFS_BASE_BIN, e.g. an older commit's, for a
#                  before/after in one run); with --store the default is plain gocryptfs cloakfs
#   -r ROUNDS      rounds of the whole list (default 2; peers.sh alternates the order per round)
#   --no-build     do not run `cargo build --release` (use the existing $CLOAKFS_BIN)
#   --no-cpu-pass  skip the streaming CPU pass (see below)
#   --fuse-uring on|off|keep   set /sys/module/fuse/parameters/enable_uring for the run and put
#                  back what it was afterwards (default on: cloakfs then serves through FUSE over
#                  io_uring; peers that do not register rings keep /dev/fuse); keep leaves it
#   -o DIR         peers.sh results directory (default $FSB_BASE/results/cloakfs-<date-time>)
#   --report-dir D where the Markdown report goes (default bench/results of this repo)
#   --report-only DIR   only (re)write the report from an existing results directory
#   --store gluster|sshfs   run on a shared store instead of the local disk (see below)
#   --store-dir DIR where the store lives (bricks or sshfs export, client mounts; must not
#                  exist or be empty; removed at exit; default /var/tmp/fss.<pid>: postmark
#                  fails with a longer path)
#   -h             this help
#
# Environment: every FSB_* knob of fsbench.sh / peers.sh passes through (FSB_WORKLOADS,
# FSB_SEQ_MB, FSB_NSMALL, FSB_QUIET_MAX, FSB_BASE, ...).  CLOAKFS_BIN overrides the binary
# (default target/release/cloakfs); CLOAKFS_MOUNT_OPTS / CLOAKFS_INIT_OPTS add flags (hooks.sh),
# GOCRYPTFS_MOUNT_OPTS adds flags to gocryptfs's mount.
# SHARED_BENCH overrides where peers.sh lives (default ../shared/bench next to the repo).
#
# Streaming CPU pass: peers.sh reports one daemon CPU figure for a whole fsbench run, so to get
# daemon CPU seconds per GB of the streaming lines, run.sh runs peers.sh twice more (one round,
# every FUSE file system of the list): FSB_WORKLOADS="seq_write" and "seq_write seq_read".
# Write = first / size, read = (second - first) / size.  Skipped when seq_write is not among the
# workloads.
#
# Steal: on a VM, CPU time the host gives to other guests.  run.sh samples /proc/stat every 2 s
# into <results>/steal.log, and the report gives each round's steal percentage (a round with
# more than a few percent is not comparable with a quiet one).
#
# Shared store (--store): scripts/shared-store.sh sets up a replica-2 GlusterFS volume (two
# bricks under --store-dir, in a network namespace of its own) or sshfs over an sshd on
# 127.0.0.1, and every run's volume lives on its first client mount (FSB_BASE points there;
# results and the password file stay local).  cloakfs mounts with --shared-storage, gocryptfs
# with -sharedstorage; default workloads every one of fsbench.sh's but compile, and a smaller
# Postmark (bench/README.md says why).  The store is torn down at exit, also on
# failure or interrupt.  The report is bench/results/<stamp>-<store>.md and latest-<store>.md.
#
# Needs root (drop_caches, FUSE mounts) and ../shared/bench/prep.sh to have run once.
# Results: the peers.sh directory (raw lines, logs, summary.md, <fs>.r<N>.mem peak RSS) and
# bench/results/<YYYY-MM-DD-HHMM>.md plus bench/results/latest.md.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
: "${SHARED_BENCH:=$REPO/../shared/bench}"
[ -x "$SHARED_BENCH/peers.sh" ] || SHARED_BENCH=/work/shared/bench
: "${FSB_BASE:=/var/tmp/fsbench}"
: "${CLOAKFS_BIN:=$REPO/target/release/cloakfs}"
export FSB_BASE CLOAKFS_BIN
# bench/bin/postmark makes a Postmark run with failed operations fail (see that file).
export PATH="$HERE/bin:$PATH"
PY=${PY:-python3}

usage() { sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; }
die() { echo "run.sh: $*" >&2; exit 2; }

ROUNDS=2
BUILD=1
CPU_PASS=1
FUSE_URING=on
RES=""
REPORT_DIR="$HERE/results"
REPORT_ONLY=""
STORE=""
STORE_DIR=""
FSLIST=()
while [ $# -gt 0 ]; do
    case $1 in
        -r) [ $# -ge 2 ] || die "-r needs a value"; ROUNDS=$2; shift 2 ;;
        -r*) ROUNDS=${1#-r}; shift ;;
        -o) [ $# -ge 2 ] || die "-o needs a value"; RES=$2; shift 2 ;;
        --no-build) BUILD=0; shift ;;
        --no-cpu-pass) CPU_PASS=0; shift ;;
        --fuse-uring) [ $# -ge 2 ] || die "--fuse-uring needs on, off or keep"; FUSE_URING=$2; shift 2 ;;
        --report-dir) [ $# -ge 2 ] || die "--report-dir needs a value"; REPORT_DIR=$2; shift 2 ;;
        --report-only) [ $# -ge 2 ] || die "--report-only needs a value"; REPORT_ONLY=$2; shift 2 ;;
        --store) [ $# -ge 2 ] || die "--store needs gluster or sshfs"; STORE=$2; shift 2 ;;
        --store-dir) [ $# -ge 2 ] || die "--store-dir needs a value"; STORE_DIR=$2; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        -*) usage >&2; die "unknown option $1" ;;
        *) FSLIST+=("$1"); shift ;;
    esac
done
[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || die "-r wants a positive number, not '$ROUNDS'"
case $FUSE_URING in on|off|keep) ;; *) die "--fuse-uring wants on, off or keep, not '$FUSE_URING'" ;; esac
case $STORE in ""|gluster|sshfs) ;; *) die "--store wants gluster or sshfs, not '$STORE'" ;; esac
[ -z "$STORE_DIR" ] || [ -n "$STORE" ] || die "--store-dir needs --store"
if [ -n "$STORE" ]; then
    [ ${#FSLIST[@]} -gt 0 ] || FSLIST=(plain gocryptfs cloakfs)
    # All of fsbench's workloads but compile, and a smaller Postmark: bench/README.md says why.
    STORE_DEFAULTS=(FSB_PM_FILES=5000 FSB_PM_TX=20000)
    : "${FSB_WORKLOADS:=seq_write seq_read rand_rw small_create small_read readdir untar tree_stat tree_md5 tree_rm postmark}"
    export FSB_WORKLOADS
    for kv in "${STORE_DEFAULTS[@]}"; do
        k=${kv%%=*}
        [ -n "${!k:-}" ] || export "$kv"
    done
fi
[ ${#FSLIST[@]} -gt 0 ] || FSLIST=(plain passthrough gocryptfs securefs cloakfs)

report() {  # RESULTS_DIR
    mkdir -p "$REPORT_DIR"
    "$PY" "$HERE/report.py" --out-dir "$REPORT_DIR" "$1"
}

if [ -n "$REPORT_ONLY" ]; then
    [ -d "$REPORT_ONLY" ] || die "no results directory $REPORT_ONLY"
    report "$REPORT_ONLY"
    exit 0
fi

# ------------------------------------------------------------------ checks
has_fs() { local f; for f in "${FSLIST[@]}"; do [ "$f" = "$1" ] && return 0; done; return 1; }
[ -x "$SHARED_BENCH/peers.sh" ] || die "peers.sh not found (set SHARED_BENCH)"
[ "$(id -u)" = 0 ] || echo "run.sh: WARNING: not root: caches cannot be dropped and FUSE mounts may fail" >&2
command -v fusermount3 > /dev/null || die "fusermount3 missing: run $SHARED_BENCH/prep.sh"
if has_fs passthrough && [ ! -x "$FSB_BASE/bin/passthrough_ll" ]; then
    die "$FSB_BASE/bin/passthrough_ll missing: run $SHARED_BENCH/prep.sh"
fi
for f in gocryptfs securefs encfs cryfs; do
    if has_fs "$f" && ! command -v "$f" > /dev/null; then die "$f not installed: run $SHARED_BENCH/prep.sh"; fi
done

if has_fs cloakfs || has_fs cloakfsd || has_fs cloakfsxts || has_fs cloakfsdev; then
    if [ $BUILD = 1 ]; then
        echo "run.sh: cargo build --release (in $REPO)" >&2
        # Build into this repo's target/ whatever the caller's environment says, so the binary is
        # where hooks.sh looks for it.
        (cd "$REPO" && env -u CARGO_TARGET_DIR cargo build --release)
    fi
    [ -x "$CLOAKFS_BIN" ] || die "no cloakfs binary at $CLOAKFS_BIN (build it, or drop --no-build)"
fi

[ -n "$RES" ] || RES="$FSB_BASE/results/cloakfs-$(date +%Y%m%d-%H%M%S)"
mkdir -p "$RES"
RES=$(cd "$RES" && pwd)
export FSB_HOOKS="$HERE/hooks.sh"

# ------------------------------------------------------------------ cleanup
# peers.sh unmounts after every run.  It runs in a session of its own (run_peers), so that an
# interrupt of run.sh stops it with everything it started (fsbench, the daemons) instead of
# letting it go on through the list; then whatever it left mounted under $FSB_BASE/run is
# unmounted (the daemons exit when their file system is unmounted).
STEAL_PID=""
PEERS_PID=""
URING_PARAM=/sys/module/fuse/parameters/enable_uring
URING_WAS=""
cleanup() {
    local m
    [ -z "$STEAL_PID" ] || kill "$STEAL_PID" 2>/dev/null || true
    if [ -n "$PEERS_PID" ] && kill -0 "$PEERS_PID" 2>/dev/null; then
        # Every process of peers.sh's session: `timeout` puts fsbench's commands in groups of
        # their own, so the session, not the group, holds them all.
        echo "run.sh: stopping peers.sh and what it started" >&2
        session_pids() { ps -e -o pid=,sid= | awk -v s="$PEERS_PID" '$2 == s {print $1}'; }
        # shellcheck disable=SC2046  # a list of pids
        kill -TERM $(session_pids) 2>/dev/null || true
        for _ in $(seq 50); do [ -n "$(session_pids)" ] || break; sleep 0.2; done
    fi
    if [ -n "$URING_WAS" ]; then
        echo "$URING_WAS" > "$URING_PARAM" 2>/dev/null || echo "run.sh: WARNING: could not put $URING_PARAM back to $URING_WAS" >&2
    fi
    while read -r _ m _; do
        case $m in
            "$FSB_BASE"/run/*) echo "run.sh: unmounting leftover $m" >&2; fusermount3 -uz "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true ;;
        esac
    done < /proc/mounts
    if [ -n "$STORE_UP" ]; then
        echo "run.sh: tearing down the $STORE store in $STORE_DIR" >&2
        "$REPO/scripts/shared-store.sh" down "$STORE_DIR" || echo "run.sh: WARNING: shared-store.sh down $STORE_DIR failed" >&2
        if mountpoint -q "$STORE_DIR/m1" || mountpoint -q "$STORE_DIR/m2"; then
            echo "run.sh: WARNING: $STORE_DIR still has a client mount; left in place" >&2
        else
            rm -rf --one-file-system "$STORE_DIR"
        fi
    fi
}
STORE_UP=""
trap cleanup EXIT
trap 'exit 130' INT TERM

# ------------------------------------------------------------------ shared store
# The store's first client mount becomes FSB_BASE, so peers.sh makes every run's volume (and
# the plain column's directory) on the store; results and the password file stay local.
if [ -n "$STORE" ]; then
    [ -x "$REPO/scripts/shared-store.sh" ] || die "no $REPO/scripts/shared-store.sh"
    # Short: postmark keeps each file's whole path in a fixed buffer, and with a location of
    # more than about 72 characters its names overflow it (every create then fails).
    [ -n "$STORE_DIR" ] || STORE_DIR="$(dirname "$FSB_BASE")/fss.$$"
    if [ -e "$STORE_DIR" ] && [ -n "$(ls -A "$STORE_DIR")" ]; then
        die "--store-dir $STORE_DIR is not empty (run.sh removes it at exit)"
    fi
    mkdir -p "$STORE_DIR"
    STORE_DIR=$(cd "$STORE_DIR" && pwd)
    if [ "$(stat -f -c %T "$STORE_DIR")" = tmpfs ]; then
        rmdir "$STORE_DIR"
        die "--store-dir $STORE_DIR is on tmpfs: the store wants a real disk"
    fi
    export FSB_PASSFILE="${FSB_PASSFILE:-$FSB_BASE/pass}"
    mkdir -p "$(dirname "$FSB_PASSFILE")"
    LOCAL_BASE=$FSB_BASE
    STORE_UP=1
    echo "run.sh: setting up the $STORE store in $STORE_DIR" >&2
    "$REPO/scripts/shared-store.sh" up "$STORE" "$STORE_DIR" || die "$STORE store set-up failed"
    FSB_BASE="$STORE_DIR/m1"
    mkdir -p "$FSB_BASE/run"
    # peers.sh runs $FSB_BASE/bin/passthrough_ll; a copy, as sshfs reads no absolute symlink.
    if has_fs passthrough; then
        mkdir -p "$FSB_BASE/bin"
        cp "$LOCAL_BASE/bin/passthrough_ll" "$FSB_BASE/bin/passthrough_ll"
    fi
    CLOAKFS_MOUNT_OPTS="--shared-storage ${CLOAKFS_MOUNT_OPTS:-}"
    GOCRYPTFS_MOUNT_OPTS="-sharedstorage ${GOCRYPTFS_MOUNT_OPTS:-}"
    export FSB_BASE CLOAKFS_MOUNT_OPTS GOCRYPTFS_MOUNT_OPTS
fi

# FUSE over io_uring: a kernel parameter, off by default; set for this run, put back at exit.
URING_STATE="not offered by this kernel ($URING_PARAM missing)"
if [ -e "$URING_PARAM" ]; then
    was=$(cat "$URING_PARAM")
    if [ "$FUSE_URING" = keep ]; then
        URING_STATE="left as found ($was)"
    else
        want=N; [ "$FUSE_URING" = on ] && want=Y
        if [ "$was" != "$want" ]; then
            echo "$want" > "$URING_PARAM" || die "cannot write $URING_PARAM (root needed)"
            URING_WAS=$was
        fi
        URING_STATE="$want for this run (was $was)"
    fi
    echo "run.sh: FUSE over io_uring: enable_uring $URING_STATE" >&2
fi

run_peers() {  # peers.sh ARGS...: in a session (and process group) of its own, see cleanup
    # A background child leads no process group, so setsid execs peers.sh: $! leads the session.
    setsid -w "$SHARED_BENCH/peers.sh" "$@" &
    PEERS_PID=$!
    wait "$PEERS_PID"
    PEERS_PID=""
}

wait_samplers() {  # the .mem samplers end within FSB_MEM_INTERVAL of their daemon
    local i
    for ((i = 0; i < 50; i++)); do
        compgen -G "$1/*.mem.running" > /dev/null || return 0
        sleep 0.2
    done
    echo "run.sh: WARNING: memory sampler markers left in $1" >&2
}

# ------------------------------------------------------------------ run info
{
    echo "command: bench/run.sh -r $ROUNDS${STORE:+ --store $STORE} ${FSLIST[*]}"
    echo "started: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "repo_commit: $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)"
    echo "repo_dirty_files: $(git -C "$REPO" status --porcelain 2>/dev/null | wc -l)"
    if has_fs cloakfs; then
        echo "cloakfs_bin: $CLOAKFS_BIN"
        echo "cloakfs_version: $(timeout 10 "$CLOAKFS_BIN" --version 2>/dev/null | head -1 || true)"
        echo "cloakfs_mount_opts: ${CLOAKFS_MOUNT_OPTS:-}"
        echo "cloakfs_init_opts: ${CLOAKFS_INIT_OPTS:-}"
    fi
    if has_fs gocryptfs; then echo "gocryptfs_mount_opts: ${GOCRYPTFS_MOUNT_OPTS:-}"; fi
    if [ -n "$STORE" ]; then
        echo "store: $STORE"
        echo "store_defaults: ${STORE_DEFAULTS[*]}"
        echo "store_client: $(awk -v m="$FSB_BASE" '$2 == m {print $1, $3, $4}' /proc/mounts)"
        echo "store_disk: $(findmnt -n -o FSTYPE,OPTIONS -T "$STORE_DIR" | tr -s ' ')"
        echo "store_settings: $("$REPO/scripts/shared-store.sh" info "$STORE_DIR" 2>&1 | paste -sd ';' -)"
        pkgs=(glusterfs-server glusterfs-client); [ "$STORE" = sshfs ] && pkgs=(sshfs openssh-server)
        echo "store_versions: $(dpkg-query -W -f='${Package} ${Version}; ' "${pkgs[@]}" 2>/dev/null)"
    fi
    echo "fuse_io_uring: enable_uring $URING_STATE"
    echo "rustc: $(rustc --version 2>/dev/null || echo none)"
    echo "memory_sampler: ${FSB_MEM_SAMPLE:-1} interval ${FSB_MEM_INTERVAL:-0.5}s"
    env | grep -E '^FSB_(WORKLOADS|SEQ_MB|RAND_MB|RAND_SECS|RAND_JOBS|NSMALL|SMALL_KB|SMALL_READS|LS_REPS|TREE_TAR|PM_FILES|PM_TX|PM_SUBDIRS|COMPILE_TAR|COMPILE_TARGET|TIMEOUT|NO_DROP|QUIET_MAX|QUIET_CORES|BASE)=' | sort | sed 's/^/env: /' || true
} > "$RES/run-info.txt"

# ------------------------------------------------------------------ main run
steal_sampler() {  # every 2 s: epoch seconds, steal ticks, all ticks (the /proc/stat cpu line)
    local cpu user nice sys idle iow irq sirq steal rest
    while :; do
        read -r cpu user nice sys idle iow irq sirq steal rest < /proc/stat
        echo "$(date +%s) $steal $((user + nice + sys + idle + iow + irq + sirq + steal))"
        sleep 2
    done
}
steal_sampler > "$RES/steal.log" 2>/dev/null &
STEAL_PID=$!

echo "run.sh: peers.sh -r $ROUNDS ${FSLIST[*]} -> $RES" >&2
run_peers -r "$ROUNDS" -o "$RES" "${FSLIST[@]}"
wait_samplers "$RES"
kill "$STEAL_PID" 2>/dev/null || true
STEAL_PID=""

# ------------------------------------------------------------------ streaming CPU pass
FUSE_FS=()
for f in "${FSLIST[@]}"; do [ "$f" = plain ] || FUSE_FS+=("$f"); done
WL=" ${FSB_WORKLOADS:-seq_write} "
if [ $CPU_PASS = 1 ] && [ ${#FUSE_FS[@]} -gt 0 ] && [[ $WL == *" seq_write "* ]]; then
    for pass in "seq_write" "seq_write seq_read"; do
        d="$RES/cpu-${pass// /+}"
        echo "run.sh: streaming CPU pass '$pass' on ${FUSE_FS[*]} -> $d" >&2
        FSB_WORKLOADS=$pass run_peers -r 1 -o "$d" "${FUSE_FS[@]}" > "$d.out"
        wait_samplers "$d"
    done
fi

echo "finished: $(date -u +%Y-%m-%dT%H:%M:%SZ)" >> "$RES/run-info.txt"
report "$RES"
