#!/usr/bin/env bash
# Coverage-guided fuzzing of one target on stable Rust (docs/FUZZING.md): libFuzzer through
# libfuzzer-sys, with LLVM's SanitizerCoverage passes (stable -C flags) and no sanitizer.
#
#   scripts/fuzz.sh TARGET [SECONDS] [libFuzzer options...]   run TARGET (default 600 s)
#   scripts/fuzz.sh --build                                    build every target only
#   scripts/fuzz.sh --list                                     name the targets
#   scripts/fuzz.sh --merge TARGET                             minimize into fuzz/corpus
#
# The run starts from the target's seeds and checked-in corpus (fuzz/corpus/TARGET), writes
# what it finds to target/fuzz/corpus/TARGET, and a crashing input to
# target/fuzz/artifacts/TARGET/. It runs under nice -n 19.
set -euo pipefail
cd "$(dirname "$0")/.."
targets=(config slots file names meta rekey_journal share recovery_key control)
triple=$(rustc -vV | sed -n 's/^host: //p')
export CARGO_TARGET_DIR=target/fuzz
# Given with --target, RUSTFLAGS reach the target's code only, not build scripts or proc-macros.
export RUSTFLAGS="--cfg fuzzing -Cpasses=sancov-module \
 -Cllvm-args=-sanitizer-coverage-level=4 -Cllvm-args=-sanitizer-coverage-inline-8bit-counters \
 -Cllvm-args=-sanitizer-coverage-pc-table -Cllvm-args=-sanitizer-coverage-trace-compares \
 -Cdebug-assertions -Coverflow-checks"
build() {
    local bins=()
    for t in "$@"; do bins+=(--bin "fuzz_$t"); done
    nice -n 19 cargo build --release -q -p cloakfs-fuzz --features libfuzzer --target "$triple" "${bins[@]}"
    # The seed writer is an ordinary program: built without the coverage flags.
    (unset CARGO_TARGET_DIR RUSTFLAGS
     nice -n 19 cargo build --release -q -p cloakfs-fuzz --bin fuzz-seeds)
}
known() {
    if [[ ! " ${targets[*]} " == *" $1 "* ]]; then
        echo "fuzz.sh: no target '$1' (targets: ${targets[*]})" >&2
        exit 2
    fi
}
bin=target/fuzz/$triple/release
# Runs fuzz_$1 with the other arguments under nice. The targets' scratch files go to a
# directory of this run, removed after it (libFuzzer exits without the destructors that would).
fuzz() {
    local t=$1 rc=0
    shift
    scratch=$(mktemp -d "${TMPDIR:-/tmp}/cloakfs-fuzz-run.XXXXXX")
    trap 'rm -rf "$scratch"' EXIT
    TMPDIR=$scratch nice -n 19 "$bin/fuzz_$t" "$@" || rc=$?
    exit "$rc"
}
case "${1:-}" in
    --list) printf '%s\n' "${targets[@]}"; exit 0 ;;
    --build) build "${targets[@]}"; exit 0 ;;
    --merge)
        target=${2:?usage: scripts/fuzz.sh --merge TARGET}
        known "$target"
        build "$target"
        mkdir -p "fuzz/corpus/$target"
        # Keeps what fuzz/corpus/TARGET has, adds the inputs of the last runs that reach
        # something new.
        fuzz "$target" -merge=1 "fuzz/corpus/$target" "target/fuzz/corpus/$target"
        ;;
    ""|-*) sed -n '5,8p' "$0" | sed 's/^#   /usage: /' >&2; exit 2 ;;
esac
target=$1
secs=${2:-600}
shift $(( $# < 2 ? $# : 2 ))
known "$target"
build "$target"
work=target/fuzz/corpus/$target
mkdir -p "$work" "target/fuzz/artifacts/$target" "fuzz/corpus/$target"
target/release/fuzz-seeds "$target" "$work"
fuzz "$target" "$work" "fuzz/corpus/$target" \
    -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len=8192 \
    -artifact_prefix="target/fuzz/artifacts/$target/" -print_final_stats=1 "$@"
