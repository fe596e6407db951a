#!/usr/bin/env bash
# Issue 24's side-by-side bench: the yardstick's small-file lines (creates, small reads,
# Postmark) on a normal volume and on a sharing volume whose every file has three recipients
# (the mounting member and two directory defaults), same binary, same disk, alternating order.
#
#   bench/sharing.sh [-r ROUNDS]        as root; prints one table (seconds per round; the
#                                       workloads other than Postmark run 3 x ROUNDS rounds)
#
# FSB_BASE (default /var/tmp/fsbench) holds the volumes; FSB_WORKLOADS and the other FSB_*
# knobs of fsbench.sh apply (default: small_create small_read postmark). FUSE over io_uring is
# used if /sys/module/fuse/parameters/enable_uring is already on (bench/run.sh turns it on).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$here/..
rounds=3
while getopts r: o; do
    case $o in
    r) rounds=$OPTARG ;;
    *) echo "usage: bench/sharing.sh [-r ROUNDS]" >&2; exit 2 ;;
    esac
done
[ "$(id -u)" = 0 ] || { echo "sharing.sh: needs root (drops caches, as the yardstick does)" >&2; exit 2; }
: "${FSB_BASE:=/var/tmp/fsbench}"
: "${FSB_WORKLOADS:=small_create small_read postmark}"
export FSB_WORKLOADS
fsbench=$root/../shared/bench/fsbench.sh
[ -x "$fsbench" ] || fsbench=/work/shared/bench/fsbench.sh
bin=${CLOAKFS_BIN:-$root/target/release/cloakfs}
[ -x "$bin" ] || (cd "$root" && cargo build --release -q)

w=$(mktemp -d "$FSB_BASE/sharing.XXXXXX")
cleanup() {
    for m in "$w"/mnt-*; do
        [ -d "$m" ] && { fusermount3 -u "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true; }
    done
    rm -rf "$w"
}
trap cleanup EXIT
printf 'bench pass\n' >"$w/pass"
for who in alice bob carol; do age-keygen -o "$w/$who.key" 2>/dev/null; done
"$bin" init --passfile "$w/pass" "$w/normal" >/dev/null
"$bin" init --sharing --passfile "$w/pass" "$w/sharing" >/dev/null
mkdir -p "$w/mnt-normal" "$w/mnt-sharing"
"$bin" mount --passfile "$w/pass" "$w/normal" "$w/mnt-normal"
"$bin" mount --passfile "$w/pass" --identity "$w/alice.key" "$w/sharing" "$w/mnt-sharing"
"$bin" share default "$w/mnt-sharing" \
    --recipient "$(age-keygen -y "$w/bob.key")" --recipient "$(age-keygen -y "$w/carol.key")" >/dev/null

# Postmark deletes 20,000 files, and an ext4 without a journal then spends a minute scanning
# recently freed inodes at every allocation (docs/PERFORMANCE.md, Limits): a create run after
# a Postmark measures that, on whichever volume comes next. So every round of the lighter
# workloads runs first, and Postmark's rounds last. The light ones take well under a second
# a round, where a busy moment of the machine moves a round by 20-50%: they run three times
# as many rounds.
light=() heavy=()
for name in $FSB_WORKLOADS; do
    if [ "$name" = postmark ]; then heavy+=("$name"); else light+=("$name"); fi
done
declare -A res
for phase in "${light[*]}" "${heavy[*]}"; do
    [ -n "$phase" ] || continue
    n=$rounds
    [ "$phase" = "${light[*]}" ] && n=$((rounds * 3))
    for r in $(seq "$n"); do
        order="normal sharing"
        [ $((r % 2)) = 0 ] && order="sharing normal"
        for kind in $order; do
            while read -r name value _; do
                res[$kind,$name]="${res[$kind,$name]:-}${res[$kind,$name]:+ / }$value"
            done < <(FSB_WORKLOADS="$phase" "$fsbench" "$w/mnt-$kind" 2>/dev/null)
        done
    done
done
# Every file made by the run had three recipients (checked on a file made the same way).
echo probe >"$w/mnt-sharing/probe"
n=$("$bin" share list "$w/mnt-sharing/probe" | grep -c .)
[ "$n" = 3 ] || { echo "sharing.sh: a new file has $n recipients, not 3" >&2; exit 1; }

# Ratio of the sharing volume's time to the normal one's: best round over best round, and
# median over median.
ratios() {
    python3 -c 'import statistics as s, sys
a, b = ([float(x) for x in v.split(" / ")] for v in sys.argv[1:3])
print("%.2f | %.2f" % (min(b) / min(a), s.median(b) / s.median(a)))' "$1" "$2" 2>/dev/null ||
        echo "- | -"
}
echo "| workload (s, per round) | normal volume | sharing volume, 3 recipients | best-of ratio | median ratio |"
echo "|---|---|---|---|---|"
for name in $FSB_WORKLOADS; do
    echo "| $name | ${res[normal,$name]:-} | ${res[sharing,$name]:-} | $(ratios "${res[normal,$name]:-}" "${res[sharing,$name]:-}") |"
done
