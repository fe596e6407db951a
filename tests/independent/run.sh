#!/bin/sh
# Decrypts the committed test volume with the independent Python decryptor (written from
# docs/FORMAT.md only), compares it with the expected plaintext, and checks that tampered copies
# are rejected. Exits non-zero on any difference.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
volume="$root/crates/cloakfs-core/tests/vectors/volume"
decrypt="$here/decrypt_volume.py"
pass="$here/passphrase.txt"

probe='from cryptography.hazmat.primitives.ciphers.aead import AESGCM, AESSIV, ChaCha20Poly1305
from argon2.low_level import hash_secret_raw'
if ! python3 -c "$probe" 2>/dev/null; then
    echo "run.sh: installing cryptography and argon2-cffi with pip"
    python3 -m pip install --quiet cryptography argon2-cffi ||
        python3 -m pip install --quiet --user cryptography argon2-cffi ||
        python3 -m pip install --quiet --break-system-packages cryptography argon2-cffi
    python3 -c "$probe"
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT INT TERM

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
expect_refused() { # description, then a shell snippet run inside a fresh copy of the volume
    n=$((n + 1))
    copy="$tmp/tampered$n"
    cp -a "$volume" "$copy"
    (cd "$copy" && eval "$2")
    set +e
    python3 "$decrypt" "$copy" "${3:-$pass}" "$tmp/out$n" 2>"$tmp/err$n" >/dev/null
    status=$?
    set -e
    if [ "$status" -ne 1 ] || grep -q Traceback "$tmp/err$n"; then
        echo "run.sh: FAIL: $1 was not refused cleanly (exit $status)" >&2
        cat "$tmp/err$n" >&2
        exit 1
    fi
    echo "run.sh: refused as expected: $1: $(cat "$tmp/err$n")"
}

expect_refused "bit flipped in block 1 of hello.txt" "flip $hello $((18 + 4124 + 100))"
expect_refused "bit flipped in the file header (file ID)" "flip $hello 5"
expect_refused "hello.txt truncated by 10 bytes" \
    "python3 -c 'import os; os.truncate(\"$hello\", os.path.getsize(\"$hello\") - 10)'"
expect_refused "holes flag flipped in the config" "sed -i 's/\"sparse\"/\"strict\"/' cloakfs.conf"
expect_refused "Argon2 iterations changed in the config" \
    "sed -i 's/\"argon2_iterations\": \"1\"/\"argon2_iterations\": \"2\"/' cloakfs.conf"
expect_refused "unknown config version" "sed -i 's/\"cloakfs\": 1/\"cloakfs\": 2/' cloakfs.conf"
expect_refused "file moved into another directory" "mv $sub/$inner ."
expect_refused "encrypted name edited" "mv $hello ${hello%?}A"
expect_refused "long-name sidecar edited" "sed -i 's/^./A/' $long.name"
expect_refused "symlink target edited" \
    "t=\$(readlink $link); rm $link; ln -s \"A\${t#?}\" $link"
expect_refused "dirid replaced" "printf 0123456789abcdef > $sub/cloakfs.dirid"
printf 'wrong passphrase\n' > "$tmp/wrongpass"
expect_refused "wrong passphrase" ":" "$tmp/wrongpass"

echo "run.sh: all checks passed"
