//! Conversion of backing `stat` results into the attributes FUSE replies carry.

use fuser::{FileAttr, FileType, INodeNo, TimeOrNow};
use rustix::fs::{Stat, Timespec, Timestamps, UTIME_NOW, UTIME_OMIT};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The fields of a backing `stat`, in fixed-width types (the raw struct differs per
/// architecture).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Meta {
    pub dev: u64,
    pub ino: u64,
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u64,
    pub size: u64,
    pub blocks: u64,
    pub blksize: u32,
    pub atime: (i64, i64),
    pub mtime: (i64, i64),
    pub ctime: (i64, i64),
}

impl Meta {
    /// Copies the fields out of a raw `stat`.
    // Some of these casts are identities on one architecture and conversions on another.
    #[allow(clippy::unnecessary_cast)]
    pub(crate) fn from_stat(st: &Stat) -> Self {
        Self {
            dev: st.st_dev as u64,
            ino: st.st_ino as u64,
            mode: st.st_mode as u32,
            nlink: u32::try_from(st.st_nlink).unwrap_or(u32::MAX),
            uid: st.st_uid as u32,
            gid: st.st_gid as u32,
            rdev: st.st_rdev as u64,
            size: u64::try_from(st.st_size).unwrap_or(0),
            blocks: u64::try_from(st.st_blocks).unwrap_or(0),
            blksize: u32::try_from(st.st_blksize).unwrap_or(4096),
            atime: (st.st_atime as i64, st.st_atime_nsec as i64),
            mtime: (st.st_mtime as i64, st.st_mtime_nsec as i64),
            ctime: (st.st_ctime as i64, st.st_ctime_nsec as i64),
        }
    }

    /// The attributes of `fd`'s object (`fstat`: from the kernel's cache on a FUSE or network
    /// file system).
    pub(crate) fn of_fd<Fd: rustix::fd::AsFd>(fd: Fd) -> rustix::io::Result<Self> {
        rustix::fs::fstat(fd).map(|st| Self::from_stat(&st))
    }

    /// Copies the fields out of a `statx` that asked for the basic stats.
    pub(crate) fn from_statx(st: &rustix::fs::Statx) -> Self {
        let time = |t: rustix::fs::StatxTimestamp| (t.tv_sec, i64::from(t.tv_nsec));
        Self {
            dev: libc::makedev(st.stx_dev_major, st.stx_dev_minor),
            ino: st.stx_ino,
            mode: u32::from(st.stx_mode),
            nlink: st.stx_nlink,
            uid: st.stx_uid,
            gid: st.stx_gid,
            rdev: libc::makedev(st.stx_rdev_major, st.stx_rdev_minor),
            size: st.stx_size,
            blocks: st.stx_blocks,
            blksize: st.stx_blksize,
            atime: time(st.stx_atime),
            mtime: time(st.stx_mtime),
            ctime: time(st.stx_ctime),
        }
    }

    /// The object's type.
    pub(crate) fn kind(&self) -> Option<FileType> {
        kind_of_mode(self.mode)
    }
}

/// The FUSE file type of a `st_mode`.
pub(crate) fn kind_of_mode(mode: u32) -> Option<FileType> {
    Some(match mode & libc::S_IFMT {
        libc::S_IFREG => FileType::RegularFile,
        libc::S_IFDIR => FileType::Directory,
        libc::S_IFLNK => FileType::Symlink,
        libc::S_IFIFO => FileType::NamedPipe,
        libc::S_IFSOCK => FileType::Socket,
        libc::S_IFCHR => FileType::CharDevice,
        libc::S_IFBLK => FileType::BlockDevice,
        _ => return None,
    })
}

fn system_time((sec, nsec): (i64, i64)) -> SystemTime {
    let nsec = nsec.clamp(0, 999_999_999) as u32;
    if sec >= 0 {
        UNIX_EPOCH + Duration::new(sec as u64, nsec)
    } else {
        UNIX_EPOCH - Duration::new(sec.unsigned_abs(), 0) + Duration::new(0, nsec)
    }
}

/// The attributes of node `nodeid` whose backing object is `m` and whose plaintext size is
/// `size`.
pub(crate) fn file_attr(nodeid: u64, m: &Meta, size: u64) -> FileAttr {
    FileAttr {
        ino: INodeNo(nodeid),
        size,
        blocks: m.blocks,
        atime: system_time(m.atime),
        mtime: system_time(m.mtime),
        ctime: system_time(m.ctime),
        crtime: UNIX_EPOCH,
        kind: m.kind().unwrap_or(FileType::RegularFile),
        perm: (m.mode & 0o7777) as u16,
        nlink: m.nlink,
        uid: m.uid,
        gid: m.gid,
        // The kernel's new-style device number fits 32 bits for every device Linux creates.
        rdev: u32::try_from(m.rdev).unwrap_or(u32::MAX),
        blksize: m.blksize,
        flags: 0,
    }
}

/// The attributes of a negative lookup reply (node 0: "no such entry", cacheable).
pub(crate) fn negative_attr() -> FileAttr {
    FileAttr {
        ino: INodeNo(0),
        size: 0,
        blocks: 0,
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind: FileType::RegularFile,
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 0,
        flags: 0,
    }
}

fn timespec(t: Option<TimeOrNow>) -> Timespec {
    match t {
        None => Timespec {
            tv_sec: 0,
            tv_nsec: UTIME_OMIT,
        },
        Some(TimeOrNow::Now) => Timespec {
            tv_sec: 0,
            tv_nsec: UTIME_NOW,
        },
        Some(TimeOrNow::SpecificTime(t)) => {
            let (tv_sec, tv_nsec) = seconds_and_nanos(t);
            Timespec { tv_sec, tv_nsec }
        }
    }
}

/// `t` as seconds and nanoseconds since the epoch, the form of [`Meta`]'s times (the inverse
/// of `system_time`).
pub(crate) fn seconds_and_nanos(t: SystemTime) -> (i64, i64) {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => (d.as_secs() as i64, d.subsec_nanos().into()),
        Err(e) => {
            // Before 1970: whole seconds down, nanoseconds up.
            let d = e.duration();
            let mut sec = -(d.as_secs() as i64);
            let mut nsec = i64::from(d.subsec_nanos());
            if nsec > 0 {
                sec -= 1;
                nsec = 1_000_000_000 - nsec;
            }
            (sec, nsec)
        }
    }
}

/// The `utimensat` argument for a FUSE setattr's atime and mtime.
pub(crate) fn timestamps(atime: Option<TimeOrNow>, mtime: Option<TimeOrNow>) -> Timestamps {
    Timestamps {
        last_access: timespec(atime),
        last_modification: timespec(mtime),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_round_trip() {
        for (sec, nsec) in [(0, 0), (1_700_000_000, 123), (-5, 250_000_000)] {
            let t = system_time((sec, nsec));
            let ts = timespec(Some(TimeOrNow::SpecificTime(t)));
            assert_eq!((ts.tv_sec, ts.tv_nsec), (sec, nsec));
        }
        assert_eq!(timespec(None).tv_nsec, UTIME_OMIT);
        assert_eq!(timespec(Some(TimeOrNow::Now)).tv_nsec, UTIME_NOW);
    }

    #[test]
    fn kinds() {
        assert_eq!(
            kind_of_mode(libc::S_IFDIR | 0o755),
            Some(FileType::Directory)
        );
        assert_eq!(kind_of_mode(libc::S_IFSOCK), Some(FileType::Socket));
        assert_eq!(kind_of_mode(0), None);
    }
}
