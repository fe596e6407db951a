#!/usr/bin/env bash
# Builds cloakfs, creates a demo volume and mounts it, then shows both sides.
#   scripts/demo.sh [CIPHERDIR] [MOUNTPOINT]   (default /tmp/cloakfs-demo/{cipher,plain})
set -euo pipefail
cd "$(dirname "$0")/.."
# Only what building and mounting need (scripts/install-deps.sh adds the test toolchain):
# gcc links, libpam0g-dev is pam_cloakfs.so's libpam, fuse3 brings fusermount3.
need=()
for p in gcc libpam0g-dev fuse3; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}"
fi
command -v cargo >/dev/null || { echo "cargo not found: install Rust (https://rustup.rs) first" >&2; exit 1; }
cargo build --release
bin=$PWD/target/release/cloakfs
base=/tmp/cloakfs-demo
cipher=${1:-$base/cipher}
plain=${2:-$base/plain}
mkdir -p "$plain"
if mountpoint -q "$plain"; then "$bin" unmount "$plain"; fi
pass=$base/passphrase
mkdir -p "$base"
[ -s "$pass" ] || { head -c 18 /dev/urandom | base64 > "$pass"; chmod 600 "$pass"; }
if [ ! -e "$cipher/cloakfs.conf" ]; then
    rm -rf "$cipher"
    "$bin" init --passfile "$pass" "$cipher"
fi
"$bin" mount --passfile "$pass" "$cipher" "$plain"
echo "Hello from cloakfs" > "$plain/hello.txt"
mkdir -p "$plain/notes"
echo "plaintext only here" > "$plain/notes/today.md"
echo
echo "== plaintext view: $plain"
ls -lR "$plain"
echo
echo "== what reaches the disk: $cipher"
ls -lR "$cipher"
echo
echo "The volume stays mounted. Passphrase file: $pass"
echo "Unmount with: $bin unmount $plain"
