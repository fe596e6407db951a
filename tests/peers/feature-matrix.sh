#!/usr/bin/env bash
# feature-matrix.sh - measure which POSIX features and which tamper detections the
# encrypted FUSE file systems on this machine actually have, and print a Markdown table.
#
# Usage:  tests/peers/feature-matrix.sh [FS ...] > matrix.md
#   FS: gocryptfs securefs cryfs cloakfs encfs   (default: gocryptfs securefs cryfs cloakfs)
#
# For each FS: a fresh volume in a temp dir (under $FM_BASE, default /var/tmp, a real
# disk so that `du` means something), init + mount with the same commands as
# /work/shared/bench/peers.sh (daemon in the foreground, as our child, '&'), the probes,
# unmount (fusermount3 -u, wait for the daemon), removal of the temp dir.
# Table on stdout; progress and diagnostics on stderr only.  See README.md here.
#
# Environment:
#   CLOAKFS_BIN       cloakfs binary (default target/release/cloakfs, relative to the cwd)
#   FM_BASE           where the temp dir goes (default /var/tmp)
#   FM_MOUNT_TIMEOUT  seconds to wait for a mount (default 240; cryfs needs ~40 s here)
#   FM_PROBE_TIMEOUT  seconds per probe (default 40; the sparse probe gets 3x)
#   FM_KEEP=1         keep the temp dir (logs of daemons and probes) for debugging
set -uo pipefail

FSLIST=("$@")
[ ${#FSLIST[@]} -gt 0 ] || FSLIST=(gocryptfs securefs cryfs cloakfs)

CLOAKFS=${CLOAKFS_BIN:-target/release/cloakfs}
case $CLOAKFS in /*) ;; */*) CLOAKFS="$PWD/$CLOAKFS" ;; esac   # absolute: probes cd around
: "${FM_BASE:=/var/tmp}"
: "${FM_MOUNT_TIMEOUT:=240}"
: "${FM_PROBE_TIMEOUT:=40}"
PY=/usr/bin/python3; [ -x "$PY" ] || PY=$(command -v python3)
export PY

WORK=$(mktemp -d "$FM_BASE/cloakfs-fm.XXXXXX") || { echo "cannot create temp dir" >&2; exit 2; }
PASS=benchpass
PASSFILE="$WORK/pass"
echo "$PASS" > "$PASSFILE"; chmod 600 "$PASSFILE"
# cryfs remembers basedir -> filesystem id under $XDG_DATA_HOME/cryfs; keep that in our temp dir.
export XDG_DATA_HOME="$WORK/xdg"

say() { echo "[fm $(date +%H:%M:%S)] $*" >&2; }

# ---------------------------------------------------------------- init / mount (as peers.sh)
DAEMON_PID=""
ALL_PIDS=()
init_gocryptfs() { gocryptfs -init -q -passfile "$PASSFILE" "$1"; }
mount_gocryptfs() { gocryptfs -fg -q -nosyslog -passfile "$PASSFILE" "$1" "$2" & DAEMON_PID=$!; }

init_securefs() { securefs create --pass "$PASS" "$1" > /dev/null; }
mount_securefs() { securefs mount --log "$VOL/securefs-daemon.log" --pass "$PASS" "$1" "$2" & DAEMON_PID=$!; }

init_encfs() { :; }
mount_encfs() { encfs -f --standard --extpass="cat $PASSFILE" "$1" "$2" & DAEMON_PID=$!; }

init_cryfs() { :; }
mount_cryfs() {
    CRYFS_FRONTEND=noninteractive CRYFS_NO_UPDATE_CHECK=true \
        cryfs -f "$1" "$2" < "$PASSFILE" & DAEMON_PID=$!
}

init_cloakfs() { "$CLOAKFS" init --passfile "$PASSFILE" --kdf-memory 65536 --kdf-iterations 1 "$1"; }
mount_cloakfs() { "$CLOAKFS" mount --foreground --passfile "$PASSFILE" "$1" "$2" & DAEMON_PID=$!; }

version_of() {
    case $1 in
        gocryptfs) gocryptfs -version 2>&1 | head -1 ;;
        securefs) securefs version 2>&1 | head -3 | tr '\n' ' ' ;;
        cryfs) cryfs --version 2>&1 | head -1 ;;
        encfs) encfs --version 2>&1 | head -1 ;;
        cloakfs) "$CLOAKFS" --version 2>&1 | head -1 ;;
    esac
}
help_of() {   # all help text of a tool (main + subcommands where it has them)
    case $1 in
        gocryptfs) gocryptfs -help 2>&1 ;;
        securefs) securefs --help 2>&1; for s in create mount chpass info; do securefs "$s" --help 2>&1; done ;;
        cryfs) cryfs --help 2>&1 ;;
        encfs) encfs --help 2>&1; encfsctl --help 2>&1 ;;
        cloakfs)
            local h s
            h=$("$CLOAKFS" --help 2>&1); echo "$h"
            for s in $(echo "$h" | awk '/^[A-Za-z ]*[Cc]ommands:/{f=1; next} f && /^  [a-z]/{print $1} f && /^[^ ]/{f=0}'); do
                [ "$s" = help ] || "$CLOAKFS" "$s" --help 2>&1
            done ;;
    esac
}
config_tamper() {   # FS CIPHERDIR: edit the config; prints "applied: ..." or "n/a (...)"
    case $1 in
        gocryptfs)
            "$PY" - "$2/gocryptfs.conf" <<'EOF'
import json, sys
p = sys.argv[1]
d = json.load(open(p))
ff = d.get("FeatureFlags")
if not isinstance(ff, list) or "PlaintextNames" in ff:
    print("n/a (unexpected FeatureFlags)"); sys.exit()
ff.append("PlaintextNames")
open(p, "w").write(json.dumps(d, indent="\t") + "\n")
print("applied: PlaintextNames added to FeatureFlags")
EOF
            ;;
        cloakfs)
            if grep -qE '"holes": *"sparse"' "$2/cloakfs.conf" 2>/dev/null; then
                sed -i -E 's/("holes": *)"sparse"/\1"strict"/' "$2/cloakfs.conf"
                echo 'applied: "holes": "sparse" -> "strict"'
            else
                echo 'n/a (no "holes": "sparse" in cloakfs.conf)'
            fi ;;
        *) echo "n/a (not probed for $1)" ;;
    esac
}

# ---------------------------------------------------------------- mount helpers
is_mounted() { awk -v m="$1" '$2 == m {f = 1} END {exit !f}' /proc/mounts; }

wait_mounted() {  # MNT PID: poll mountpoint -q, bounded; fail early if the daemon exits
    local i n=$((FM_MOUNT_TIMEOUT * 10))
    for ((i = 0; i < n; i++)); do
        mountpoint -q "$1" && return 0
        kill -0 "$2" 2>/dev/null || { sleep 0.2; mountpoint -q "$1"; return; }
        sleep 0.1
    done
    return 1
}

do_mount() {  # FS: mount $C on $M; sets DAEMON_PID; returns 0 when mounted
    DAEMON_PID=""
    echo "--- mount $(date +%T)" >> "$VOL/daemon.log"
    "mount_$1" "$C" "$M" >> "$VOL/daemon.log" 2>&1
    [ -n "$DAEMON_PID" ] || return 1
    ALL_PIDS+=("$DAEMON_PID")
    if wait_mounted "$M" "$DAEMON_PID"; then return 0; fi
    do_umount
    return 1
}

do_umount() {  # unmount $M, wait for $DAEMON_PID (bounded), TERM/KILL it as a last resort
    local i p=$DAEMON_PID
    sync
    for ((i = 0; i < 50; i++)); do
        is_mounted "$M" || break
        fusermount3 -u "$M" 2>/dev/null && break
        sleep 0.2
    done
    if is_mounted "$M"; then say "WARNING: $M still mounted, lazy unmount"; fusermount3 -uz "$M"; fi
    [ -n "$p" ] || return 0
    for ((i = 0; i < 600; i++)); do
        kill -0 "$p" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$p" 2>/dev/null; then say "WARNING: daemon $p did not exit; TERM"; kill "$p"; sleep 1; fi
    kill -0 "$p" 2>/dev/null && kill -9 "$p"
    wait "$p" 2>/dev/null
    DAEMON_PID=""
    return 0
}

alive() { [ -n "$DAEMON_PID" ] && kill -0 "$DAEMON_PID" 2>/dev/null && timeout -k 2 10 stat "$M" > /dev/null 2>&1; }

ensure_mounted() {  # FS: remount if the daemon died (after a tamper probe, say)
    alive && return 0
    say "$1: daemon gone or mount dead; remounting"
    NOTES+=("$1: the daemon died during the tamper checks (remounted)")
    do_umount; do_mount "$1"
}

cleanup() {
    local m p
    for m in $(awk -v w="$WORK/" 'index($2, w) == 1 {print $2}' /proc/mounts 2>/dev/null); do
        fusermount3 -u "$m" 2>/dev/null || fusermount3 -uz "$m" 2>/dev/null
    done
    for p in "${ALL_PIDS[@]}"; do
        kill -0 "$p" 2>/dev/null || continue
        sleep 1; kill -0 "$p" 2>/dev/null && kill "$p" 2>/dev/null
        sleep 1; kill -0 "$p" 2>/dev/null && kill -9 "$p" 2>/dev/null
        wait "$p" 2>/dev/null
    done
    if [ "${FM_KEEP:-0}" = 1 ]; then say "kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---------------------------------------------------------------- probes (run in a child bash)
# Every probe prints one line (its cell) on stdout: "yes ...", "no (...)" or "error: ...".
# It runs in its own directory $M/p_<name> with a timeout; $C is the cipher dir.
short() {  # last ": "-separated part of an error message, as an errno name when it is one
    local m; m=$(tr '\n' ' ' <<< "$1" | sed -E 's/ +$//; s/^.*: //')
    "$PY" -c '
import errno, os, sys
m = sys.argv[1]
names = {os.strerror(e): n for e, n in errno.errorcode.items()}
print(names.get(m, m)[:40])' "$m"
}
pdir() { mkdir "$M/p_$1" && cd "$M/p_$1"; }

probe_hardlink() {
    pdir hardlink || { echo "error: mkdir"; return; }
    echo data > a || { echo "error: write"; return; }
    local err; err=$(ln a b 2>&1) || { echo "no ($(short "$err"))"; return; }
    echo more >> b
    local ia ib n shared=no; ia=$(stat -c %i a); ib=$(stat -c %i b); n=$(stat -c %h a)
    [ "$(cat a)" = "$(printf 'data\nmore')" ] && shared=yes
    if [ "$ia" = "$ib" ] && [ "$n" = 2 ] && [ $shared = yes ]; then echo yes
    elif [ $shared = yes ]; then echo "partly (data shared; st_ino $ia/$ib, nlink $n)"
    else echo "no (copy: ino $ia/$ib, nlink $n)"; fi
}
probe_symlink() {
    pdir symlink || { echo "error: mkdir"; return; }
    local t="../some dir/target-$RANDOM" err
    err=$(ln -s "$t" l 2>&1) || { echo "no ($(short "$err"))"; return; }
    [ -L l ] && [ "$(readlink l)" = "$t" ] && echo yes || echo "no (readlink: $(readlink l))"
}
probe_dirmove() {
    pdir dirmove || { echo "error: mkdir"; return; }
    mkdir -p a/sub b && echo x > a/sub/f || { echo "error: setup"; return; }
    local err; err=$(mv a/sub b/ 2>&1) || { echo "no ($(short "$err"))"; return; }
    [ "$(cat b/sub/f 2>&1)" = x ] && [ ! -e a/sub ] && echo yes || echo "no (content/listing wrong)"
}
RENAMEAT2_PY='
import ctypes, os, sys, errno
libc = ctypes.CDLL(None, use_errno=True)
def r2(a, b, fl):
    if hasattr(libc, "renameat2"):
        f = libc.renameat2
        f.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
        r = f(-100, a.encode(), -100, b.encode(), fl)
    else:   # x86_64 syscall number
        r = libc.syscall(316, -100, a.encode(), -100, b.encode(), fl)
    return 0 if r == 0 else ctypes.get_errno()
def rd(p): return open(p).read()
open("a", "w").write("A"); open("b", "w").write("B")
if sys.argv[1] == "noreplace":
    e = r2("a", "b", 1)
    if e != errno.EEXIST:
        print("no (%s on existing target)" % (errno.errorcode.get(e, e) if e else "replaced")); sys.exit()
    if rd("a") != "A" or rd("b") != "B": print("no (files changed)"); sys.exit()
    e = r2("a", "c", 1)
    if e: print("no (%s)" % errno.errorcode.get(e, e)); sys.exit()
    print("yes" if rd("c") == "A" and not os.path.exists("a") else "no (wrong result)")
else:
    e = r2("a", "b", 2)
    if e: print("no (%s)" % errno.errorcode.get(e, e)); sys.exit()
    print("yes" if rd("a") == "B" and rd("b") == "A" else "no (not swapped)")
'
probe_noreplace() { pdir noreplace || { echo "error: mkdir"; return; }; "$PY" -c "$RENAMEAT2_PY" noreplace 2>&1 | tail -1; }
probe_exchange() { pdir exchange || { echo "error: mkdir"; return; }; "$PY" -c "$RENAMEAT2_PY" exchange 2>&1 | tail -1; }
probe_xattr() {
    pdir xattr || { echo "error: mkdir"; return; }
    echo x > f
    "$PY" -c '
import os, errno
try:
    os.setxattr("f", "user.cloakfs_test", b"value-1")
    v = os.getxattr("f", "user.cloakfs_test")
    print("yes" if v == b"value-1" else "no (read back %r)" % v)
except OSError as e:
    print("no (%s)" % errno.errorcode.get(e.errno, e))' 2>&1 | tail -1
}
probe_acl() {
    pdir acl || { echo "error: mkdir"; return; }
    echo x > f
    local err; err=$(setfacl -m u:nobody:r f 2>&1) || { echo "no ($(short "$err"))"; return; }
    getfacl -c f 2>/dev/null | grep -q '^user:nobody:r--' && echo yes || echo "no (not read back)"
}
FALLOC_PY='
import ctypes, os, sys, errno
libc = ctypes.CDLL(None, use_errno=True)
libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
def falloc(fd, mode, off, ln):
    if libc.fallocate(fd, mode, off, ln) != 0:
        e = ctypes.get_errno(); raise OSError(e, os.strerror(e))
def readall(p): return open(p, "rb").read()
what = sys.argv[1]
try:
    fd = os.open("f", os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    if what == "mode0":
        falloc(fd, 0, 0, 1 << 20); os.close(fd)
        d = readall("f")
        print("yes" if len(d) == 1 << 20 and d.count(0) == len(d) else "no (size %d)" % len(d))
    elif what == "keep":
        os.write(fd, b"0123456789"); falloc(fd, 1, 0, 1 << 20); os.close(fd)
        d = readall("f")
        print("yes" if d == b"0123456789" else "no (size %d)" % len(d))
    elif what == "punch":
        os.write(fd, b"A" * 65536); os.fsync(fd)
        falloc(fd, 3, 4096, 8192); os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)
        d = readall("f")
        ok = len(d) == 65536 and d[4096:12288] == bytes(8192) and d[:4096] + d[12288:] == b"A" * (65536 - 8192)
        print("yes" if ok else "no (size %d, wrong content)" % len(d))
except OSError as e:
    print("no (%s)" % errno.errorcode.get(e.errno, e))
'
probe_falloc0() { pdir falloc0 || { echo "error: mkdir"; return; }; "$PY" -c "$FALLOC_PY" mode0 2>&1 | tail -1; }
probe_fallockeep() { pdir fallockeep || { echo "error: mkdir"; return; }; "$PY" -c "$FALLOC_PY" keep 2>&1 | tail -1; }
probe_punch() { pdir punch || { echo "error: mkdir"; return; }; "$PY" -c "$FALLOC_PY" punch 2>&1 | tail -1; }
probe_name255() {
    pdir name255 || { echo "error: mkdir"; return; }
    local n; n=$(printf 'n%.0s' {1..255})
    local err; err=$(touch "$n" 2>&1) || { echo "no ($(short "$err"))"; return; }
    ls | grep -qx "$n" && [ -f "$n" ] && echo yes || echo "no (not listed)"
}
probe_append() {
    pdir append || { echo "error: mkdir"; return; }
    : > log
    local i
    (exec 3>> log; for i in $(seq 300); do echo "A$i" >&3; done) &
    (exec 3>> log; for i in $(seq 300); do echo "B$i" >&3; done) &
    wait
    local a b t
    a=$(grep -c '^A[0-9]*$' log); b=$(grep -c '^B[0-9]*$' log); t=$(wc -l < log)
    [ "$a" = 300 ] && [ "$b" = 300 ] && [ "$t" = 600 ] && echo yes || echo "no (A $a, B $b, lines $t of 600)"
}
probe_mmap() {
    pdir mmap || { echo "error: mkdir"; return; }
    "$PY" -c '
import os, mmap, errno
try:
    fd = os.open("f", os.O_RDWR | os.O_CREAT, 0o644)
    os.write(fd, b"." * 8192)
    m = mmap.mmap(fd, 8192, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    m[5000:5010] = b"MMAPWRITE!"; m.flush(); m.close()
    os.fsync(fd); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)
    fd = os.open("f", os.O_RDONLY); d = os.read(fd, 8192); os.close(fd)
    print("yes" if d[5000:5010] == b"MMAPWRITE!" and len(d) == 8192 else "no (not read back)")
except OSError as e:
    print("no (%s)" % errno.errorcode.get(e.errno, e))' 2>&1 | tail -1
}
probe_fifo() {
    pdir fifo || { echo "error: mkdir"; return; }
    local err; err=$(mkfifo p 2>&1) || { echo "no ($(short "$err"))"; return; }
    [ -p p ] || { echo "no (not a fifo)"; return; }
    (echo through-fifo > p) &
    local got; got=$(timeout 5 cat p); wait
    [ "$got" = through-fifo ] && echo yes || echo "no (no data through it)"
}
probe_socket() {
    pdir socket || { echo "error: mkdir"; return; }
    "$PY" -c '
import socket, os, stat, errno
try:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); s.bind("s"); s.listen(1)
    c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); c.settimeout(5); c.connect("s")
    a, _ = s.accept(); c.sendall(b"hi"); ok = a.recv(2) == b"hi"
    print("yes" if ok and stat.S_ISSOCK(os.lstat("s").st_mode) else "no (not a socket)")
except OSError as e:
    print("no (%s)" % errno.errorcode.get(e.errno, e))' 2>&1 | tail -1
}
probe_mknod() {
    pdir mknod || { echo "error: mkdir"; return; }
    local err; err=$(mknod n c 1 3 2>&1) || { echo "no ($(short "$err"))"; return; }
    local t; t=$(stat -c '%F %t:%T' n)
    [ "$t" = "character special file 1:3" ] && echo yes || echo "no ($t)"
}
probe_attrs() {
    pdir attrs || { echo "error: mkdir"; return; }
    echo x > f
    local bad=() err
    err=$(chmod 0640 f 2>&1) || bad+=("chmod: $(short "$err")")
    err=$(chown 1234:5678 f 2>&1) || bad+=("chown: $(short "$err")")
    [ "$(stat -c %a f)" = 640 ] || bad+=("mode $(stat -c %a f)")
    [ "$(stat -c %u:%g f)" = 1234:5678 ] || bad+=("owner $(stat -c %u:%g f)")
    local t1="2001-02-03 04:05:06.123456789" t2="2002-03-04 05:06:07.987654321" mt at
    tm() { TZ=UTC stat -c "$1" f | cut -c1-29; }
    # both times with nanoseconds, then atime only (mtime = UTIME_OMIT), then mtime only
    err=$(touch -d "$t1 UTC" f 2>&1) || bad+=("utimens: $(short "$err")")
    mt=$(tm %y); at=$(tm %x)
    if [ "$mt" != "$t1" ] || [ "$at" != "$t1" ]; then
        [ "${mt:0:19}" = "${t1:0:19}" ] && [ "${at:0:19}" = "${t1:0:19}" ] && bad+=("ns lost") || bad+=("utimens ignored")
    fi
    touch -a -d "$t2 UTC" f; mt=$(tm %y); at=$(tm %x)
    [ "${at:0:19}" = "${t2:0:19}" ] && [ "${mt:0:19}" = "${t1:0:19}" ] || bad+=("atime-only utimens wrong")
    touch -m -d "$t1 UTC" f; touch -m -d "$t2 UTC" f; mt=$(tm %y); at=$(tm %x)
    [ "${mt:0:19}" = "${t2:0:19}" ] && [ "${at:0:19}" = "${t2:0:19}" ] || bad+=("mtime-only utimens wrong")
    if [ ${#bad[@]} -eq 0 ]; then echo yes; else echo "no ($(printf '%s; ' "${bad[@]}" | sed 's/; $//'))"; fi
}
probe_flock() {
    pdir flock || { echo "error: mkdir"; return; }
    : > f
    flock -x f sleep 3 & local h=$!
    sleep 1
    if flock -n -x f true; then echo "no (second exclusive lock granted)"; else echo yes; fi
    wait "$h"
}
probe_fcntl() {
    pdir fcntl || { echo "error: mkdir"; return; }
    : > f
    "$PY" -c '
import fcntl, os, time, errno, sys
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    fd = os.open("f", os.O_RDWR)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX); os.write(w, b"L")
    except OSError as e:
        os.write(w, b"E")
    time.sleep(3); os._exit(0)
c = os.read(r, 1)
if c != b"L": print("no (first lock failed)"); os.waitpid(pid, 0); sys.exit()
fd = os.open("f", os.O_RDWR)
try:
    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB); print("no (second exclusive lock granted)")
except OSError as e:
    print("yes" if e.errno in (errno.EAGAIN, errno.EACCES) else "no (%s)" % errno.errorcode.get(e.errno, e))
os.waitpid(pid, 0)' 2>&1 | tail -1
}
probe_odirect() {
    pdir odirect || { echo "error: mkdir"; return; }
    head -c 8192 /dev/urandom > f
    "$PY" -c '
import os, mmap, errno
want = open("f", "rb").read()
try:
    fd = os.open("f", os.O_RDONLY | os.O_DIRECT)
    buf = mmap.mmap(-1, 8192)          # page-aligned buffer
    n = os.readv(fd, [buf]); os.close(fd)
    print("yes" if n == 8192 and buf[:] == want else "no (read %d bytes, %s)" % (n, "same" if buf[:n] == want[:n] else "wrong data"))
except OSError as e:
    print("no (%s)" % errno.errorcode.get(e.errno, e))' 2>&1 | tail -1
}
probe_statfs() {
    local out; out=$(df -P -k "$M" 2>&1) || { echo "no ($(short "$out"))"; return; }
    local tot; tot=$(awk 'NR == 2 {print $2}' <<< "$out")
    [ "${tot:-0}" -gt 0 ] 2>/dev/null && echo yes || echo "no (size ${tot:-?})"
}
probe_sparse() {
    pdir sparse || { echo "error: mkdir"; return; }
    sync; local b a; b=$(du -sk "$C" | cut -f1)
    local t0=$SECONDS err
    err=$(truncate -s 1G f 2>&1) || { echo "no ($(short "$err"))"; return; }
    local dt=$((SECONDS - t0))
    sync; sleep 1; a=$(du -sk "$C" | cut -f1)
    local g=$((a - b)) sz; sz=$(stat -c %s f)
    [ "$sz" = 1073741824 ] || { echo "no (size $sz)"; return; }
    if [ $g -lt 65536 ]; then echo "yes (cipher dir +$g KiB)"
    else echo "no (cipher dir +$((g / 1024)) MiB, ${dt}s)"; fi
}

PROBES=(
    "hardlink|hard link (same inode, nlink 2)"
    "symlink|symlink + readlink"
    "dirmove|rename of a directory across dirs"
    "noreplace|renameat2 RENAME_NOREPLACE"
    "exchange|renameat2 RENAME_EXCHANGE"
    "xattr|user xattr set/get"
    "acl|POSIX ACL (setfacl/getfacl)"
    "falloc0|fallocate mode 0"
    "fallockeep|fallocate KEEP_SIZE"
    "punch|fallocate PUNCH_HOLE (zeros, size kept)"
    "name255|255-byte file name"
    "append|O_APPEND from 2 processes"
    "mmap|shared writable mmap, then read()"
    "fifo|FIFO (mkfifo)"
    "socket|unix socket (bind/connect)"
    "mknod|device node (mknod c 1 3)"
    "attrs|chmod/chown/utimens (ns) round trip"
    "flock|flock (exclusive)"
    "fcntl|fcntl lock (exclusive)"
    "odirect|O_DIRECT open+read"
    "statfs|statfs (df)"
    "sparse|sparse file (truncate -s 1G, du of cipher dir < 64 MiB)"
)
OTHER_ROWS=(
    "passwd|passphrase change w/o rewriting data (per --help)"
    "slots|multiple passphrases / key slots (per --help)"
    "t_flip|tamper: 1 flipped ciphertext byte -> read fails"
    "t_name|tamper: mutated encrypted name not listed"
    "t_move|tamper: file moved to another dir rejected"
    "t_zero|tamper: all-zero ciphertext block detected"
    "t_config|tamper: edited config -> mount refused"
)
export -f short pdir $(declare -F | awk '$3 ~ /^probe_/ {print $3}')
export RENAMEAT2_PY FALLOC_PY

declare -A R
NOTES=()
set_r() { R["$1,$2"]=$(tr '\n|' ' /' <<< "$3" | sed -E 's/ +$//' | cut -c1-60); }

run_probe() {  # FS ID
    local id=$2 tmo=$FM_PROBE_TIMEOUT out rc
    [ "$id" = sparse ] && tmo=$((3 * tmo))
    out=$(M="$M" C="$C" timeout -k 5 "$tmo" bash -c "probe_$id" 2>> "$VOL/probes.log")
    rc=$?
    out=$(tail -1 <<< "$out")
    if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then out="error: timeout ${tmo}s"
    elif [ -z "$out" ]; then out="error: no result (rc $rc)"; fi
    set_r "$1" "$id" "$out"
    say "  $id: $out"
}

# ---------------------------------------------------------------- tamper helpers
snap() {  # FILE: "type<TAB>size<TAB>path" of everything in the cipher dir
    (cd "$C" && find . -mindepth 1 \( -type f -o -type d \) -printf '%y\t%s\t%P\n' | sort -t$'\t' -k3,3) > "$1"
}
new_entries() {  # OLD NEW TYPE: lines of NEW of TYPE (f/d) whose path is not in OLD
    awk -F'\t' -v t="$3" 'NR == FNR {seen[$3] = 1; next} !($3 in seen) && $1 == t' "$1" "$2"
}
settle() {  # fsync the given paths, then give write-back caches (cryfs) time to hit the disk
    "$PY" -c '
import os, sys
for p in sys.argv[1:]:
    try:
        fd = os.open(p, os.O_RDONLY); os.fsync(fd); os.close(fd)
    except OSError: pass' "$@" 2>/dev/null
    sync; sleep "$SETTLE"
}
largest() { sort -t$'\t' -k2,2nr | head -1 | cut -f3; }   # path of the largest entry
sizeof() { sort -t$'\t' -k2,2nr | head -1 | cut -f2; }
flip_byte() { "$PY" -c '
import sys
p, off = sys.argv[1], int(sys.argv[2])
with open(p, "r+b") as f:
    f.seek(off); b = f.read(1)
    if len(b) != 1: print("n/a (backing file shorter than %d)" % (off + 1)); sys.exit()
    f.seek(off); f.write(bytes([b[0] ^ 0x01]))
print("applied")' "$@"; }
zero_range() { "$PY" -c '
import sys
p, off, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with open(p, "r+b") as f:
    f.seek(0, 2)
    if f.tell() < off + n: print("n/a (backing file too short)"); sys.exit()
    f.seek(off); f.write(bytes(n))
print("applied")' "$@"; }
mutate_name() { "$PY" -c '
import sys
n = sys.argv[1]; i = len(n) // 2
while i + 1 < len(n) and n[i] == n[i + 1]: i += 1
if i + 1 >= len(n): sys.exit(1)
print(n[:i] + n[i + 1] + n[i] + n[i + 2:])' "$1"; }
sha() { sha256sum < "$1" | cut -c1-64; }
visible() { cat -v <<< "$1" | tr '\n' ' ' | cut -c1-24; }

tamper_phase() {  # FS; mounted on entry, unmounted on return
    local fs=$1 T="$VOL/t" s
    mkdir -p "$T"
    local DA="" DB="" FLIP="" ZERO="" VICTIM="" MOVED="" S32="" S64="" S64P=""
    local ap_flip="" ap_zero="" ap_name="" ap_move=""
    say "$fs: tamper fixtures"
    # The fixtures go into the root dir: name and move probes look for new top-level entries.
    snap "$T/s0"
    mkdir "$M/dA"; settle "$M/dA" "$M"; snap "$T/s1"
    mkdir "$M/dB"; settle "$M/dB" "$M"; snap "$T/s2"
    head -c 65536 /dev/urandom > "$T/flip.plain"; cp "$T/flip.plain" "$M/flip.bin"; settle "$M/flip.bin" "$M"; snap "$T/s3"
    head -c 65536 /dev/urandom > "$T/zero.plain"; cp "$T/zero.plain" "$M/zero.bin"; settle "$M/zero.bin" "$M"; snap "$T/s4"
    head -c 32768 /dev/urandom > "$M/geo32"; settle "$M/geo32" "$M"; snap "$T/s5"
    head -c 65537 /dev/urandom > "$M/geo64p"; settle "$M/geo64p" "$M"; snap "$T/s6"
    echo "victim" > "$M/victim.txt"; settle "$M/victim.txt" "$M"; snap "$T/s7"
    head -c 5000 /dev/urandom > "$T/moved.plain"; cp "$T/moved.plain" "$M/dA/moved.txt"; settle "$M/dA/moved.txt" "$M/dA"; snap "$T/s8"
    ls -1A "$M" > "$T/list-root.before" 2>/dev/null

    # Map plaintext objects to backing objects.
    local x n
    x=$(new_entries "$T/s0" "$T/s1" d | awk -F'\t' '$3 !~ /\//'); [ "$(grep -c . <<< "$x")" = 1 ] && DA=$(cut -f3 <<< "$x")
    x=$(new_entries "$T/s1" "$T/s2" d | awk -F'\t' '$3 !~ /\//'); [ "$(grep -c . <<< "$x")" = 1 ] && DB=$(cut -f3 <<< "$x")
    x=$(new_entries "$T/s2" "$T/s3" f); FLIP=$(largest <<< "$x"); n=$(grep -c . <<< "$x")
    [ -n "$FLIP" ] && [ "$n" -gt 1 ] && NOTES+=("$fs: flip.bin maps to $n new backing files; flipped the largest")
    x=$(new_entries "$T/s3" "$T/s4" f); ZERO=$(largest <<< "$x"); S64=$(sizeof <<< "$x")
    x=$(new_entries "$T/s4" "$T/s5" f); S32=$(sizeof <<< "$x")
    x=$(new_entries "$T/s5" "$T/s6" f); S64P=$(sizeof <<< "$x")
    x=$(new_entries "$T/s6" "$T/s7" f | awk -F'\t' '$3 !~ /\//'); [ "$(grep -c . <<< "$x")" = 1 ] && VICTIM=$(cut -f3 <<< "$x")
    x=$(new_entries "$T/s7" "$T/s8" f); [ "$(grep -c . <<< "$x")" = 1 ] && MOVED=$(cut -f3 <<< "$x")
    [ -n "$MOVED" ] && [ -n "$DA" ] && [ "$(dirname "$MOVED")" != "$DA" ] && MOVED=""
    [ -n "$DA" ] && [ -n "$DB" ] && [ -n "$MOVED" ] || { DA=""; DB=""; MOVED=""; }

    # Ciphertext geometry from the sizes of 32 KiB, 64 KiB and 64 KiB+1 files:
    # per-block overhead o, plaintext block P, header H; zero plaintext block #1.
    local zoff=4096 zlen=4096 poff=-1 geo gh gp go
    geo=$(awk -v a="${S32:-0}" -v b="${S64:-0}" -v c="${S64P:-0}" 'BEGIN {
        o = c - b - 1; d = b - a - 32768
        if (o <= 0 || o > 1024 || d <= 0) exit 1
        P = o * 32768 / d; H = b - 65536 - 2 * d
        if (P != int(P) || P < 512 || P > 65536 || H < 0 || H > 65536) exit 1
        printf "%d %d %d", H, P, o }') || geo=""
    if [ -n "$geo" ]; then
        read -r gh gp go <<< "$geo"
        zoff=$((gh + gp + go)); zlen=$((gp + go)); poff=$gp
        NOTES+=("$fs: ciphertext layout measured: header $gh B, blocks of $gp B + $go B; zero-block probe zeroed backing bytes $zoff..$((zoff + zlen - 1)) (= plaintext bytes $gp..$((2 * gp - 1)))")
    else
        NOTES+=("$fs: no 1:1 ciphertext layout found; zeroed bytes 4096..8191 of the largest new backing file of zero.bin")
    fi

    say "$fs: unmount, tamper"
    do_umount
    if [ -n "$FLIP" ]; then ap_flip=$(flip_byte "$C/$FLIP" 1000); else ap_flip="n/a (no new backing file)"; fi
    if [ -n "$ZERO" ]; then ap_zero=$(zero_range "$C/$ZERO" "$zoff" "$zlen"); else ap_zero="n/a (no new backing file)"; fi
    if [ -n "$VICTIM" ]; then
        local mut; mut=$(mutate_name "$(basename "$VICTIM")")
        if [ -n "$mut" ] && mv "$C/$VICTIM" "$C/$(dirname "$VICTIM")/$mut"; then ap_name=applied
            NOTES+=("$fs: name tamper: backing name $VICTIM -> $mut")
        else ap_name="n/a (cannot mutate name)"; fi
    else ap_name="n/a (names are not backing file names)"; fi
    if [ -n "$MOVED" ]; then
        mv "$C/$MOVED" "$C/$DB/" && ap_move=applied || ap_move="error: mv failed"
    else ap_move="n/a (cipher dir does not mirror the tree)"; fi

    say "$fs: remount, check"
    if ! do_mount "$fs"; then
        for s in t_flip t_name t_move t_zero; do set_r "$fs" $s "error: remount failed"; done
        return
    fi
    local out rc
    # name tamper
    if [ "$ap_name" = applied ]; then
        out=$(timeout -k 2 20 ls -1A "$M" 2>&1); rc=$?
        if [ $rc -ne 0 ]; then set_r "$fs" t_name "yes (ls fails: $(short "$out"))"
        elif grep -qx victim.txt <<< "$out"; then set_r "$fs" t_name "n/a (victim.txt still listed)"
        else
            local extra; extra=$(grep -vxF -f "$T/list-root.before" <<< "$out")
            if [ -n "$extra" ]; then set_r "$fs" t_name "no (lists '$(visible "$extra")')"
            else set_r "$fs" t_name "yes (not listed)"; fi
        fi
    else set_r "$fs" t_name "$ap_name"; fi
    ensure_mounted "$fs"
    # Mallory move
    if [ "$ap_move" = applied ]; then
        out=$(timeout -k 2 20 ls -1A "$M/dB" 2>&1); rc=$?
        if [ $rc -ne 0 ]; then set_r "$fs" t_move "yes (ls dB fails: $(short "$out"))"
        elif [ -z "$out" ]; then set_r "$fs" t_move "yes (not listed in dB)"
        elif grep -qx moved.txt <<< "$out"; then
            if timeout -k 2 20 cat "$M/dB/moved.txt" > "$T/moved.got" 2> "$T/moved.err"; then
                if [ "$(sha "$T/moved.got")" = "$(sha "$T/moved.plain")" ]; then
                    set_r "$fs" t_move "no (listed in dB, decrypts)"
                else set_r "$fs" t_move "no (listed in dB, wrong data)"; fi
            else set_r "$fs" t_move "partly (listed in dB; read: $(short "$(cat "$T/moved.err")"))"; fi
        else set_r "$fs" t_move "no (dB lists '$(visible "$out")')"; fi
    else set_r "$fs" t_move "$ap_move"; fi
    ensure_mounted "$fs"
    # flipped byte
    if [ "$ap_flip" = applied ]; then
        if timeout -k 2 20 cat "$M/flip.bin" > "$T/flip.got" 2> "$T/flip.err"; then
            if [ "$(sha "$T/flip.got")" = "$(sha "$T/flip.plain")" ]; then
                set_r "$fs" t_flip "? (read OK, data intact)"
            else set_r "$fs" t_flip "NO (wrong data returned)"; fi
        else set_r "$fs" t_flip "yes ($(short "$(cat "$T/flip.err")"))"; fi
    else set_r "$fs" t_flip "$ap_flip"; fi
    ensure_mounted "$fs"
    # all-zero block
    if [ "$ap_zero" = applied ]; then
        out=$(timeout -k 2 20 "$PY" -c '
import sys, errno
try:
    got = open(sys.argv[1], "rb").read()
except OSError as e:
    print("yes (%s)" % errno.errorcode.get(e.errno, e)); sys.exit()
want = open(sys.argv[2], "rb").read()
p = int(sys.argv[3])
if got == want: print("? (read OK, data intact)")
elif p > 0 and len(got) == len(want) and got[p:2 * p] == bytes(p) and got[:p] + got[2 * p:] == want[:p] + want[2 * p:]:
    print("no (zeros returned silently)")
elif len(got) == len(want) and bytes(4096) in got:
    print("no (zeros returned silently)")
else: print("NO (wrong data returned)")' "$M/zero.bin" "$T/zero.plain" "$poff" 2>&1 | tail -1)
        [ -n "$out" ] || out="error: timeout/no result"
        set_r "$fs" t_zero "$out"
    else set_r "$fs" t_zero "$ap_zero"; fi
    alive || NOTES+=("$fs: daemon dead after the tamper checks")
    say "$fs: unmount"
    do_umount
}

config_phase() {  # FS; unmounted on entry and return
    local fs=$1 ap
    ap=$(config_tamper "$fs" "$C" 2>&1 | tail -1)
    case $ap in
        applied*) ;;
        *) set_r "$fs" t_config "${ap:-error: no result}"; return ;;
    esac
    say "$fs: config $ap; mounting"
    local before; before=$(wc -l < "$VOL/daemon.log")
    if do_mount "$fs"; then
        set_r "$fs" t_config "no (mounted)"
        do_umount
    else
        local why; why=$(tail -n +$((before + 2)) "$VOL/daemon.log" | grep -v '^\s*$' | tail -1)
        set_r "$fs" t_config "yes (refused: $(short "$why"))"
    fi
}

help_rows() {  # FS
    local fs=$1 h m
    h=$(help_of "$fs")
    m=$(grep -oE -- '(^|[[:space:]])-{0,2}(passwd|chpass|change-?pass(word|phrase)?)([[:space:]:,]|$)' <<< "$h" | head -1 | tr -d ' \t:,')
    if [ -n "$m" ]; then set_r "$fs" passwd "yes (help: $m)"; else set_r "$fs" passwd "no (not in --help)"; fi
    # a command or option that adds a second secret, not just the word "slot"
    m=$(grep -oiE -- '(^|[[:space:]])-{0,2}(add-?(key|pass(word|phrase)?|slot)|(key|slot|pass(word|phrase)?) add|addkey|multiple (passwords|passphrases))([[:space:]]|$)' <<< "$h" | head -1 | sed -E 's/^[[:space:]]+|[[:space:]]+$//g')
    if [ -n "$m" ]; then set_r "$fs" slots "yes (help: $m)"
    elif grep -qiE 'key ?slots?' <<< "$h"; then set_r "$fs" slots "no (help mentions slots, no add command)"
    else set_r "$fs" slots "no (not in --help)"; fi
}

# ---------------------------------------------------------------- main
COLS=()
SKIPPED=()
for fs in "${FSLIST[@]}"; do
    if ! declare -F "mount_$fs" > /dev/null; then SKIPPED+=("$fs: unknown file system"); continue; fi
    if [ "$fs" = cloakfs ]; then
        [ -x "$CLOAKFS" ] || { SKIPPED+=("cloakfs: binary $CLOAKFS not found"); say "skip cloakfs: no $CLOAKFS"; continue; }
    else
        command -v "$fs" > /dev/null || { SKIPPED+=("$fs: not installed"); continue; }
    fi
    VOL="$WORK/$fs"; C="$VOL/cipher"; M="$VOL/mnt"
    mkdir -p "$C" "$M"
    SETTLE=0.2; [ "$fs" = cryfs ] && SETTLE=2
    say "=== $fs: init"
    if ! "init_$fs" "$C" >> "$VOL/daemon.log" 2>&1; then
        SKIPPED+=("$fs: init failed: $(tail -1 "$VOL/daemon.log")"); say "$fs: init failed"; rm -rf "$VOL"; continue
    fi
    say "$fs: mount"
    if ! do_mount "$fs"; then
        SKIPPED+=("$fs: mount failed: $(grep -v '^\s*$' "$VOL/daemon.log" | tail -1 | cut -c1-120)")
        say "$fs: mount failed"; rm -rf "$VOL"; continue
    fi
    COLS+=("$fs")
    grep " $M " /proc/mounts | awk '{print $3, $4}' | sed "s/^/$fs mount: /" >&2
    for p in "${PROBES[@]}"; do
        alive || { say "$fs: mount dead before ${p%%|*}; remounting"; NOTES+=("$fs: daemon died before probe ${p%%|*}"); do_umount; do_mount "$fs" || break; }
        run_probe "$fs" "${p%%|*}"
    done
    help_rows "$fs"
    if alive || { do_umount; do_mount "$fs"; }; then
        tamper_phase "$fs"
    fi
    do_umount
    config_phase "$fs"
    do_umount
    for p in t_flip t_name t_move t_zero t_config; do say "  $p: ${R[$fs,$p]:-}"; done
    [ "${FM_KEEP:-0}" = 1 ] || rm -rf "$VOL"
done

# ---------------------------------------------------------------- report
echo "## Feature matrix (measured by tests/peers/feature-matrix.sh)"
echo
echo "Measured $(date -u +%Y-%m-%d) on Linux $(uname -r), $(findmnt -n -o FSTYPE -T "$FM_BASE" 2>/dev/null || stat -f -c %T "$FM_BASE") backing dir, as root."
echo
if [ ${#COLS[@]} -gt 0 ]; then
    printf '| Feature |'; printf ' %s |' "${COLS[@]}"; echo
    printf '|---|'; printf -- '---|%.0s' "${COLS[@]}"; echo
    for p in "${PROBES[@]}" "${OTHER_ROWS[@]}"; do
        id=${p%%|*}
        printf '| %s |' "${p#*|}"
        for fs in "${COLS[@]}"; do printf ' %s |' "${R[$fs,$id]:-error: not run}"; done
        echo
    done
fi
echo
echo "### Versions"
echo
for fs in "${FSLIST[@]}"; do
    case $fs in cloakfs) [ -x "$CLOAKFS" ] || continue ;; *) command -v "$fs" > /dev/null || continue ;; esac
    pkg=""; [ "$fs" != cloakfs ] && pkg=$(dpkg-query -W -f='${Package} ${Version}' "$fs" 2>/dev/null)
    echo "- $fs: $(version_of "$fs" | tr -s ' ' | sed -E 's/ +$//')${pkg:+ (Debian package $pkg)}"
done
echo "- fuse3: $(dpkg-query -W -f='${Version}' fuse3 2>/dev/null) ($(fusermount3 --version 2>&1 | head -1))"
echo
if [ ${#SKIPPED[@]} -gt 0 ] || [ ${#NOTES[@]} -gt 0 ]; then
    echo "### Notes"
    echo
    for n in "${SKIPPED[@]}"; do echo "- skipped $n"; done
    for n in "${NOTES[@]}"; do echo "- $n"; done
fi
exit 0
