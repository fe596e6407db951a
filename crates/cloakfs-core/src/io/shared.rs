//! Coordination of several machines that serve one cipher directory on a shared store
//! (GlusterFS, NFS, sshfs): the one seam through which [`crate::io::file::ContentFile`] keeps
//! its read-modify-write of blocks and its cached size and header true when other clients
//! write the same backing files.
//!
//! [`Sharing::Alone`] (the default) does nothing: this mount is the only writer. Under
//! [`Sharing::Shared`] every change to a file's contents runs under an exclusive lock on the
//! backing file's *coordination byte* ([`COORDINATION_BYTE`], FORMAT.md 19), taken with an
//! open-file-description lock, which GlusterFS and NFS pass on to every client; when it is
//! taken the size and the header are read again and the backing file's page cache is dropped,
//! so a block is re-read from the store before it is changed. It is kept across a burst of
//! changes ([`crate::io::lease`]). Applications' own byte-range locks use the plaintext
//! offsets below that byte (see [`app_lock_range`]), so they never meet cloakfs's.

use crate::error::Result;
use rustix::fd::AsFd;
use rustix::fs::{AtFlags, StatxFlags};
use std::fs::File;
use std::os::unix::io::AsRawFd;

/// The backing file offset of the byte that cloakfs clients lock to change a file's contents:
/// the last byte a 64-bit signed offset reaches, beyond any plaintext or backing offset.
pub const COORDINATION_BYTE: u64 = i64::MAX as u64 - 1;
/// The byte before it, which a client waiting for the coordination byte holds a shared lock
/// on while it waits: a client that has kept the coordination byte long sees it and makes
/// way (see [`crate::io::lease`]).
pub const WAITING_BYTE: u64 = COORDINATION_BYTE - 1;

/// Whether other machines may change the backing files behind this mount's back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Sharing {
    /// This mount is the only writer of its cipher directory.
    #[default]
    Alone,
    /// Several clients mount the cipher directory from one shared store.
    Shared,
    /// [`Sharing::Shared`] on a store whose locks do not reach the other clients (sshfs:
    /// SFTP has none), so that another client may write a file while this one changes it:
    /// after a write, blocks such a race can leave failing authentication are mended
    /// (see [`crate::io::file::ContentFile::write_at`]).
    Unlocked,
}

impl Sharing {
    /// Whether the backing files may change behind this mount's back.
    pub fn is_shared(&self) -> bool {
        matches!(self, Sharing::Shared | Sharing::Unlocked)
    }

    /// Whether other clients may write a file while this mount holds its lock.
    pub fn unlocked(&self) -> bool {
        *self == Sharing::Unlocked
    }

    /// The length and allocated 512-byte units of `file`, fetched from the store when shared.
    pub fn fresh_size(&self, file: &File) -> Result<(u64, u64)> {
        if self.is_shared() {
            let st = force_stat(file).map_err(std::io::Error::from)?;
            Ok((st.stx_size, st.stx_blocks))
        } else {
            let meta = file.metadata()?;
            Ok((meta.len(), std::os::unix::fs::MetadataExt::blocks(&meta)))
        }
    }

    /// Drops what the kernel cached of `file`'s contents, so the next reads go to the store.
    /// Nothing to do when alone.
    pub fn forget_cached(&self, file: &File) {
        if self.is_shared() {
            drop_page_cache(file);
        }
    }
}

/// What a backing file's attributes say of its contents: two equal stamps, taken from the
/// store, mean no client changed the file between them (as NFS clients decide whether their
/// cached pages are still good), provided the store keeps times finer than a second.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChangeStamp {
    size: u64,
    mtime: (i64, u32),
    ctime: (i64, u32),
}

impl ChangeStamp {
    /// The stamp of attributes `st`.
    pub fn of(st: &rustix::fs::Statx) -> Self {
        Self {
            size: st.stx_size,
            mtime: (st.stx_mtime.tv_sec, st.stx_mtime.tv_nsec),
            ctime: (st.stx_ctime.tv_sec, st.stx_ctime.tv_nsec),
        }
    }

    /// Whether the store keeps times finer than a second (sshfs's SFTP does not: two changes
    /// within one second could leave the same stamp).
    pub fn fine_grained(&self) -> bool {
        self.mtime.1 != 0 || self.ctime.1 != 0
    }
}

/// The attributes of `fd`'s file as the store has them now: a FUSE or network file system
/// otherwise answers from its attribute cache, past other clients' changes. Fails (ESTALE)
/// if the file is no longer on the store.
pub fn force_stat<Fd: AsFd>(fd: Fd) -> rustix::io::Result<rustix::fs::Statx> {
    rustix::fs::statx(
        fd,
        "",
        AtFlags::EMPTY_PATH | AtFlags::STATX_FORCE_SYNC,
        StatxFlags::BASIC_STATS,
    )
}

/// Takes OFD lock `kind` on `[start, start + len)` of `file`, trying again until it is
/// granted. Not a blocking request: on a replicated GlusterFS volume, a client's blocked lock request made
/// the holder's fdatasync wait for it (a deadlock, seen in the tests), so the wait is here,
/// from 1 ms doubling to at most 32 ms between tries.
pub fn wait_for_lock(file: &File, kind: i32, start: u64, len: u64) -> std::io::Result<()> {
    let mut pause = std::time::Duration::from_millis(1);
    loop {
        match ofd_lock(file, kind, start, len, false) {
            Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EACCES)) => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(std::time::Duration::from_millis(32));
            }
            r => return r,
        }
    }
}

/// The backing-file range `[start, end)` that stands for an application's lock on plaintext
/// bytes `[start, end]` (`end` inclusive, `u64::MAX` or beyond cloakfs's own bytes for "to
/// the end of the file"): the same offsets, cut short of the waiting and coordination bytes.
/// `None` if the range starts at or beyond them.
pub fn app_lock_range(start: u64, end_inclusive: u64) -> Option<(u64, u64)> {
    if start >= WAITING_BYTE {
        return None;
    }
    let end = end_inclusive.saturating_add(1).min(WAITING_BYTE);
    (end > start).then_some((start, end))
}

/// Takes (`kind` F_RDLCK/F_WRLCK) or releases (F_UNLCK) an open-file-description lock on
/// `[start, start + len)` of `file`; `wait` blocks until it is granted, else a conflict is
/// `EAGAIN`.
pub fn ofd_lock(file: &File, kind: i32, start: u64, len: u64, wait: bool) -> std::io::Result<()> {
    let mut fl = flock_of(kind, start, len);
    let cmd = if wait {
        libc::F_OFD_SETLKW
    } else {
        libc::F_OFD_SETLK
    };
    loop {
        // SAFETY: fcntl on a valid, owned descriptor with a fully initialized flock struct.
        let r = unsafe { libc::fcntl(file.as_raw_fd(), cmd, &mut fl) };
        if r == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// The first lock that would conflict with taking `kind` on `[start, start + len)` of `file`
/// as an open-file-description lock: `(kind, start, len)`, `None` if there is none.
pub fn ofd_conflict(
    file: &File,
    kind: i32,
    start: u64,
    len: u64,
) -> std::io::Result<Option<(i32, u64, u64)>> {
    let mut fl = flock_of(kind, start, len);
    // SAFETY: fcntl on a valid, owned descriptor with a fully initialized flock struct.
    let r = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_GETLK, &mut fl) };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    if fl.l_type == libc::F_UNLCK as i16 {
        return Ok(None);
    }
    Ok(Some((fl.l_type as i32, fl.l_start as u64, fl.l_len as u64)))
}

fn flock_of(kind: i32, start: u64, len: u64) -> libc::flock {
    // SAFETY: flock is a plain C struct for which all-zero bytes are a valid value.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = kind as i16;
    fl.l_whence = libc::SEEK_SET as i16;
    fl.l_start = start as i64;
    fl.l_len = len as i64;
    // OFD locks need l_pid 0.
    fl.l_pid = 0;
    fl
}

/// Drops the kernel's clean cached pages of `file` (POSIX_FADV_DONTNEED).
pub(crate) fn drop_page_cache(file: &File) {
    // SAFETY: posix_fadvise on a valid descriptor with plain integer arguments.
    unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn app_locks_stay_below_cloakfs_bytes() {
        assert_eq!(app_lock_range(0, 1023), Some((0, 1024)));
        assert_eq!(
            app_lock_range(10, i64::MAX as u64),
            Some((10, WAITING_BYTE))
        );
        assert_eq!(app_lock_range(5, u64::MAX), Some((5, WAITING_BYTE)));
        assert_eq!(app_lock_range(WAITING_BYTE, u64::MAX), None);
    }

    /// Two open file descriptions of one temporary file (as two clients would have).
    pub(crate) fn two_descriptions() -> (tempfile::NamedTempFile, File, File) {
        let t = tempfile::NamedTempFile::new().unwrap();
        let open = || {
            File::options()
                .read(true)
                .write(true)
                .open(t.path())
                .unwrap()
        };
        let (a, b) = (open(), open());
        (t, a, b)
    }

    #[test]
    fn an_application_lock_does_not_meet_cloakfs_bytes() {
        let (_t, a, b) = two_descriptions();
        ofd_lock(&a, libc::F_WRLCK, COORDINATION_BYTE, 1, false).unwrap();
        assert_eq!(
            ofd_conflict(&b, libc::F_RDLCK, COORDINATION_BYTE, 1).unwrap(),
            Some((libc::F_WRLCK, COORDINATION_BYTE, 1))
        );
        // Another client waiting for it says so on the byte before.
        ofd_lock(&a, libc::F_RDLCK, WAITING_BYTE, 1, false).unwrap();
        let (s, e) = app_lock_range(0, u64::MAX).unwrap();
        ofd_lock(&b, libc::F_WRLCK, s, e - s, false).unwrap();
    }
}
