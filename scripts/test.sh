#!/usr/bin/env bash
# Runs every test: unit, property, real FUSE mounts, test vectors, independent decryptor.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cargo build --release --workspace
cargo test --release --workspace
if [ -x tests/independent/run.sh ]; then
    tests/independent/run.sh
fi
