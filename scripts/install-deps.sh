#!/usr/bin/env bash
# Installs what building and testing cloakfs needs on Debian 12 (run as root, idempotent).
set -euo pipefail
pkgs=(fuse3 libfuse3-dev attr acl pkg-config python3 python3-pip)
# Key-slot tests run against real components: a SoftHSM2 PKCS#11 token, GnuPG, the age tools,
# and ssh-keygen.
pkgs+=(softhsm2 gnupg age openssh-client)
# Shared-storage tests: a GlusterFS volume and sshfs over sshd (scripts/shared-store.sh).
pkgs+=(glusterfs-server glusterfs-client sshfs openssh-server iproute2 util-linux)
# Multi-user tests make real users and sessions (useradd, setpriv, setsid).
pkgs+=(passwd util-linux)
# Login tests: pam_cloakfs.so links libpam; it is driven by pamtester and by a real sshd with
# password logins (sshpass); script(1) gives prompt tests a terminal.
pkgs+=(libpam0g-dev pamtester openssh-server sshpass bsdutils)
# The package test (tests/package/run.sh) builds the .deb with dpkg-deb, installs it with apt,
# reads its man pages (man-db, groff) and loads its completions in bash, zsh and fish.
pkgs+=(dpkg libpam-runtime man-db groff-base bash-completion zsh fish systemd)
# Long fuzz runs (scripts/fuzz.sh) build libFuzzer, which is C++.
pkgs+=(g++)
# Reliability tests (tests/suites, tests/crash): third-party suites, and ext4 images on loop
# devices for simulated power cuts.
# python3-fusepy: tests/crash/failfs.py, a backing store that fails with EIO on demand.
pkgs+=(stress-ng dbench fio e2fsprogs mount python3-fusepy)
# xfstests (tests/suites/xfstests.sh, CLOAKFS_SLOW_TESTS=1) is built from source: its build
# dependencies, and the tools its tests run (gawk as awk, xfs_io, setfacl, attr, bc).
pkgs+=(autoconf automake libtool make gcc xfslibs-dev uuid-dev libattr1-dev libacl1-dev libaio-dev
    liburing-dev libgdbm-dev xfsprogs attr acl bc gawk perl)
# The reverse view's tests back it up with rsync and check that only changed files move.
pkgs+=(rsync)
# The shared-storage tests drive SQLite with its command-line shell.
pkgs+=(sqlite3)
# The sync-folder tests run two real Syncthing instances (Debian 12's 1.19) on 127.0.0.1.
pkgs+=(syncthing)
# The same cases against gocryptfs (Debian 12's 2.3) for docs/COMPARISON.md
# (crates/cloakfs-cli/tests/sync_gocryptfs.rs, with CLOAKFS_SLOW_TESTS=1).
pkgs+=(gocryptfs)
# The independent decryptor's Python packages go into a virtual environment of the project's
# (.venv), not the system's Python.
pkgs+=(python3-venv)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q "${missing[@]}"
fi
# The independent decryptor (tests/independent) is written in Python from docs/FORMAT.md; it
# needs AES-GCM-SIV (cryptography 42 or newer: Debian 12's python3-cryptography, which
# GlusterFS pulls in, is 38) and reads age files with pyrage. They go into .venv, made from
# Debian's Python with its packages visible (python3-fusepy for the crash tests); the check is
# the decryptor's own import.
venv="$(cd "$(dirname "$0")/.." && pwd)/.venv"
probe='from cryptography.hazmat.primitives.ciphers.aead import AESGCM, AESGCMSIV, AESSIV, ChaCha20Poly1305
from argon2.low_level import hash_secret_raw
import pyrage'
if ! "$venv/bin/python3" -c "$probe" 2>/dev/null; then
    /usr/bin/python3 -m venv --system-site-packages "$venv"
    "$venv/bin/python3" -m pip install -q 'cryptography>=42' argon2-cffi pyrage
    "$venv/bin/python3" -c "$probe"
fi
if ! command -v cargo >/dev/null; then
    echo "cargo not found: install Rust (https://rustup.rs) first" >&2
    exit 1
fi
# The shared-storage tests run fsx, which Debian does not package (nor fsstress, for which the
# tests have a workload of their own): the Rust rewrite from crates.io, into cargo's bin.
if ! command -v fsx >/dev/null && [ ! -x "${CARGO_HOME:-$HOME/.cargo}/bin/fsx" ]; then
    cargo install --quiet --locked fsx --version 0.3.2
fi
