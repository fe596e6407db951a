#!/usr/bin/env python3
"""EIO from the backing store, on a real mount: a cloakfs volume whose cipher directory is on
failfs.py (a pass-through FUSE file system that fails writes or fsyncs with EIO on demand).

1. A backing write that fails is refused by write(2) itself; nothing is acknowledged.
2. A backing fsync that fails is reported by every fsync of every handle open at the time and
   by the close of each that may have written, also once the backing store works again (the
   data may be gone); a handle opened afterwards starts clean.
3. A new directory whose ID cannot be made durable fails every rename and link (each retries
   the sync, writing the ID again) until a retry succeeds; then they work, and the ID is intact.

Prints `eio: N passed, N failed`; exits 1 on a failure. Needs root and python3-fusepy.
"""

import errno
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BIN = os.environ.get("CLOAKFS_BIN", os.path.join(ROOT, "target/release/cloakfs"))


def mounted(path):
    path = os.path.realpath(path)
    with open("/proc/self/mountinfo") as f:
        return any(line.split(" ")[4] == path for line in f)


def err(fn, *a):
    """The errno `fn(*a)` fails with, or 0."""
    try:
        fn(*a)
        return 0
    except OSError as e:
        return e.errno


def main():
    if os.geteuid() != 0:
        print("eio.py: needs root", file=sys.stderr)
        return 1
    tmp = tempfile.mkdtemp(prefix="reliab-eio-", dir="/var/tmp")
    back, lower, mnt = (os.path.join(tmp, d) for d in ("back", "lower", "mnt"))
    for d in (back, lower, mnt):
        os.mkdir(d)
    control = os.path.join(tmp, "fail")
    arm = lambda word: open(control, "w").write(word)  # noqa: E731
    disarm = lambda: os.path.exists(control) and os.unlink(control)  # noqa: E731
    pw = os.path.join(tmp, "pw")
    open(pw, "w").write("eio\n")
    failfs = subprocess.Popen(["/usr/bin/python3", os.path.join(HERE, "failfs.py"), back, lower,
                               control], stderr=subprocess.DEVNULL)
    daemon = None
    results = []

    def check(name, ok, detail=""):
        results.append(ok)
        print(f"eio: {'ok' if ok else 'FAIL'}: {name}{': ' + detail if detail else ''}", flush=True)

    try:
        for _ in range(600):  # the FUSE handshake of the backing: wait on its state, bounded
            if mounted(lower) or failfs.poll() is not None:
                break
            time.sleep(0.05)
        if not mounted(lower):
            raise RuntimeError("failfs did not mount (is python3-fusepy installed?)")
        cipher = os.path.join(lower, "cipher")
        subprocess.run([BIN, "init", "--passfile", pw, "--kdf-memory", "64", "--kdf-iterations",
                        "1", cipher], check=True, stdout=subprocess.DEVNULL)
        daemon = subprocess.Popen([BIN, "mount", "-f", "--passfile", pw, cipher, mnt],
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        if b"ready" not in daemon.stdout.readline():
            raise RuntimeError("cloakfs did not mount")

        # 1. write(2) refused.
        fd = os.open(os.path.join(mnt, "a"), os.O_WRONLY | os.O_CREAT, 0o644)
        os.write(fd, b"x" * 10000)
        arm("write")
        e = err(os.write, fd, b"y" * 5000)
        disarm()
        check("a failed backing write fails write(2)", e == errno.EIO, f"errno {e}")
        os.write(fd, b"z" * 10)
        check("and the file stays usable", err(os.fsync, fd) == 0 and err(os.close, fd) == 0)
        with open(os.path.join(mnt, "a"), "rb") as f:
            data = f.read()
        check("with what write(2) acknowledged", data == b"x" * 10000 + b"z" * 10, f"{len(data)}")

        # 2. A failed fsync, reported until handled.
        path = os.path.join(mnt, "b")
        w = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        w2 = os.open(path, os.O_WRONLY)
        r = os.open(path, os.O_RDONLY)
        os.write(w, b"data" * 1000)
        arm("fsync")
        first = err(os.fsync, w)
        disarm()
        later = [err(os.fsync, w), err(os.fsync, w), err(os.fdatasync, w2), err(os.fsync, r)]
        check("a failed backing fsync fails fsync", first == errno.EIO, f"errno {first}")
        check("and every later fsync of every handle open then, the store working again",
              later == [errno.EIO] * 4, str(later))
        fresh = os.open(path, os.O_RDWR)
        check("a handle opened afterwards starts clean", err(os.fsync, fresh) == 0)
        closes = [err(os.close, w2), err(os.close, w), err(os.close, r)]
        check("close of each handle that may have written reports it", closes[:2] == [errno.EIO] * 2
              and closes[2] == 0, str(closes))
        check("handled once they are closed", err(os.fsync, fresh) == 0 and err(os.close, fresh) == 0)

        # 3. A new directory's ID that cannot be made durable.
        with open(os.path.join(mnt, "old"), "wb") as f:
            f.write(b"older data")
        arm("fsync")
        os.mkdir(os.path.join(mnt, "d"))  # replies at once; the sync thread's fsync fails
        tries = [err(os.rename, os.path.join(mnt, "old"), os.path.join(mnt, "d", "old")),
                 err(os.link, os.path.join(mnt, "old"), os.path.join(mnt, "d", "l")),
                 err(os.rename, os.path.join(mnt, "old"), os.path.join(mnt, "d", "old"))]
        check("rename and link into a directory whose ID is not durable fail, every time",
              tries == [errno.EIO] * 3, str(tries))
        disarm()
        ok = err(os.rename, os.path.join(mnt, "old"), os.path.join(mnt, "d", "old"))
        check("a retry that succeeds handles it", ok == 0, f"errno {ok}")
        daemon_ok = daemon.poll() is None
        subprocess.run([BIN, "unmount", mnt], check=True)
        daemon.wait()
        daemon = None
        ids = [os.path.getsize(os.path.join(dp, "cloakfs.dirid"))
               for dp, dn, fn in os.walk(cipher) if "cloakfs.dirid" in fn]
        check("the directory's ID is intact", daemon_ok and ids == [16], str(ids))
        fsck = subprocess.run([BIN, "fsck", "--passfile", pw, cipher], capture_output=True,
                              text=True)
        check("fsck clean", fsck.returncode == 0, (fsck.stdout + fsck.stderr).strip()[-300:])
    except Exception as e:  # noqa: BLE001 - a failure of the test, reported as one
        check("setup", False, repr(e))
    finally:
        if daemon is not None:
            daemon.kill()
            daemon.wait()
        for m in (mnt, lower):
            if mounted(m):
                subprocess.run(["fusermount", "-u", "-z", m], stderr=subprocess.DEVNULL)
                if mounted(m):
                    subprocess.run(["umount", "-l", m])
        failfs.wait(timeout=30)
        subprocess.run(["rm", "-rf", tmp])
    passed = sum(results)
    print(f"eio: {passed} passed, {len(results) - passed} failed")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
