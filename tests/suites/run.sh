#!/usr/bin/env bash
# Third-party file-system suites against a real cloakfs mount, judged strictly:
#   stress-ng --class filesystem  every stressor briefly, one after another: fails on any
#                                 "fail:" line or a failed stressor (exit 2);
#   dbench                        the NetBench client load: fails on any error line or exit;
#   fio                           random and sequential writes with crc32c verify, read back in
#                                 the same run, then verified again after a remount (fresh
#                                 caches): fails on any verify error or exit.
# (fsstress and fsx are not packaged by Debian 12; tests/crash/crash.py runs a workload of its
# own instead.) CLOAKFS_SLOW_TESTS=1 runs each suite longer (see docs/TESTING.md). Needs root.
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
bin=${CLOAKFS_BIN:-$root/target/release/cloakfs}
slow=${CLOAKFS_SLOW_TESTS:-0}
if [ "$slow" = 1 ]; then
    stress_timeout=10 dbench_time=120 dbench_clients=8 fio_size=512m
else
    stress_timeout=1 dbench_time=10 dbench_clients=2 fio_size=32m
fi
for tool in stress-ng dbench fio; do
    command -v "$tool" >/dev/null || { echo "suites: $tool is missing (scripts/install-deps.sh)" >&2; exit 1; }
done

tmp=$(mktemp -d /var/tmp/reliab-suites.XXXXXX)
mnt=$tmp/mnt cipher=$tmp/cipher pass=$tmp/pass
mkdir "$mnt"
echo "suites passphrase" >"$pass"
cleanup() {
    if mountpoint -q "$mnt"; then fusermount3 -u -z "$mnt" || true; fi
    rm -rf "$tmp"
}
trap cleanup EXIT INT TERM

"$bin" init --passfile "$pass" --kdf-memory 64 --kdf-iterations 1 "$cipher" >/dev/null
mount_volume() { "$bin" mount --passfile "$pass" "$cipher" "$mnt"; }
unmount_volume() { "$bin" unmount "$mnt"; }
mount_volume

passed=0 failed=0
verdict() { # name, ok(0/1), detail
    if [ "$2" = 0 ]; then
        passed=$((passed + 1)); echo "suites: ok: $1: $3"
    else
        failed=$((failed + 1)); echo "suites: FAIL: $1: $3"
    fi
}

# --- stress-ng: the file-system class ---------------------------------------------------------
# binderfs and verity are left out: this kernel has no binderfs, and FUSE no fs-verity (both
# skip themselves, which stress-ng reports as exit 3, "out of resources").
mkdir "$mnt/stress"
set +e
(cd "$mnt/stress" && stress-ng --class filesystem --exclude binderfs,verity --sequential 1 \
    --timeout "$stress_timeout" --temp-path "$mnt/stress" --metrics-brief) >"$tmp/stress.log" 2>&1
st=$?
set -e
fails=$(grep -cE '(^| )fail:|unsuccessful run' "$tmp/stress.log" || true)
ran=$(grep -cE 'metrc: \[[0-9]+\] [a-z-]+ +[0-9]+ +[0-9.]+ ' "$tmp/stress.log" || true)
if [ "$st" != 0 ] || [ "$fails" != 0 ] || [ "$ran" = 0 ]; then
    grep -E '(^| )fail:|warn:|unsuccessful' "$tmp/stress.log" | head -20 || true
    verdict stress-ng 1 "exit $st, $fails fail lines, $ran stressors with metrics"
else
    verdict stress-ng 0 "$ran stressors, $(grep -oE 'successful run completed in [0-9.]+s' "$tmp/stress.log" || true)"
fi
rm -rf "$mnt/stress"

# --- dbench -----------------------------------------------------------------------------------
mkdir "$mnt/dbench"
for attempt in 1 2; do
    set +e
    dbench -D "$mnt/dbench" -t "$dbench_time" -c /usr/share/dbench/client.txt "$dbench_clients" \
        >"$tmp/dbench.log" 2>&1
    st=$?
    set -e
    # dbench's own setup (a SysV semaphore for its clients), not the file system: once more.
    grep -q 'failed to create barrier semaphore' "$tmp/dbench.log" || break
    echo "suites: dbench could not make its semaphore (attempt $attempt)"
done
errors=$(grep -ciE 'error|failed|unexpected' "$tmp/dbench.log" || true)
tput=$(grep -E '^Throughput' "$tmp/dbench.log" | head -1 || true)
if [ "$st" != 0 ] || [ "$errors" != 0 ] || [ -z "$tput" ]; then
    grep -iE 'error|failed|unexpected' "$tmp/dbench.log" | head -20 || true
    verdict dbench 1 "exit $st, $errors error lines"
else
    verdict dbench 0 "$tput"
fi
rm -rf "$mnt/dbench"

# --- fio with verify --------------------------------------------------------------------------
mkdir "$mnt/fio"
cat >"$tmp/verify.fio" <<EOF
[global]
directory=$mnt/fio
size=$fio_size
verify=crc32c
verify_fatal=1
verify_backlog=256
verify_state_save=0
do_verify=1
randrepeat=1
[randwrite-psync]
ioengine=psync
rw=randwrite
bs=4k
[seqwrite-unaligned]
ioengine=psync
rw=write
bs=7k
[randwrite-mmap]
ioengine=mmap
rw=randwrite
bs=16k
[randrw-libaio-direct]
ioengine=libaio
direct=1
iodepth=8
rw=randwrite
bs=64k
EOF
fio_run() { # log, extra args
    local log=$1; shift
    set +e
    fio --output-format=normal "$@" "$tmp/verify.fio" >"$log" 2>&1
    local st=$?
    set -e
    local bad
    bad=$(grep -ciE 'verify.*(fail|bad|mismatch)|bad magic|crc32c.*fail|err= *[1-9]' "$log" || true)
    if [ "$st" != 0 ] || [ "$bad" != 0 ]; then
        grep -iE 'verify|bad|err=' "$log" | head -20 || true
        echo "exit $st, $bad verify errors"
        return 1
    fi
    echo "$(grep -cE 'err= *0' "$log") jobs, no verify error"
}
if out=$(fio_run "$tmp/fio1.log"); then verdict "fio write+verify" 0 "$out"; else verdict "fio write+verify" 1 "$out"; fi
# The same data verified once more through a fresh mount (nothing from the kernel's cache).
unmount_volume
mount_volume
if out=$(fio_run "$tmp/fio2.log" --verify_only); then
    verdict "fio verify after remount" 0 "$out"
else
    verdict "fio verify after remount" 1 "$out"
fi
unmount_volume

# The volume after all of it: fsck must find nothing.
if "$bin" fsck --passfile "$pass" "$cipher" >"$tmp/fsck.log" 2>&1; then
    verdict fsck 0 "clean after the suites"
else
    verdict fsck 1 "$(tail -5 "$tmp/fsck.log" | tr '\n' ' ')"
fi

echo "suites: $passed passed, $failed failed"
[ "$failed" = 0 ]
