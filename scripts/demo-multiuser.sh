#!/usr/bin/env bash
# The multi-user daemon's worked example (docs/MULTI-USER.md, after NCryptfs section 3.6), for
# real: two users (made with useradd), each in a shell that leads its own Unix session, sharing an
# encrypted project without sharing a Unix group or the volume's key.
#   scripts/demo-multiuser.sh            (as root; leaves nothing running)
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "run as root (the daemon serves every user)" >&2; exit 2; }
if [ "${SKIP_DEPS:-0}" != 1 ]; then scripts/install-deps.sh; fi
cargo build --release
base=/tmp/cloakfs-multiuser-demo
bin=$base/bin
crypt=$base/crypt
sock=$base/control.sock
rm -rf "$base"
mkdir -p "$bin" "$crypt"
chmod 755 "$base"
cp target/release/cloakfs "$bin/"

for u in erez mike; do
    id -u "cfs-$u" > /dev/null 2>&1 ||
        useradd --system --user-group --no-create-home --shell /bin/sh "cfs-$u"
    mkdir -p "$base/$u"
    chown "cfs-$u:" "$base/$u"
    chmod 700 "$base/$u"
done
echo "correct horse battery staple" > "$base/erez/volume.pass"
echo "mike's own passphrase" > "$base/mike/auth.pass"
cp "$base/mike/auth.pass" "$base/erez/mike.pass"   # Mike hands it over once
chown cfs-erez: "$base/erez/"*.pass
chown cfs-mike: "$base/mike/"*.pass

"$bin/cloakfs" daemon --root "$crypt" --socket "$sock" --log-file "$base/daemon.log" &
daemon=$!
cleanup() {
    exec 3>&- 5>&- 2> /dev/null || true
    kill "$daemon" 2> /dev/null || true
    wait "$daemon" 2> /dev/null || true
    mountpoint -q "$crypt" && fusermount3 -uz "$crypt"
    return 0
}
trap cleanup EXIT
until "$bin/cloakfs" status --socket "$sock" > /dev/null 2>&1; do
    kill -0 "$daemon" || exit 1
    sleep 0.1
done

# One long-lived shell per user, leader of its own session, fed through a fifo.
start_shell() { # USER IN-FD OUT-FD
    mkfifo "$base/$1.in" "$base/$1.out"
    setpriv --reuid="cfs-$1" --regid="cfs-$1" --init-groups \
        env -i PATH="$bin:/usr/bin:/bin" CLOAKFS_SOCKET="$sock" HOME="$base/$1" \
        setsid sh -s < "$base/$1.in" > "$base/$1.out" 2>&1 &
}
start_shell erez
exec 3> "$base/erez.in" 4< "$base/erez.out"
start_shell mike
exec 5> "$base/mike.in" 6< "$base/mike.out"
as() { # erez|mike COMMAND: run it in that user's shell and show it
    local in out line
    if [ "$1" = erez ]; then in=3 out=4; else in=5 out=6; fi
    echo "$1\$ $2"
    echo "cd \$HOME; { $2
}; echo __done" >&$in
    while IFS= read -r line <&$out; do
        [ "$line" = __done ] && break
        echo "    $line"
    done
}

echo "== Erez creates a volume and attaches it as /crypt/proj"
as erez "cloakfs init --passfile volume.pass --kdf-memory 65536 --kdf-iterations 1 proj.enc > /dev/null && chmod 700 proj.enc"
as erez "cloakfs attach --passfile volume.pass proj.enc proj"
as erez "echo 'int main(void) { return 0; }' > $crypt/proj/main.c && ls -l $crypt/proj"
echo
echo "== Mike is refused: no authorization"
as mike "cat $crypt/proj/main.c"
echo
echo "== Erez grants Mike read, write and bypass (they share no group) with a passphrase,"
echo "   sessions of 1 hour, 15 minutes idle, sleeping on timeout"
as erez "cloakfs authz add proj --user cfs-mike --perms read,write,exec,bypass --auth passphrase --passfile mike.pass --kdf-memory 65536 --kdf-iterations 1 --expires 6h --session-ttl 1h --idle 15m --on-timeout sleep-all --callback 'logger cloakfs: \$1 \$2'"
as erez "cloakfs authz list proj"
echo
echo "== Mike authenticates (challenge-response) and works"
as mike "cloakfs auth proj --passfile auth.pass"
as mike "cat $crypt/proj/main.c && echo '// reviewed by mike' >> $crypt/proj/main.c"
as erez "cloakfs sessions proj"
echo
echo "== Erez revokes Mike's session: refused at once, and for good"
as erez "cloakfs revoke proj 2"   # Mike's session, as listed above
as mike "cat $crypt/proj/main.c"
as mike "cloakfs auth proj --passfile auth.pass"
echo
echo "== What reached the disk"
as erez "ls proj.enc"
echo
echo "== Erez detaches: the key is wiped"
as erez "cloakfs detach proj && ls $crypt"
