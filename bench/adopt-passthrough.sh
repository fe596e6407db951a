#!/bin/bash
# Streaming read of a plaintext file of an adopted tree (cloakfs init --adopt): through the
# mount (FUSE passthrough when run as root) against the backing directory directly, in the
# same run, alternating, cold cache each time. Target: the mount within 5% of the backing.
#
#   bench/adopt-passthrough.sh [-s SIZE_MIB] [-r ROUNDS] [-d WORKDIR]
#
# Defaults: 1024 MiB, 3 rounds, /var/tmp/cloakfs-adopt-bench. Needs root (passthrough and
# drop_caches). Prints one line per round and the medians in MB/s.
set -euo pipefail
size=1024 rounds=3 work=/var/tmp/cloakfs-adopt-bench
while getopts "s:r:d:" o; do
    case $o in
        s) size=$OPTARG ;; r) rounds=$OPTARG ;; d) work=$OPTARG ;;
        *) echo "usage: $0 [-s SIZE_MIB] [-r ROUNDS] [-d WORKDIR]" >&2; exit 2 ;;
    esac
done
[ "$(id -u)" = 0 ] || { echo "$0: run as root (passthrough needs it)" >&2; exit 2; }
repo=$(cd "$(dirname "$0")/.." && pwd)
bin=${CLOAKFS_BIN:-$repo/target/release/cloakfs}
[ -x "$bin" ] || (cd "$repo" && cargo build --release -p cloakfs-cli)
export CLOAKFS_STATE_DIR=$work/state
rm -rf "$work"
mkdir -p "$work/tree" "$work/mnt"
echo "adopt bench passphrase" > "$work/pass"
dd if=/dev/urandom of="$work/tree/big.bin" bs=1M count="$size" status=none
"$bin" init --adopt --passfile "$work/pass" --kdf-memory 64 --kdf-iterations 1 "$work/tree" >/dev/null
"$bin" mount --passfile "$work/pass" --log-file "$work/daemon.log" "$work/tree" "$work/mnt"
trap '"$bin" unmount "$work/mnt" || fusermount3 -uz "$work/mnt"' EXIT
# MB/s of a cold streaming read of $1.
read_mbs() {
    sync; echo 3 > /proc/sys/vm/drop_caches
    local t0 t1
    t0=$(date +%s.%N)
    dd if="$1" of=/dev/null bs=1M status=none
    t1=$(date +%s.%N)
    echo "$t0 $t1" | awk -v mb="$size" '{ printf "%.0f", mb * 1.048576 / ($2 - $1) }'
}
direct=() mount=()
for r in $(seq "$rounds"); do
    d=$(read_mbs "$work/tree/big.bin")
    m=$(read_mbs "$work/mnt/big.bin")
    direct+=("$d") mount+=("$m")
    echo "round $r: backing ${d} MB/s, mount ${m} MB/s"
done
median() { printf '%s\n' "$@" | sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
md=$(median "${direct[@]}") mm=$(median "${mount[@]}")
grep -q "passthrough refused\|passthrough not available" "$work/daemon.log" 2>/dev/null \
    && echo "note: passthrough was not in use (see $work/daemon.log)"
awk -v d="$md" -v m="$mm" -v s="$size" 'BEGIN { printf "streaming read, %d MiB plaintext file: backing %d MB/s, cloakfs mount %d MB/s (%.1f%% of backing)\n", s, d, m, 100 * m / d }'
