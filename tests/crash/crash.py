#!/usr/bin/env python3
"""Crash tests: what was fsynced before a crash survives it, and fsck stays clean.

Two kinds of crash, each many times, at moments chosen by the workload's progress (a count of
completed operations drawn at random per run), never by sleeping:

- kill: `kill -9` of the mount daemon while the workload runs; the dead mount is detached, the
  volume mounted again. Everything the backing file system had accepted survives (the page
  cache of the backing file system is not lost), so this tests the daemon's own ordering.
- power: the cipher directory lives on an ext4 in a loop-device image. At the chosen moment
  the ext4 is shut down without flushing its journal (EXT4_IOC_SHUTDOWN with
  EXT4_GOING_FLAGS_NOLOGFLUSH, what xfstests' `godown` does): from then on nothing more reaches
  the image, which holds exactly what had reached the device. Then the daemon is killed, the
  image copied, `fsck.ext4 -y` run on the copy and the copy mounted: a power cut.

Workloads (each run picks one, in turn):
- fsstress: threads create, write, overwrite, truncate, rename, link, symlink and remove files
  in a small tree, fsyncing at random;
- dirstorm: threads make directories with files in them and rename directories across parents
  (the directory-ID sync thread and the rename paths);
- stream: one large file written sequentially, fsynced every few MiB, while other threads make
  directories.

The promise checked after every crash:
1. every file whose content and name were made durable (fsync of the file, then of its
   directory, after its last change) has that content under that name;
2. every directory made durable (fsync of it and of its parent after its last rename) exists
   and keeps the files made durable in it;
3. a streamed file is at least as long as at its last fsync, and its bytes up to there are
   right;
4. `cloakfs fsck` is clean, or `cloakfs fsck --repair` makes it clean (exit 7) and 1-3 still
   hold afterwards; except that what was not durable may stay damaged (a block being written
   at the crash, torn between old and new bytes, fails authentication; a directory made a
   moment before, whose ID had not reached the disk while an entry in it had): such problems
   are counted and reported, and fail the run if they touch anything durable.

Usage: crash.py [--runs N] [--power-runs N] [--seed S] [--bin PATH]. Needs root (FUSE, loop
devices). Prints one line per run and a closing `N passed, N failed` line; exits 1 on any
failure.
"""

import argparse
import contextlib
import json
import fcntl
import hashlib
import os
import random
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KDF = ["--kdf-memory", "64", "--kdf-iterations", "1"]
# _IOR('X', 125, __u32): EXT4_IOC_SHUTDOWN; flag 2: EXT4_GOING_FLAGS_NOLOGFLUSH.
EXT4_IOC_SHUTDOWN = (2 << 30) | (4 << 16) | (ord("X") << 8) | 125
EXT4_GOING_FLAGS_NOLOGFLUSH = 2


def run(cmd, check=True, **kw):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))}: exit {p.returncode}: {p.stderr.strip()}")
    return p


def is_mounted(path):
    path = os.path.realpath(path)
    with open("/proc/self/mountinfo") as f:
        return any(line.split(" ")[4] == path for line in f)


def content(seed, length):
    """Deterministic bytes for (seed, length): a file's expected content is two numbers."""
    out = bytearray()
    block = hashlib.sha256(str(seed).encode()).digest() * 128  # 4 KiB
    while len(out) < length:
        out += block
    return bytes(out[:length])


def stream_bytes(off, length):
    """The streamed file's content: byte i is a function of i, so any prefix can be checked."""
    pattern = bytes((i * 131 + (i >> 12)) & 0xFF for i in range(1 << 16))
    out = bytearray()
    pos = off
    while len(out) < length:
        s = pos % len(pattern)
        take = min(len(pattern) - s, length - len(out))
        out += pattern[s : s + take]
        pos += take
    return bytes(out)


def fsync_path(path, directory=False):
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Journal:
    """What the workload made durable, as seen by the workload (outside the mount)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.files = {}  # relative path -> (seed, length)
        self.dirs = set()  # relative paths
        self.stream = None  # (relative path, durable length)
        self.ops = 0
        self.crashing = False
        self.progress = threading.Condition(self.lock)

    def tick(self):
        with self.lock:
            self.ops += 1
            self.progress.notify_all()

    @contextlib.contextmanager
    def durable(self):
        """Records what an fsync that returned made durable, under the lock, unless the crash
        has begun: a simulated power cut shuts the backing file system down under an fsync in
        progress, which may then return 0 for a commit that never reached the disk (a real
        power cut would have ended the caller too). Raises Crashing instead."""
        with self.lock:
            if self.crashing:
                raise Crashing()
            yield

    def crash(self):
        """Marks the crash: from now on nothing more is recorded as durable."""
        with self.lock:
            self.crashing = True


class Crashing(Exception):
    """The crash began before what was just made durable could be recorded."""


class Workload:
    """Threads doing file-system operations in `mnt` until the daemon dies."""

    def __init__(self, kind, mnt, journal, seed, threads=3):
        self.kind, self.mnt, self.j = kind, mnt, journal
        self.rng = random.Random(seed)
        self.threads = []
        self.errors = []
        self.stop = threading.Event()
        self.crashing = threading.Event()
        self.nthreads = threads

    def p(self, rel):
        return os.path.join(self.mnt, rel)

    def start(self):
        for t in range(self.nthreads):
            target = self.stream_worker if (self.kind == "stream" and t == 0) else self.worker
            th = threading.Thread(target=self.guard, args=(target, t, self.rng.random()))
            th.start()
            self.threads.append(th)

    def guard(self, target, t, seed):
        try:
            target(t, random.Random(seed))
        except Crashing:
            pass
        except OSError as e:
            # Once the crash has begun anything may fail (ENOTCONN from the dead daemon, EIO or
            # EROFS from the shut-down backing file system); before it, nothing may.
            if not self.crashing.is_set():
                self.errors.append(f"thread {t}: {e!r}")
        except Exception:  # noqa: BLE001 - reported as a failure of the run
            self.errors.append(traceback.format_exc())

    def join(self):
        self.stop.set()
        for th in self.threads:
            th.join()

    # --- workloads --------------------------------------------------------------------------

    def worker(self, t, rng):
        if self.kind == "fsstress":
            self.fsstress(t, rng)
        else:
            self.dirstorm(t, rng)

    def fsstress(self, t, rng):
        """Random operations on files of this thread's own directory; some files are sealed
        (made durable, then never touched again) and go to the journal."""
        base = f"t{t}"
        os.mkdir(self.p(base))
        fsync_path(self.p(base), True)
        fsync_path(self.mnt, True)
        with self.j.durable():
            self.j.dirs.add(base)
        live = {}  # name -> (seed, length): files still changed, their content as written
        n = 0
        while not self.stop.is_set():
            n += 1
            op = rng.random()
            name = f"f{rng.randrange(40)}"
            path = self.p(f"{base}/{name}")
            if op < 0.30 or name not in live:
                seed, length = rng.randrange(1 << 30), rng.choice([0, 1, 100, 4095, 4096, 5000, 70000, 300000])
                with open(path, "wb") as f:
                    f.write(content(seed, length))
                live[name] = (seed, length)
            elif op < 0.45:
                seed, length = live[name]
                new = rng.randrange(0, length + 9000)
                os.truncate(path, new)
                data = content(seed, length)[:new] + bytes(max(0, new - length))
                live[name] = self.rewrite(path, data, rng)
            elif op < 0.60:
                other = f"g{rng.randrange(40)}"
                os.rename(path, self.p(f"{base}/{other}"))
                live[other] = live.pop(name)
            elif op < 0.68:
                os.unlink(path)
                del live[name]
            elif op < 0.74:
                link = self.p(f"{base}/l{rng.randrange(10)}")
                try:
                    os.unlink(link)
                except FileNotFoundError:
                    pass
                os.link(path, link) if rng.random() < 0.5 else os.symlink(name, link)
            else:
                # Seal: fsync the file and its directory, record, and never touch it again.
                sealed = f"s{n}"
                os.rename(path, self.p(f"{base}/{sealed}"))
                seed_len = live.pop(name)
                fsync_path(self.p(f"{base}/{sealed}"))
                fsync_path(self.p(base), True)
                with self.j.durable():
                    self.j.files[f"{base}/{sealed}"] = seed_len
            self.j.tick()

    def rewrite(self, path, data, rng):
        """Writes `data` over `path` in a few pieces at random offsets; returns a (seed, length)
        describing it by registering the bytes under a fresh seed."""
        seed = rng.randrange(1 << 30)
        want = content(seed, len(data))
        with open(path, "r+b") as f:
            cuts = sorted({0, len(want)} | {rng.randrange(len(want) + 1) for _ in range(3)})
            for a, b in zip(cuts, cuts[1:]):
                f.seek(a)
                f.write(want[a:b])
            f.truncate(len(want))
        return seed, len(want)

    def dirstorm(self, t, rng):
        """Directories with files made durable in them, renamed across parents; durable
        renames move the journal's entries with them."""
        parents = [f"p{t}a", f"p{t}b", f"p{t}c"]
        for p in parents:
            os.mkdir(self.p(p))
            fsync_path(self.p(p), True)
        fsync_path(self.mnt, True)
        with self.j.durable():
            self.j.dirs.update(parents)
        mine = []  # directories of this thread (relative paths), all durable
        n = 0
        while not self.stop.is_set():
            n += 1
            if not mine or rng.random() < 0.55:
                parent = rng.choice(parents)
                d = f"{parent}/d{n}"
                os.mkdir(self.p(d))
                files = {}
                for i in range(rng.randrange(1, 4)):
                    seed, length = rng.randrange(1 << 30), rng.choice([0, 10, 4096, 9000])
                    with open(self.p(f"{d}/x{i}"), "wb") as f:
                        f.write(content(seed, length))
                        f.flush()
                        os.fsync(f.fileno())
                    files[f"{d}/x{i}"] = (seed, length)
                fsync_path(self.p(d), True)
                fsync_path(self.p(parent), True)
                with self.j.durable():
                    self.j.dirs.add(d)
                    self.j.files.update(files)
                mine.append(d)
            else:
                old = mine.pop(rng.randrange(len(mine)))
                old_parent = old.split("/")[0]
                new_parent = rng.choice(parents)
                new = f"{new_parent}/r{n}"
                with self.j.lock:
                    # Not durable until both parents are synced: out of the journal meanwhile
                    # (either place may survive).
                    moved = {k: v for k, v in self.j.files.items() if k.startswith(old + "/")}
                    for k in moved:
                        del self.j.files[k]
                    self.j.dirs.discard(old)
                os.rename(self.p(old), self.p(new))
                fsync_path(self.p(new_parent), True)
                if new_parent != old_parent:
                    fsync_path(self.p(old_parent), True)
                with self.j.durable():
                    self.j.dirs.add(new)
                    for k, v in moved.items():
                        self.j.files[new + k[len(old) :]] = v
                mine.append(new)
            self.j.tick()

    def stream_worker(self, t, rng):
        """One file written sequentially in 256 KiB pieces, fsynced every 1-4 MiB."""
        rel = "stream"
        fd = os.open(self.p(rel), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.fsync(fd)
            fsync_path(self.mnt, True)
            with self.j.durable():
                self.j.stream = (rel, 0)
            off = 0
            next_sync = rng.randrange(1, 5) << 20
            piece = 256 << 10
            while not self.stop.is_set():
                os.write(fd, stream_bytes(off, piece))
                off += piece
                if off >= next_sync:
                    os.fsync(fd)
                    with self.j.durable():
                        self.j.stream = (rel, off)
                    next_sync = off + (rng.randrange(1, 5) << 20)
                self.j.tick()
        finally:
            os.close(fd)


class Volume:
    """A cloakfs volume in `cipher`, mounted in the foreground at `mnt` (so the daemon's pid
    is the child's)."""

    def __init__(self, binary, cipher, mnt, passfile):
        self.bin, self.cipher, self.mnt, self.passfile = binary, cipher, mnt, passfile
        self.proc = None

    def init(self):
        run([self.bin, "init", "--passfile", self.passfile, *KDF, self.cipher])

    def mount(self):
        self.proc = subprocess.Popen(
            [self.bin, "mount", "-f", "--passfile", self.passfile, self.cipher, self.mnt],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        line = self.proc.stdout.readline()
        if b"ready" not in line:
            raise RuntimeError(f"mount did not come up: {line!r}")

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.detach()

    def detach(self):
        if is_mounted(self.mnt):
            run(["fusermount3", "-u", "-z", self.mnt], check=False)

    def unmount(self):
        run([self.bin, "unmount", self.mnt])
        self.proc.wait()

    def fsck(self, repair=False, json_out=False):
        cmd = [self.bin, "fsck", "--passfile", self.passfile, self.cipher]
        if repair:
            cmd.insert(2, "--repair")
        if json_out:
            cmd.insert(2, "--json")
        return run(cmd, check=False)


def verify(mnt, j):
    """Checks the promise against the journal; returns a list of problems."""
    bad = []
    for d in sorted(j.dirs):
        if not os.path.isdir(os.path.join(mnt, d)):
            bad.append(f"durable directory {d} is missing")
    for rel, (seed, length) in sorted(j.files.items()):
        path = os.path.join(mnt, rel)
        try:
            with open(path, "rb") as f:
                got = f.read()
        except OSError as e:
            bad.append(f"durable file {rel}: {e}")
            continue
        if got != content(seed, length):
            bad.append(f"durable file {rel}: {len(got)} bytes, not the {length} written")
    if j.stream:
        rel, durable = j.stream
        try:
            # Only the fsynced prefix is promised: the block being appended at the crash may
            # be torn, and reading it fails.
            path = os.path.join(mnt, rel)
            with open(path, "rb") as f:
                got = f.read(durable)
            if os.path.getsize(path) < durable:
                got = b""
        except OSError as e:
            bad.append(f"stream: {e}")
        else:
            if len(got) < durable:
                bad.append(f"stream: {len(got)} bytes, {durable} were fsynced")
            elif got[:durable] != stream_bytes(0, durable):
                bad.append("stream: fsynced bytes differ")
    return bad


def in_durable_data(j, p):
    """Whether fsck problem `p` (from --json) touches what was made durable: a durable file or
    directory, an entry of a durable directory whose name does not decrypt, or a block of the
    streamed file inside its fsynced prefix."""
    plain = (p["plain"] or "").strip("/")
    where = (p["plain_dir"] or "").strip("/")
    if j.stream and plain == j.stream[0]:
        blocks = [int(b) for b in re.findall(r"block (\d+)", p["detail"])]
        cut = re.search(r"backing file length (\d+)", p["detail"])
        if not blocks and p["kind"] == "truncated" and cut:
            # The block cut short is the last one (a write the kill interrupted); its index is
            # at least this, a header being under 4096 bytes and a block's overhead under 104.
            blocks = [max(0, (int(cut.group(1)) - 4096) // 4200)]
        return not blocks or min(blocks) < j.stream[1] // 4096
    if plain:
        return plain in j.files or plain in j.dirs
    return where in j.dirs or where == ""


def check_fsck(vol, j):
    """fsck clean, or made clean by --repair without losing anything durable. What --repair
    cannot fix may only concern what was not durable: blocks of a file being written at the
    crash (torn: half old, half new, so they fail authentication), a directory made a moment
    before with its ID not yet on disk; those are counted, never accepted in durable entries."""
    r = vol.fsck()
    if r.returncode == 0:
        return [], "fsck clean"
    first = (r.stdout + r.stderr).strip().splitlines()
    rr = vol.fsck(repair=True)
    if rr.returncode not in (0, 6, 7):
        return [f"fsck --repair failed (exit {rr.returncode}): {rr.stderr[-2000:]}"], ""
    again = vol.fsck(json_out=True)
    left = json.loads(again.stdout)["problems"] if again.stdout.strip() else []
    bad = [f"left by --repair in durable data: {p['kind']} {p['plain'] or p['plain_dir']}: "
           f"{p['detail']}" for p in left if in_durable_data(j, p)]
    vol.mount()
    try:
        bad += [f"after --repair: {b}" for b in verify(vol.mnt, j)]
    finally:
        vol.unmount()
    note = f"fsck repaired: {first[0] if first else '?'}"
    if left:
        kinds = sorted({p["kind"] for p in left})
        note += f"; {len(left)} left in data that was not durable ({', '.join(kinds)})"
        j.not_durable_problems = len(left)
    return bad, note


def one_run(args, n, kind, crash, work):
    seed = args.seed * 1000 + n
    rng = random.Random(seed)
    tmp = tempfile.mkdtemp(prefix="reliab-crash-", dir=work)
    pw = os.path.join(tmp, "pass")
    with open(pw, "w") as f:
        f.write("crash test passphrase\n")
    mnt = os.path.join(tmp, "mnt")
    os.mkdir(mnt)
    img = os.path.join(tmp, "ext4.img")
    disk = os.path.join(tmp, "disk")
    copy = os.path.join(tmp, "copy.img")
    loop_mounted = []
    try:
        if crash == "power":
            os.mkdir(disk)
            with open(img, "wb") as f:
                f.truncate(256 << 20)
            run(["mkfs.ext4", "-q", "-F", img])
            run(["mount", "-o", "loop", img, disk])
            loop_mounted.append(disk)
            cipher = os.path.join(disk, "cipher")
        else:
            cipher = os.path.join(tmp, "cipher")
        vol = Volume(args.bin, cipher, mnt, pw)
        vol.init()
        vol.mount()
        j = Journal()
        w = Workload(kind, mnt, j, seed)
        # The crash comes after this many completed operations.
        at = {"fsstress": rng.randrange(20, 400), "dirstorm": rng.randrange(10, 150),
              "stream": rng.randrange(8, 120)}[kind]
        w.start()
        with j.lock:
            while j.ops < at and any(t.is_alive() for t in w.threads):
                j.progress.wait(timeout=30)
        w.crashing.set()
        j.crash()
        if crash == "power":
            fd = os.open(disk, os.O_RDONLY | os.O_DIRECTORY)
            try:
                fcntl.ioctl(fd, EXT4_IOC_SHUTDOWN, struct.pack("I", EXT4_GOING_FLAGS_NOLOGFLUSH))
            finally:
                os.close(fd)
        vol.kill()
        w.join()
        if w.errors:
            return False, f"workload failed before the crash: {w.errors[0]}"
        if crash == "power":
            # The image as the device held it; the shut-down file system goes away unflushed.
            shutil.copyfile(img, copy)
            run(["umount", disk])
            loop_mounted.pop()
            fsck = run(["fsck.ext4", "-y", "-f", copy], check=False)
            if fsck.returncode not in (0, 1):
                return False, f"fsck.ext4 -y on the copy: exit {fsck.returncode}"
            run(["mount", "-o", "loop", copy, disk])
            loop_mounted.append(disk)
        vol.mount()
        try:
            bad = verify(mnt, j)
        finally:
            vol.unmount()
        fbad, note = check_fsck(vol, j)
        bad += fbad
        summary = (f"{kind}/{crash} at op {at} ({j.ops} done): {len(j.files)} durable files, "
                   f"{len(j.dirs)} dirs" + (f", stream {j.stream[1] >> 20} MiB" if j.stream else "")
                   + (f"; {note}" if note else ""))
        if bad:
            return False, summary + "\n    " + "\n    ".join(bad[:10])
        return True, summary
    finally:
        for m in [mnt] + loop_mounted[::-1]:
            if is_mounted(m):
                run(["umount", "-l", m], check=False)
        if args.keep:
            print(f"crash.py: kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=9, help="kill -9 runs (default 9)")
    ap.add_argument("--power-runs", type=int, default=6, help="power-loss runs (default 6)")
    ap.add_argument("--seed", type=int, default=int.from_bytes(os.urandom(2), "little"))
    ap.add_argument("--bin", default=os.path.join(ROOT, "target/release/cloakfs"))
    ap.add_argument("--work", default="/var/tmp", help="where the volumes and images go")
    ap.add_argument("--keep", action="store_true", help="keep each run's directory (debugging)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("crash.py: needs root (FUSE mounts, loop devices)", file=sys.stderr)
        return 1
    print(f"crash.py: seed {args.seed} (repeat with --seed {args.seed})")
    kinds = ["fsstress", "dirstorm", "stream"]
    plan = [("kill", kinds[i % 3]) for i in range(args.runs)]
    plan += [("power", kinds[i % 3]) for i in range(args.power_runs)]
    passed = failed = 0
    for n, (crash, kind) in enumerate(plan):
        try:
            ok, msg = one_run(args, n, kind, crash, args.work)
        except Exception as e:  # noqa: BLE001 - one failed run, the others still run
            ok, msg = False, f"{kind}/{crash}: {e}"
        print(f"crash.py: run {n + 1}/{len(plan)}: {'ok' if ok else 'FAIL'}: {msg}", flush=True)
        passed += ok
        failed += not ok
    print(f"crash: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
