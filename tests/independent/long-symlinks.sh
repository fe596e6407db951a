#!/bin/sh
# Symlink targets up to PATH_MAX - 1 (docs/FORMAT.md 10.1), end to end: made through a real
# mount, read back after a remount, by `cloakfs cat` through the link, `cloakfs export`,
# `cloakfs fsck`, after `cloakfs rekey`, and by the independent decryptor (which knows only
# FORMAT.md). An orphaned long target that does not open under its name (here a copy of another
# one) is reported by fsck and removed by --repair. Needs root
# (FUSE). Exits non-zero on any difference.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
bin=${CLOAKFS_BIN:-$root/target/release/cloakfs}
tmp=$(mktemp -d /var/tmp/reliab-longlinks.XXXXXX)
mnt=$tmp/mnt cipher=$tmp/cipher pass=$tmp/pass
cleanup() {
    if mountpoint -q "$mnt"; then fusermount3 -u -z "$mnt" || true; fi
    rm -rf "$tmp"
}
trap cleanup EXIT INT TERM
mkdir "$mnt"
echo "long links" >"$pass"
fail() { echo "long-symlinks: FAIL: $*" >&2; exit 1; }

"$bin" init --passfile "$pass" --kdf-memory 64 --kdf-iterations 1 "$cipher" >/dev/null
"$bin" mount --passfile "$pass" "$cipher" "$mnt"

# Targets of 4095 (the most), 3001 (the shortest stored apart) and 3000 bytes (inline).
target() { python3 -c "import sys; sys.stdout.write(('data/' + 'x' * 90 + '/') * 50)" | head -c "$1"; }
for n in 4095 3001 3000; do
    ln -s "$(target $n)" "$mnt/l$n"
done
# One more than PATH_MAX - 1 is refused by the kernel; the longest one works as a path too.
mkdir -p "$mnt/sub"
echo "through the link" >"$mnt/sub/file"
ln -s "sub/$(python3 -c "print('./' * 2041, end='')")file" "$mnt/reach"
[ "$(cat "$mnt/reach")" = "through the link" ] || fail "a 4095-byte path through the link"
ln "$mnt/l4095" "$mnt/sub/hardlink"        # a second name of the same symlink
mv "$mnt/l3001" "$mnt/sub/moved"            # renamed elsewhere: still its target
ln -s "$(target 4000)" "$mnt/gone" && rm "$mnt/gone"
ln -s "$(target 4000)" "$mnt/over" && ln -sf short "$mnt/over"   # replaced by another link
"$bin" unmount "$mnt"

stored=$(ls "$cipher/cloakfs.symlinks" | wc -l)
[ "$stored" = 3 ] || fail "$stored long targets stored, 3 expected (l4095, l3001, reach)"

"$bin" mount --passfile "$pass" "$cipher" "$mnt"
[ "$(readlink "$mnt/l4095")" = "$(target 4095)" ] || fail "4095-byte target after remount"
[ "$(readlink "$mnt/sub/hardlink")" = "$(target 4095)" ] || fail "hard link of a long symlink"
[ "$(readlink "$mnt/sub/moved")" = "$(target 3001)" ] || fail "renamed long symlink"
[ "$(readlink "$mnt/l3000")" = "$(target 3000)" ] || fail "3000-byte inline target"
[ "$(stat -c %s "$mnt/l4095")" = 4095 ] || fail "lstat size of a long symlink"
rm "$mnt/sub/hardlink"
[ "$(readlink "$mnt/l4095")" = "$(target 4095)" ] || fail "long symlink after removing its other link"
"$bin" unmount "$mnt"

"$bin" fsck --passfile "$pass" "$cipher" >/dev/null || fail "fsck of a volume with long symlinks"
[ "$("$bin" cat --passfile "$pass" "$cipher" reach)" = "through the link" ] ||
    fail "cloakfs cat through a 4095-byte link"
"$bin" export --passfile "$pass" "$cipher" "$tmp/export" >/dev/null
[ "$(readlink "$tmp/export/l4095")" = "$(target 4095)" ] || fail "export of a long symlink"

python3 "$here/decrypt_volume.py" "$cipher" "$pass" "$tmp/indep" >/dev/null
diff -r --no-dereference "$tmp/export" "$tmp/indep" || fail "independent decryptor differs from export"

"$bin" rekey --passfile "$pass" "$cipher" >/dev/null
[ "$(ls "$cipher/cloakfs.symlinks" | wc -l)" = 3 ] || fail "rekey left old long targets behind"
python3 "$here/decrypt_volume.py" "$cipher" "$pass" "$tmp/indep2" >/dev/null
diff -r --no-dereference "$tmp/export" "$tmp/indep2" || fail "after rekey"
"$bin" fsck --passfile "$pass" "$cipher" >/dev/null || fail "fsck after rekey"

# A long target that no symlink points to (a crash between its write and the symlink).
cp "$cipher/cloakfs.symlinks/$(ls "$cipher/cloakfs.symlinks" | head -1)" \
    "$cipher/cloakfs.symlinks/AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
set +e
"$bin" fsck --json --passfile "$pass" "$cipher" >"$tmp/fsck.json"
st=$?
set -e
[ "$st" = 6 ] && grep -q orphan_long_target "$tmp/fsck.json" || fail "fsck did not report an orphan (exit $st)"
set +e
"$bin" fsck --repair --passfile "$pass" "$cipher" >/dev/null
st=$?
set -e
[ "$st" = 7 ] || fail "fsck --repair of an orphan: exit $st"
"$bin" fsck --passfile "$pass" "$cipher" >/dev/null || fail "fsck after --repair"

# A long target whose content was changed: the decryptor refuses it.
f=$(ls "$cipher/cloakfs.symlinks" | head -1)
python3 -c 'import sys; p=sys.argv[1]; b=bytearray(open(p,"rb").read()); b[40]^=1; open(p,"wb").write(b)' \
    "$cipher/cloakfs.symlinks/$f"
if python3 "$here/decrypt_volume.py" "$cipher" "$pass" "$tmp/indep3" >/dev/null 2>&1; then
    fail "a changed long target was not refused"
fi
echo "long-symlinks: ok"
