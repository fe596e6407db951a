#!/usr/bin/env python3
"""Counts the FUSE requests a daemon received, by opcode, from an strace log of its reads.

Capture (any FUSE daemon, cloakfs or a peer), run the workload, then stop strace:

    strace -f -p DAEMON_PID -e trace=read -s 8 -x -o LOG &
    ...workload...
    kill %1
    bench/fuse-requests.py LOG

Every request starts with `struct fuse_in_header` (len: u32, opcode: u32, unique: u64, ...),
and a daemon reads each whole request with one read(2) of /dev/fuse, so the first 8 bytes that
strace shows of each read are enough. Reads of other descriptors whose bytes 4..8 do not name
an opcode are counted as "other"; requests a daemon takes with splice(2) (libfuse can) are
not seen. strace slows the daemon several times over: use it for
counts, never for timing.
"""

import codecs
import collections
import re
import sys

# Opcodes of include/uapi/linux/fuse.h.
OPCODES = {
    1: "LOOKUP", 2: "FORGET", 3: "GETATTR", 4: "SETATTR", 5: "READLINK", 6: "SYMLINK",
    8: "MKNOD", 9: "MKDIR", 10: "UNLINK", 11: "RMDIR", 12: "RENAME", 13: "LINK", 14: "OPEN",
    15: "READ", 16: "WRITE", 17: "STATFS", 18: "RELEASE", 20: "FSYNC", 21: "SETXATTR",
    22: "GETXATTR", 23: "LISTXATTR", 24: "REMOVEXATTR", 25: "FLUSH", 26: "INIT",
    27: "OPENDIR", 28: "READDIR", 29: "RELEASEDIR", 30: "FSYNCDIR", 31: "GETLK", 32: "SETLK",
    33: "SETLKW", 34: "ACCESS", 35: "CREATE", 36: "INTERRUPT", 37: "BMAP", 38: "DESTROY",
    39: "IOCTL", 40: "POLL", 41: "NOTIFY_REPLY", 42: "BATCH_FORGET", 43: "FALLOCATE",
    44: "READDIRPLUS", 45: "RENAME2", 46: "LSEEK", 47: "COPY_FILE_RANGE",
    48: "SETUPMAPPING", 49: "REMOVEMAPPING", 50: "SYNCFS", 51: "TMPFILE", 52: "STATX",
}

# A completed read's data: `read(5, "..."..., 1052672) = 80`, or with -f, the second half of
# an interrupted call: `<... read resumed>"..."..., 1052672) = 80`.
READ_DATA = re.compile(r'(?:\bread\(\d+, |read resumed>)"((?:[^"\\]|\\.)*)"')


def count(lines):
    counts = collections.Counter()
    for line in lines:
        m = READ_DATA.search(line)
        if not m:
            continue
        data = codecs.escape_decode(m.group(1))[0]
        if len(data) < 8:
            continue
        counts[OPCODES.get(int.from_bytes(data[4:8], "little"), "other")] += 1
    return counts


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: fuse-requests.py STRACE_LOG")
    try:
        with open(sys.argv[1], encoding="utf-8", errors="replace") as f:
            counts = count(f)
    except OSError as e:
        sys.exit(f"fuse-requests.py: {e}")
    for name, n in counts.most_common():
        print(f"{name:14} {n:>9}")
    print(f"{'total':14} {sum(counts.values()):>9}")


if __name__ == "__main__":
    main()
