#!/usr/bin/env bash
# xfstests (fstests) `-g quick` against cloakfs (issue 43), judged against a committed list of
# expected failures (tests/suites/xfstests-expected.txt, each with its class and reason):
#   - builds xfstests from /work/shared/suites/xfstests-*.tar.gz into a cache directory
#     (target/xfstests; reused when built: delete it to rebuild), with common/rc taught that
#     `fuse.cloakfs` is `fuse`;
#   - makes a small ext4 on a loop device (generic/103 and 213 fill the disk), two volumes on
#     it (TEST and SCRATCH cipher directories), a mount helper /sbin/mount.fuse.cloakfs
#     (`<cipherdir> <mnt> -o opts`, prints nothing: the daemon logs to a file) and the
#     xfstests config (FSTYP=fuse, FUSE_SUBTYP=.cloakfs);
#   - runs ./check; a failure not in the expected list fails the script (exit 1), an expected
#     failure that passes now is reported, not a failure.
# Takes about 30 minutes for `-g quick` on the 2-core CI machine. Needs root; installs nothing
# (scripts/install-deps.sh installs the build dependencies). Everything it mounts, the loop
# device and the helper it wrote go again on exit.
#
#   tests/suites/xfstests.sh                 # -g quick
#   tests/suites/xfstests.sh generic/003 ... # these tests only (any ./check arguments)
# Environment: CLOAKFS_BIN (default target/release/cloakfs), XFSTESTS_TARBALL, XFSTESTS_CACHE,
# XFSTESTS_BUDGET=SECONDS (interrupt ./check then and judge the tests that ran: a partial run).
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
bin=$(realpath "${CLOAKFS_BIN:-$root/target/release/cloakfs}")
tarball=${XFSTESTS_TARBALL:-$(ls /work/shared/suites/xfstests-*.tar.gz 2>/dev/null | head -1)}
cache=${XFSTESTS_CACHE:-$root/target/xfstests}
expected=$root/tests/suites/xfstests-expected.txt
helper=/sbin/mount.fuse.cloakfs

say() { echo "xfstests: $*"; }
die() { echo "xfstests: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "needs root (FUSE mounts with allow_other, a loop device, /sbin helper)"
[ -x "$bin" ] || die "no cloakfs binary at $bin (cargo build --release)"
[ -n "$tarball" ] && [ -f "$tarball" ] || die "xfstests tarball not found (XFSTESTS_TARBALL)"
for tool in make gcc autoconf automake libtoolize gawk bc xfs_io setfacl attr losetup mkfs.ext4; do
    command -v "$tool" >/dev/null || die "$tool is missing (scripts/install-deps.sh)"
done
if [ -e "$helper" ] && ! grep -q 'cloakfs xfstests helper' "$helper"; then
    die "$helper exists and is not this script's (the package's?): remove it or run elsewhere"
fi

# --- build (once; reused) ---------------------------------------------------------------------
src=$cache/xfstests
if [ ! -f "$cache/.built-$(basename "$tarball")" ]; then
    say "building xfstests from $tarball in $src (log: $cache/build.log)"
    rm -rf "$src"
    mkdir -p "$cache"
    tar -xzf "$tarball" -C "$cache"
    (cd "$src" && make -j2) >"$cache/build.log" 2>&1 || { tail -20 "$cache/build.log"; die "build failed"; }
    touch "$cache/.built-$(basename "$tarball")"
fi
# cloakfs's daemon sets the subtype: the kernel's type is fuse.cloakfs, not fuse.
if ! grep -q 'fuse\\.cloakfs' "$src/common/rc"; then
    sed -i -e "s|-e 's/fuse.glusterfs/glusterfs/'|-e 's/fuse.glusterfs/glusterfs/' -e 's/^fuse\\\\.cloakfs\$/fuse/'|" \
        -e 's|^\tfindmnt -rncv -S \$dev -t \$fstype -o TARGET|\tfindmnt -rncv -S $dev -t $fstype${FUSE_SUBTYP:+,$fstype$FUSE_SUBTYP} -o TARGET|' \
        -e 's|^\tfindmnt -rncv -t \$fstype -o TARGET \$dir|\tfindmnt -rncv -t $fstype${FUSE_SUBTYP:+,$fstype$FUSE_SUBTYP} -o TARGET $dir|' \
        "$src/common/rc"
    grep -q 'fuse\\.cloakfs' "$src/common/rc" || die "could not patch common/rc (_fs_type)"
fi

# --- the loop file system, volumes, helper, config --------------------------------------------
work=$(mktemp -d /var/tmp/cloakfs-xfstests.XXXXXX)
loopdev=""
made_users=()
cleanup() {
    set +e
    for m in "$work/test" "$work/scratch"; do
        if mountpoint -q "$m"; then umount "$m" 2>/dev/null || fusermount3 -u -z "$m"; fi
    done
    # Anything a test left mounted under the work area (FUSE first, then the loop fs).
    findmnt -rn -o TARGET | grep "^$work/" | sort -r | while read -r m; do umount -l "$m"; done
    if mountpoint -q "$work/disk"; then umount "$work/disk" || umount -l "$work/disk"; fi
    [ -n "$loopdev" ] && losetup -d "$loopdev" 2>/dev/null
    if grep -q 'cloakfs xfstests helper' "$helper" 2>/dev/null; then rm -f "$helper"; fi
    for u in "${made_users[@]}"; do userdel -r "$u" >/dev/null 2>&1; done
    rm -rf "$work"
}
trap cleanup EXIT INT TERM

# Tests run commands as fsgqa and other users: they must reach the mount points (mktemp: 0700).
chmod 755 "$work"
mkdir -p "$work/disk" "$work/test" "$work/scratch"
truncate -s 3G "$work/disk.img"
mkfs.ext4 -q -F "$work/disk.img"
loopdev=$(losetup -f --show "$work/disk.img")
mount "$loopdev" "$work/disk"
pass=$work/pass log=$work/daemon.log
echo "xfstests passphrase" >"$pass"
for v in test scratch; do
    "$bin" init --passfile "$pass" --kdf-memory 64 --kdf-iterations 1 "$work/disk/$v.enc" >/dev/null
done

# The mount "devices" are tags (cloakfs-xfstests-test, -scratch), shown as the mounts' sources
# (fsname=): xfstests unmounts by device, and umount(8) would take a cipher directory's path
# for a mount point.
cat >"$helper" <<EOF
#!/bin/bash
# cloakfs xfstests helper (written by tests/suites/xfstests.sh, removed when it ends)
# mount(8) runs it as: $helper <tag> <mountpoint> -o <options>. Prints nothing.
tag=\$1 mnt=\$2
shift 2
exec "$bin" mount --passfile "$pass" --log-file "$log" "$work/disk/\${tag#cloakfs-xfstests-}.enc" "\$mnt" "\$@" -o "fsname=\$tag" >>"$log" 2>&1
EOF
chmod 755 "$helper"

# Users some tests run as (made here, removed at the end).
for u in fsgqa fsgqa2 123456-fsgqa; do
    if ! getent passwd "$u" >/dev/null; then
        useradd -m "$u" && made_users+=("$u")
    fi
done

cat >"$src/local.config" <<EOF
export FSTYP=fuse
export FUSE_SUBTYP=.cloakfs
export TEST_DEV=cloakfs-xfstests-test
export TEST_DIR=$work/test
export SCRATCH_DEV=cloakfs-xfstests-scratch
export SCRATCH_MNT=$work/scratch
export MOUNT_OPTIONS="-oallow_other"
export TEST_FS_MOUNT_OPTS="-oallow_other"
export AWK_PROG=gawk
export RESULT_BASE=$cache/results
EOF
mount -t fuse.cloakfs -o allow_other cloakfs-xfstests-test "$work/test" \
    || { cat "$log"; die "the helper could not mount the test volume"; }

# --- run --------------------------------------------------------------------------------------
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(-g quick)
rm -rf "$cache/results"
say "running ./check ${args[*]} (output: $cache/check.out, daemon log: kept in $cache/daemon.log)"
set +e
if [ -n "${XFSTESTS_BUDGET:-}" ]; then
    # A time budget: ./check is interrupted (SIGINT) after this many seconds and reports what
    # ran by then; the verdict covers those tests only.
    (cd "$src" && timeout -s INT "$XFSTESTS_BUDGET" ./check "${args[@]}") >"$cache/check.out" 2>&1
else
    (cd "$src" && ./check "${args[@]}") >"$cache/check.out" 2>&1
fi
st=$?
set -e
cp "$log" "$cache/daemon.log" 2>/dev/null || true
tail -5 "$cache/check.out"

# A line ./check may not print (no Failures: when all passed, no Not run: when all ran): empty.
line() { grep -E "^$1:" "$cache/check.out" | tail -1 | sed -E "s/^$1: *//" || true; }
ran=$(line Ran) notrun=$(line 'Not run') failures=$(line Failures)
[ -n "$ran" ] || { tail -30 "$cache/check.out"; die "./check printed no Ran: line (exit $st)"; }
count() { wc -w <<<"$1" | tr -d ' '; }
# ./check's Ran: line lists the tests not run too.
say "ran $(( $(count "$ran") - $(count "$notrun") )), not run $(count "$notrun"), failed $(count "$failures")"
if grep -q '^Interrupted!' "$cache/check.out"; then say "PARTIAL RUN: ./check was interrupted (time budget?)"; fi

declare -A why=()
while IFS='|' read -r t class reason; do
    t=$(echo "$t" | tr -d ' ')
    [ -n "$t" ] && [ "${t#\#}" = "$t" ] && why[$t]="$(echo "$class" | xargs) -$reason"
done <"$expected"

new=0
for t in $failures; do
    if [ -n "${why[$t]:-}" ]; then
        say "expected failure: $t (${why[$t]})"
    else
        say "NEW FAILURE: $t (see $cache/results/${t}.out.bad, .full)"
        new=$((new + 1))
    fi
done
for t in $ran; do
    if [ -n "${why[$t]:-}" ] && ! grep -qw -- "$t" <<<"$failures"; then
        say "expected to fail but passed now: $t (${why[$t]}): update $expected"
    fi
done
if [ "$new" -gt 0 ]; then
    say "FAIL: $new new failure(s)"
    exit 1
fi
say "ok: no failure beyond the expected ones"
