#!/bin/sh
# Decrypts the committed test volume with the independent Python decryptor (written from
# docs/FORMAT.md only), compares it with the expected plaintext, and checks that tampered copies
# are rejected; then builds a volume with the real cloakfs binary (target/release/cloakfs),
# adds one slot of each kind that needs no outside program (key file, recovery key, Shamir
# shares plain and age-encrypted, an age X25519 recipient from age-keygen), and decrypts it with
# each secret alone. Exits non-zero on any difference.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
volume="$root/crates/cloakfs-core/tests/vectors/volume"
decrypt="$here/decrypt_volume.py"
pass="$here/passphrase.txt"

probe='from cryptography.hazmat.primitives.ciphers.aead import AESGCM, AESGCMSIV, AESSIV, ChaCha20Poly1305
from argon2.low_level import hash_secret_raw
import pyrage'
# The project's virtual environment (scripts/install-deps.sh makes it) comes first.
if [ -x "$root/.venv/bin/python3" ]; then
    PATH="$root/.venv/bin:$PATH"
    export PATH
fi
if ! python3 -c "$probe" 2>/dev/null; then
    echo "run.sh: $(command -v python3) lacks cryptography >= 42, argon2-cffi or pyrage: run scripts/install-deps.sh" >&2
    exit 1
fi

tmp=$(mktemp -d)
mnt="$tmp/mnt"
cleanup() {
    if mountpoint -q "$mnt" 2>/dev/null; then fusermount3 -u -z "$mnt" || true; fi
    if [ -n "${gnupghome:-}" ]; then
        GNUPGHOME="$gnupghome" gpgconf --kill gpg-agent 2>/dev/null || true
        rm -rf "$gnupghome"
    fi
    rm -rf "$tmp"
}
trap cleanup EXIT INT TERM

python3 "$decrypt" --self-test

# 1. The committed volume decrypts to exactly the expected tree (symlinks compared as links).
python3 "$decrypt" "$volume" "$pass" "$tmp/out"
diff -r --no-dereference "$here/expected" "$tmp/out"
echo "run.sh: committed volume decrypts to tests/independent/expected"

# 2. Tampered copies must be refused (exit status 1 with a one-line reason, no traceback).
hello=0E4FfUCvsyzG0GugiOywBRWmBxXcc69hLg       # hello.txt (root)
sub=aQTI2u9Hn2ZiKA-wChjV-bKwqA                 # sub/
inner=j8Fm8j60YkFpxxHCLFWXK4D5aMmXQgFhNQ       # sub/hello.txt
link=_Tt1-fdj-CEvZWxGXaHxsNePyE4WlLwSUF61xH8   # link-to-hello
long=cloakfs.long.Ij1dQtQ0MF3RZTbNngqfmhuRSpIxeaWNz2KikhrsPr8

flip() { # flip one bit of byte $2 of file $1
    python3 -c 'import sys
p, o = sys.argv[1], int(sys.argv[2])
b = bytearray(open(p, "rb").read()); b[o] ^= 1; open(p, "wb").write(b)' "$1" "$2"
}

n=0
# description, a shell snippet run inside a fresh copy of the volume $volume, then the secret
# options (default: --passfile $pass); the decryptor must exit 1 with a one-line reason
expect_refused() {
    n=$((n + 1))
    what=$1 snippet=$2
    shift 2
    [ $# -gt 0 ] || set -- --passfile "$pass"
    copy="$tmp/tampered$n"
    cp -a "$volume" "$copy"
    (cd "$copy" && eval "$snippet")
    set +e
    python3 "$decrypt" "$@" "$copy" "$tmp/out$n" 2>"$tmp/err$n" >/dev/null
    status=$?
    set -e
    if [ "$status" -ne 1 ] || grep -q Traceback "$tmp/err$n" || [ "$(wc -l <"$tmp/err$n")" -ne 1 ]
    then
        echo "run.sh: FAIL: $what was not refused cleanly (exit $status)" >&2
        cat "$tmp/err$n" >&2
        exit 1
    fi
    echo "run.sh: refused as expected: $what: $(cat "$tmp/err$n")"
}

expect_refused "bit flipped in block 1 of hello.txt" "flip $hello $((18 + 4124 + 100))"
expect_refused "bit flipped in the file header (file ID)" "flip $hello 5"
expect_refused "hello.txt truncated by 10 bytes" \
    "python3 -c 'import os; os.truncate(\"$hello\", os.path.getsize(\"$hello\") - 10)'"
expect_refused "holes flag flipped in the config" "sed -i 's/\"sparse\"/\"strict\"/' cloakfs.conf"
expect_refused "Argon2 iterations changed in the config" \
    "sed -i 's/\"argon2_iterations\": \"1\"/\"argon2_iterations\": \"2\"/' cloakfs.conf"
expect_refused "unknown config version" "sed -i 's/\"cloakfs\": 1/\"cloakfs\": 2/' cloakfs.conf"
expect_refused "file moved into another directory" "mv -- $sub/$inner ."
expect_refused "encrypted name edited" "mv -- $hello ${hello%?}A"
expect_refused "long-name sidecar edited" "sed -i 's/^./A/' $long.name"
expect_refused "symlink target edited" \
    "t=\$(readlink $link); rm $link; ln -s \"A\${t#?}\" $link"
expect_refused "dirid replaced" "printf 0123456789abcdef > $sub/cloakfs.dirid"
expect_refused "name edited in a directory with a copy of its ID file" \
    "printf 0123456789abcdef > $sub/cloakfs.sync-conflict-20261128-101010-4CTITOD.dirid
     mv -- $sub/$inner $sub/${inner%?}A"
printf 'wrong passphrase\n' > "$tmp/wrongpass"
expect_refused "wrong passphrase" ":" --passfile "$tmp/wrongpass"

# 3. A volume made by the real cloakfs, with one slot of each kind that needs no outside program.
cloakfs="$root/target/release/cloakfs"
if [ ! -x "$cloakfs" ]; then
    echo "run.sh: $cloakfs is missing: run cargo build --release first" >&2
    exit 1
fi
# The record of known volumes (key pinning) of these runs stays in $tmp.
CLOAKFS_STATE_DIR="$tmp/known-volumes"
export CLOAKFS_STATE_DIR
real="$tmp/real"
plain="$real/plain"
mkdir -p "$plain" "$mnt"
cp -a "$here/expected/." "$plain/"
head -c 100000 /dev/urandom >"$plain/random.bin"
mkdir "$plain/dir"
echo "name of 40 bytes: stored as is" >"$plain/dir/$(printf '%040d' 4)"
echo "name of 70 bytes: a long name at --long-name-max 100" >"$plain/dir/$(printf '%070d' 7)"
printf 'real volume passphrase\n' >"$real/pass"
# XChaCha20-Poly1305 and a low long-name threshold: what the committed volume does not cover.
"$cloakfs" init --passfile "$real/pass" --kdf-memory 64 --kdf-iterations 1 \
    --cipher xchacha20-poly1305 --long-name-max 100 "$real/cipher" >/dev/null
"$cloakfs" mount --passfile "$real/pass" "$real/cipher" "$mnt"
cp -a "$plain/." "$mnt/"
"$cloakfs" unmount "$mnt"

add_slot() { "$cloakfs" slots add "$real/cipher" --passfile "$real/pass" "$@"; }
head -c 64 /dev/urandom >"$real/keyfile"
add_slot --keyfile "$real/keyfile" --label "key file" >/dev/null
add_slot --recovery --label paper >"$real/recovery.out"
grep -Eo '[0-9A-Z]{4}(-[0-9A-Z]{4}){13}' "$real/recovery.out" >"$real/recovery"
add_slot --shamir 2/3 --share-dir "$real/shares" --label board >/dev/null
age-keygen -o "$real/identity" 2>/dev/null
add_slot --recipient "$(age-keygen -y "$real/identity")" --label laptop >/dev/null
age-keygen -o "$real/holder" 2>/dev/null
holder=$(age-keygen -y "$real/holder")
add_slot --shamir 2/3 --share-dir "$real/sealed-shares" --share-recipient "$holder" \
    --share-recipient "$holder" --share-recipient "$holder" --label sealed >/dev/null
share() { ls "$1"/*"share$2of3.txt"*; }

k=0
expect_opens() { # slot kind, then the secret options: decrypts to exactly $plain
    k=$((k + 1))
    kind=$1
    shift
    python3 "$decrypt" "$@" "$real/cipher" "$real/out$k" >"$real/log$k"
    if ! grep -q "unlocked with slot [0-9]* ($kind)" "$real/log$k"; then
        echo "run.sh: FAIL: not opened by the $kind slot:" >&2
        cat "$real/log$k" >&2
        exit 1
    fi
    diff -r --no-dereference "$plain" "$real/out$k"
    echo "run.sh: cloakfs volume opened with the $kind slot alone: $(head -n 1 "$real/log$k")"
}
expect_opens passphrase --passfile "$real/pass"
expect_opens keyfile --keyfile "$real/keyfile"
expect_opens recovery --recovery-key-file "$real/recovery"
expect_opens shamir --share "$(share "$real/shares" 1)" --share "$(share "$real/shares" 3)"
expect_opens recipient --identity "$real/identity"
expect_opens shamir --identity "$real/holder" --share "$(share "$real/sealed-shares" 2)" \
    --share "$(share "$real/sealed-shares" 3)"

volume="$real/cipher"
head -c 64 /dev/urandom >"$tmp/wrongkey"
expect_refused "wrong key file" ":" --keyfile "$tmp/wrongkey"
# One symbol changed: X, or Y where it already was X (1 key in 32).
sed 's/^\(.\)X/\1Y/; t; s/^\(.\)./\1X/' "$real/recovery" >"$tmp/typo"
expect_refused "mistyped recovery key" ":" --recovery-key-file "$tmp/typo"
expect_refused "one share of a 2-of-3 slot" ":" --share "$(share "$real/shares" 2)"
python3 -c 'import sys
lines = open(sys.argv[1]).read().split("\n")
i = [n for n, l in enumerate(lines) if l.startswith("cloakfs-share:")][0]
c = lines[i][40]
lines[i] = lines[i][:40] + ("B" if c == "A" else "A") + lines[i][41:]
open(sys.argv[2], "w").write("\n".join(lines))' "$(share "$real/shares" 1)" "$tmp/bad-share"
expect_refused "share with a changed character" ":" \
    --share "$tmp/bad-share" --share "$(share "$real/shares" 2)"
expect_refused "sealed share without its identity" ":" \
    --share "$(share "$real/sealed-shares" 1)" --share "$(share "$real/sealed-shares" 2)"
age-keygen -o "$tmp/stranger" 2>/dev/null
expect_refused "identity that is no recipient" ":" --identity "$tmp/stranger"

# 4. Each name has one stored form (FORMAT.md 9.1): the other one is refused.
# (the 70-byte name: its encrypted form, unlike the 200-byte one's, fits in a backing name)
long_entry=$(cd "$real/cipher" && find . -name 'cloakfs.long.*.name' -size -200c | head -n 1)
long_entry=${long_entry%.name}
short_entry=$(cd "$real/cipher" && find . -mindepth 1 -maxdepth 1 ! -name 'cloakfs.*' \
    -type f | head -n 1)
expect_refused "long name moved into the short form" \
    "mv -- $long_entry \$(dirname $long_entry)/\$(cat $long_entry.name) && rm $long_entry.name" \
    --passfile "$real/pass"
expect_refused "short name moved into the long form" \
    "e=\$(basename $short_entry); h=\$(printf %s \$e | python3 -c 'import base64, hashlib, sys
print(base64.urlsafe_b64encode(hashlib.sha256(sys.stdin.buffer.read()).digest()).decode().rstrip(\"=\"))')
     printf %s \$e >cloakfs.long.\$h.name && mv -- \$e cloakfs.long.\$h" --passfile "$real/pass"

# 5. A copy of a reverse view (FORMAT.md section 17) is an ordinary volume: it decrypts to the
# plaintext directory it showed.
"$cloakfs" init --reverse --passfile "$real/pass" --kdf-memory 64 --kdf-iterations 1 \
    --config "$real/reverse.conf" "$plain" >/dev/null
"$cloakfs" reverse --passfile "$real/pass" --config "$real/reverse.conf" "$plain" "$mnt"
cp -a "$mnt" "$real/reverse-copy"
"$cloakfs" unmount "$mnt"
python3 "$decrypt" --passfile "$real/pass" "$real/reverse-copy" "$real/reverse-out" >/dev/null
diff -r --no-dereference "$plain" "$real/reverse-out"
echo "run.sh: a copy of a reverse view decrypts to its plaintext directory"

# 6. Sharing volumes (FORMAT.md section 18): the committed shared file, and a file shared by the
# real cloakfs through a mount, decrypted with a recipient's age key alone.
shared="$here/decrypt_shared_file.py"
vectors="$root/crates/cloakfs-core/tests/vectors"
sed -n 's/^| age X25519 identity | `\(AGE-SECRET-KEY-1[^`]*\)`.*/\1/p' "$root/docs/FORMAT.md" >"$tmp/vector.key"
for v in shared-file.bin shared-file-v2.bin shared-file-mac.bin; do
    python3 "$shared" "$vectors/$v" "$tmp/vector.key" "$tmp/shared.out"
    printf 'cloakfs partial block\n' | cmp - "$tmp/shared.out"
done
# The volume MAC (FORMAT.md 18.2) under the master key and volume ID of 15.1: required, so the
# header without it is refused, and one flipped bit of it too.
vkey="--master-key 000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f
    --volume-id a0a1a2a3a4a5a6a7a8a9aaabacadaeaf"
python3 "$shared" $vkey "$vectors/shared-file-mac.bin" "$tmp/vector.key" "$tmp/shared.out"
printf 'cloakfs partial block\n' | cmp - "$tmp/shared.out"
python3 -c "import sys; b=bytearray(open(sys.argv[1],'rb').read()); i=b.index(bytes(64), 20); b[i-1]^=1; open(sys.argv[2],'wb').write(b)" \
    "$vectors/shared-file-mac.bin" "$tmp/flipped-vmac"
for bad in "$vectors/shared-file.bin" "$tmp/flipped-vmac"; do
    if python3 "$shared" $vkey "$bad" "$tmp/vector.key" "$tmp/x" 2>"$tmp/vmac.err" ||
        ! grep -q "volume" "$tmp/vmac.err"; then
        echo "run.sh: a shared header without a right volume MAC was accepted: $bad" >&2
        exit 1
    fi
done
team="$tmp/team"
mkdir -p "$team"
age-keygen -o "$team/alice.key" 2>/dev/null
age-keygen -o "$team/bob.key" 2>/dev/null
age-keygen -o "$team/eve.key" 2>/dev/null
"$cloakfs" init --sharing --passfile "$real/pass" --kdf-memory 64 --kdf-iterations 1 \
    "$team/cipher" >/dev/null
"$cloakfs" slots add "$team/cipher" --passfile "$real/pass" \
    --recipient "$(age-keygen -y "$team/alice.key")" >/dev/null
"$cloakfs" mount --identity "$team/alice.key" "$team/cipher" "$mnt"
seq 1 3000 >"$mnt/shared.txt"
"$cloakfs" share add "$mnt/shared.txt" --recipient "$(age-keygen -y "$team/bob.key")" >/dev/null
"$cloakfs" unmount "$mnt"
backing=$(find "$team/cipher" -maxdepth 1 -type f ! -name 'cloakfs.*')
python3 "$shared" "$backing" "$team/bob.key" "$tmp/shared2.out"
seq 1 3000 | cmp - "$tmp/shared2.out"
if python3 "$shared" "$backing" "$team/eve.key" "$tmp/x" 2>/dev/null; then
    echo "run.sh: a key without an entry decrypted the shared file" >&2
    exit 1
fi
cp "$backing" "$tmp/forged"
# One letter of the first recipient's key changed (still valid text): only the list MAC sees it.
python3 -c "import sys; p=sys.argv[1]; b=bytearray(open(p,'rb').read()); b[30]=ord('q') if b[30]!=ord('q') else ord('p'); open(p,'wb').write(b)" "$tmp/forged"
if python3 "$shared" "$tmp/forged" "$team/bob.key" "$tmp/x" 2>"$tmp/forged.err" ||
    ! grep -q "failed authentication" "$tmp/forged.err"; then
    echo "run.sh: a forged recipient list was accepted" >&2
    exit 1
fi
# A kind-2 entry (FORMAT.md 18.1): shared to a gpg key, opened with `gpg --decrypt` alone. (A
# short GNUPGHOME: gpg-agent's socket path must fit in sockaddr_un.)
gnupghome=$(mktemp -d /tmp/cloakfs-gpg.XXXXXX)
GNUPGHOME="$gnupghome" gpg --batch --pinentry-mode loopback --passphrase '' \
    --quick-gen-key "Dave <dave@example.org>" future-default default never 2>/dev/null
GNUPGHOME="$gnupghome" "$cloakfs" share add --volume "$team/cipher" --identity "$team/alice.key" \
    shared.txt --gpg-recipient dave@example.org >/dev/null
python3 "$shared" "$backing" - "$tmp/shared3.out" "$gnupghome"
seq 1 3000 | cmp - "$tmp/shared3.out"
echo "run.sh: shared files decrypt with a recipient's age or gpg key alone; others and forgeries refused"
# 7. A size-preserving volume (FORMAT.md section 20): files of every tail kind, written through
# a mount, decrypt to the same bytes; every backing file has its plaintext's size.
xplain="$real/xts-plain"
mkdir -p "$xplain/sub"
for n in 1 15 16 17 4095 4096 4097 4111 4112 1048581; do
    head -c "$n" /dev/urandom >"$xplain/f$n"
done
truncate -s 70000 "$xplain/sub/sparse" && printf middle | dd of="$xplain/sub/sparse" bs=1 \
    seek=40000 conv=notrunc status=none
: >"$xplain/empty"
"$cloakfs" init --cipher aes-256-xts --passfile "$real/pass" --kdf-memory 64 \
    --kdf-iterations 1 "$real/xts" >/dev/null
"$cloakfs" mount --passfile "$real/pass" "$real/xts" "$mnt"
cp -a "$xplain/." "$mnt/"
# A short tail written again: its header holds a later counter block.
for d in "$mnt" "$xplain"; do
    printf abc | dd of="$d/f4097" bs=1 seek=4096 conv=notrunc status=none
done
"$cloakfs" unmount "$mnt"
python3 "$decrypt" --passfile "$real/pass" "$real/xts" "$real/xts-out" >/dev/null
diff -r "$xplain" "$real/xts-out"
sizes() { find "$1" -type f ! -name 'cloakfs.*' -size +0 -printf '%s\n' | sort -n; }
[ "$(sizes "$xplain")" = "$(sizes "$real/xts")" ] || {
    echo "run.sh: aes-256-xts backing sizes differ from the plaintext sizes" >&2
    exit 1
}
echo "run.sh: an aes-256-xts volume decrypts, and its backing files have the plaintext sizes"

# 8. An adopted tree (FORMAT.md section 21) converted by `cloakfs encrypt -r` is an ordinary
# volume: it decrypts to the tree it held; before the conversion it is refused.
aplain="$real/adopt-plain"
mkdir -p "$aplain/sub"
echo "an adopted file" >"$aplain/sub/notes.txt"
ln -s sub/notes.txt "$aplain/link"
cp -a "$aplain" "$real/adopted"
"$cloakfs" init --adopt --passfile "$real/pass" --kdf-memory 64 --kdf-iterations 1 \
    "$real/adopted" >/dev/null
if python3 "$decrypt" --passfile "$real/pass" "$real/adopted" "$real/adopted-early" \
    2>/dev/null >&2; then
    echo "run.sh: an adopted tree with plaintext entries was decrypted" >&2
    exit 1
fi
"$cloakfs" mount --passfile "$real/pass" "$real/adopted" "$mnt"
"$cloakfs" encrypt -r "$mnt" >/dev/null
"$cloakfs" unmount "$mnt"
python3 "$decrypt" --passfile "$real/pass" "$real/adopted" "$real/adopted-out" >/dev/null
diff -r --no-dereference "$aplain" "$real/adopted-out"
echo "run.sh: a converted adopted tree decrypts to the tree it held"

# 9. A volume in a sync folder (FORMAT.md 2.1 and 9.2), left as Syncthing leaves it when two
# devices changed the same places while apart (device a's versions lose, with Syncthing's
# names): the directory docs made on both with random IDs (as cloakfs made them before derived
# IDs), so a's cloakfs.dirid is renamed beside b's and the two sides' entries merged, a name
# made on both sides; files and a long name edited on both, a's versions renamed to conflict
# copies (Syncthing's naming, and Dropbox's, Nextcloud's, OneDrive's, Resilio's); a long name
# left only as a copy, with a copy of its sidecar; a file that already has a copy's shown name;
# a copy of a file named under a's ID. The decryptor gives the tree `cloakfs export` gives, under the names
# FORMAT.md says.
sync="$tmp/sync"
mkdir -p "$sync"
stem=$(printf 'a-long-report-name-%.0s' 1 2 3 4 5 6 7 8 9 10)
"$cloakfs" init --passfile "$real/pass" --kdf-memory 64 --kdf-iterations 1 "$sync/a" >/dev/null
"$cloakfs" mount --passfile "$real/pass" "$sync/a" "$mnt"
for f in report.txt notes.md plan photo.jpg todo.txt "$stem.txt"; do echo first >"$mnt/$f"; done
echo "only copy" >"$mnt/${stem}2.md"
echo "a real file" >"$mnt/report (conflict 2026-11-28 4CTITOD).txt"
"$cloakfs" unmount "$mnt"
cp -a "$sync/a" "$sync/b"
for side in a b; do
    CLOAKFS_TEST_RANDOM_DIR_IDS=1 "$cloakfs" mount --passfile "$real/pass" "$sync/$side" "$mnt"
    mkdir "$mnt/docs"
    for i in 0 1 2; do echo "$side$i" >"$mnt/docs/$side$i.txt"; done
    echo "from $side" >"$mnt/docs/same.txt"
    for f in report.txt notes.md plan photo.jpg todo.txt; do echo "edit on $side" >"$mnt/$f"; done
    echo "long edit on $side" >"$mnt/$stem.txt"
    "$cloakfs" unmount "$mnt"
done
backing() { basename "$("$cloakfs" name --passfile "$real/pass" "$sync/b" "$1" 2>/dev/null)"; }
docs=$(backing docs)
long1=$(backing "$stem.txt") long2=$(backing "${stem}2.md")
if cmp -s "$sync/a/$docs/cloakfs.dirid" "$sync/b/$docs/cloakfs.dirid"; then
    echo "run.sh: FAIL: the two devices' docs have one ID: no conflict to decrypt" >&2
    exit 1
fi
st=sync-conflict-20261128-101010-4CTITOD
merged="$sync/a"
mv "$merged/$docs/cloakfs.dirid" "$merged/$docs/cloakfs.sync-conflict-20261128-151500-4CTITOD.dirid"
cp -a "$sync/b/$docs/." "$merged/$docs/"
# A conflict copy of a file named under a's ID, now the ID file's copy's (found by cloakfs name).
a0=$(basename "$("$cloakfs" name --passfile "$real/pass" "$merged" docs/a0.txt 2>/dev/null)")
cp -p "$merged/$docs/$a0" "$merged/$docs/$a0.$st"
conflict() { # plaintext name, client's marker: b's version is kept, a's becomes the copy
    b=$(backing "$1")
    mv "$merged/$b" "$merged/$b$2"
    cp -a "$sync/b/$b" "$merged/"
}
conflict report.txt ".$st"
conflict notes.md " (Ann's conflicted copy 2026-11-28)"
conflict plan " (conflicted copy bob 2026-11-28 101010)"
conflict photo.jpg -LAPTOP-7
conflict todo.txt .Conflict
mv "$merged/$long1" "$merged/cloakfs.long.$st.${long1#cloakfs.long.}"
cp -a "$sync/b/$long1" "$merged/"
mv "$merged/$long2" "$merged/cloakfs.long.$st.${long2#cloakfs.long.}"
mv "$merged/$long2.name" "$merged/$long2.$st.name"
"$cloakfs" export --passfile "$real/pass" "$merged" "$sync/export" >/dev/null
python3 "$decrypt" --passfile "$real/pass" "$merged" "$sync/out" >/dev/null
diff -r --no-dereference "$sync/export" "$sync/out"
# The names, the tag (6 hex digits of SHA-256 of a backing name) written as TAG.
(cd "$sync/out" && find . -mindepth 1 | LC_ALL=C sort | sed 's/ #[0-9a-f]\{6\})/ #TAG)/') \
    >"$sync/names"
LC_ALL=C sort >"$sync/expected" <<EOF
./$stem (conflict 2026-11-28 4CTITOD).txt
./$stem.txt
./${stem}2 (conflict 2026-11-28 4CTITOD).md
./docs
./docs/a0 (conflict 2026-11-28 4CTITOD).txt
./docs/a0.txt
./docs/a1.txt
./docs/a2.txt
./docs/b0.txt
./docs/b1.txt
./docs/b2.txt
./docs/same (conflict 2026-11-28 4CTITOD).txt
./docs/same.txt
./notes (conflict 2026-11-28 Ann).md
./notes.md
./photo (conflict LAPTOP-7).jpg
./photo.jpg
./plan
./plan (conflict 2026-11-28 bob)
./report (conflict 2026-11-28 4CTITOD #TAG).txt
./report (conflict 2026-11-28 4CTITOD).txt
./report.txt
./todo (conflict Resilio).txt
./todo.txt
EOF
diff "$sync/expected" "$sync/names"
out="$sync/out"
for check in "docs/same.txt:from b" "docs/same (conflict 2026-11-28 4CTITOD).txt:from a" \
    "docs/a0 (conflict 2026-11-28 4CTITOD).txt:a0" "report.txt:edit on b" "report (conflict 2026-11-28 4CTITOD).txt:a real file" \
    "notes (conflict 2026-11-28 Ann).md:edit on a" "plan (conflict 2026-11-28 bob):edit on a" \
    "photo (conflict LAPTOP-7).jpg:edit on a" "todo (conflict Resilio).txt:edit on a" \
    "$stem.txt:long edit on b" "$stem (conflict 2026-11-28 4CTITOD).txt:long edit on a" \
    "${stem}2 (conflict 2026-11-28 4CTITOD).md:only copy" \
    "$(cd "$out" && echo report\ \(conflict\ 2026-11-28\ 4CTITOD\ \#*):edit on a"; do
    [ "$(cat "$out/${check%%:*}")" = "${check#*:}" ] || {
        echo "run.sh: FAIL: ${check%%:*} does not hold \"${check#*:}\"" >&2
        exit 1
    }
done
echo "run.sh: a volume with sync conflicts (two directory IDs, conflict copies) decrypts as cloakfs export shows it"

echo "run.sh: all checks passed"
