#!/usr/bin/python3
"""A pass-through FUSE file system over a directory that fails on demand with EIO: the backing
store of tests/crash/eio.py (this machine has no device-mapper for a dm `error` target).

    failfs.py ROOT MOUNTPOINT CONTROL

While the file CONTROL holds a word, every call of that kind on the mount fails with EIO:
`fsync` (fsync and fdatasync), `write`, or `all` (both). Anything else passes through to ROOT.
Runs in the foreground until unmounted. Uses Debian's python3-fusepy.
"""

import errno
import os
import sys

from fusepy import FUSE, FuseOSError, Operations


class FailFs(Operations):
    def __init__(self, root, control):
        self.root = root
        self.control = control

    def failing(self, kind):
        try:
            with open(self.control) as f:
                word = f.read().strip()
        except FileNotFoundError:
            return False
        return word in (kind, "all")

    def p(self, path):
        return os.path.join(self.root, path.lstrip("/"))

    def access(self, path, mode):
        if not os.access(self.p(path), mode):
            raise FuseOSError(errno.EACCES)

    def chmod(self, path, mode):
        os.chmod(self.p(path), mode)

    def chown(self, path, uid, gid):
        os.lchown(self.p(path), uid, gid)

    def getattr(self, path, fh=None):
        st = os.lstat(self.p(path))
        keys = ("st_atime", "st_ctime", "st_gid", "st_mode", "st_mtime", "st_nlink", "st_size",
                "st_uid", "st_blocks", "st_ino")
        return {k: getattr(st, k) for k in keys}

    def readdir(self, path, fh):
        return [".", ".."] + os.listdir(self.p(path))

    def readlink(self, path):
        return os.readlink(self.p(path))

    def mknod(self, path, mode, dev):
        os.mknod(self.p(path), mode, dev)

    def rmdir(self, path):
        os.rmdir(self.p(path))

    def mkdir(self, path, mode):
        os.mkdir(self.p(path), mode)

    def statfs(self, path):
        st = os.statvfs(self.p(path))
        keys = ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree", "f_files",
                "f_flag", "f_frsize", "f_namemax")
        return {k: getattr(st, k) for k in keys}

    def unlink(self, path):
        os.unlink(self.p(path))

    def symlink(self, name, target):
        os.symlink(target, self.p(name))

    def rename(self, old, new):
        os.rename(self.p(old), self.p(new))

    def link(self, target, name):
        os.link(self.p(name), self.p(target))

    def utimens(self, path, times=None):
        os.utime(self.p(path), times, follow_symlinks=False)

    def open(self, path, flags):
        return os.open(self.p(path), flags)

    def create(self, path, mode, fi=None):
        return os.open(self.p(path), os.O_RDWR | os.O_CREAT, mode)

    def read(self, path, length, offset, fh):
        return os.pread(fh, length, offset)

    def write(self, path, buf, offset, fh):
        if self.failing("write"):
            raise FuseOSError(errno.EIO)
        return os.pwrite(fh, buf, offset)

    def truncate(self, path, length, fh=None):
        if fh is not None:
            os.ftruncate(fh, length)
        else:
            os.truncate(self.p(path), length)

    def flush(self, path, fh):
        return 0

    def release(self, path, fh):
        os.close(fh)

    def fsync(self, path, datasync, fh):
        if self.failing("fsync"):
            raise FuseOSError(errno.EIO)
        if datasync:
            os.fdatasync(fh)
        else:
            os.fsync(fh)

    def opendir(self, path):
        return 0

    def fsyncdir(self, path, datasync, fh):
        if self.failing("fsync"):
            raise FuseOSError(errno.EIO)


def main():
    if len(sys.argv) != 4:
        sys.exit("usage: failfs.py ROOT MOUNTPOINT CONTROL")
    root, mnt, control = sys.argv[1:]
    FUSE(FailFs(os.path.realpath(root), control), mnt, foreground=True, nothreads=True,
         allow_other=True, default_permissions=True)


if __name__ == "__main__":
    main()
