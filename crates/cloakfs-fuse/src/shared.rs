//! The FUSE side of shared storage (`cloakfs mount --shared-storage`): what the kernel may
//! cache, and applications' byte-range and flock locks passed on to the backing files, so that
//! several machines mounting one cipher directory from a shared store see one file system.
//! The contents' side is `cloakfs_core::io::shared`.
//!
//! Alone, the kernel keeps pages across opens, caches negative entries, uses its writeback
//! cache and handles locks itself. Shared, it does none of these (NFS's close-to-open
//! consistency): every open drops the file's cached pages and attributes after the plaintext
//! file was brought up to date with the store, names not found are looked up again, and each
//! application lock owner gets a backing file description of its own that carries its locks
//! as open-file-description locks on the same plaintext offsets (FORMAT.md 19).

use crate::fs::CloakFs;
use crate::inode::Inode;
use crate::sys::{errno, Res};
use cloakfs_core::io::file::ContentFile;
use cloakfs_core::io::shared::{app_lock_range, ofd_conflict, ofd_lock, wait_for_lock, Sharing};
use fuser::{Errno, FopenFlags, INodeNo, InitFlags, Notifier};
use rustix::fs::{AtFlags, OFlags, StatxFlags};
use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// How this mount shares its cipher directory, and the state that needs.
pub(crate) struct Coherence {
    pub(crate) sharing: Sharing,
    /// Per (node, lock owner): the backing file description holding that owner's locks.
    locks: Mutex<HashMap<(u64, u64), Arc<File>>>,
    notifier: Arc<OnceLock<Notifier>>,
    /// Whether a refused SQLite WAL file was logged (see `sqlite_wal_base`).
    wal_refused: std::sync::atomic::AtomicBool,
}

impl Coherence {
    pub(crate) fn new(sharing: Sharing, notifier: Arc<OnceLock<Notifier>>) -> Self {
        Self {
            sharing,
            locks: Mutex::new(HashMap::new()),
            notifier,
            wal_refused: false.into(),
        }
    }

    pub(crate) fn notifier(&self) -> Arc<OnceLock<Notifier>> {
        self.notifier.clone()
    }

    /// What an open file or directory handle tells the kernel: alone, keep cached pages
    /// across opens (they are dropped when a later attribute refresh shows a change); shared,
    /// drop them at every open.
    pub(crate) fn open_flags(&self) -> FopenFlags {
        if self.sharing.is_shared() {
            FopenFlags::empty()
        } else {
            FopenFlags::FOPEN_KEEP_CACHE
        }
    }

    /// How long the kernel may remember that a name does not exist: shared, not at all, since
    /// another client may create it at any time.
    pub(crate) fn negative_ttl(&self, ttl: Duration) -> Duration {
        if self.sharing.is_shared() {
            Duration::ZERO
        } else {
            ttl
        }
    }

    /// How long the kernel may keep the entry of `attr`'s node: shared, a name that is not a
    /// directory is looked up again at every open (another client may have replaced or
    /// removed it: SQLite's journal comes and goes), as NFS revalidates at open.
    pub(crate) fn entry_ttl(&self, ttl: Duration, attr: &fuser::FileAttr) -> Duration {
        if self.sharing.is_shared() && attr.kind != fuser::FileType::Directory {
            Duration::ZERO
        } else {
            ttl
        }
    }

    /// The error for an open of a node whose backing file is gone: shared, ESTALE, so the
    /// kernel looks the name up again (another client removed or replaced it since the
    /// lookup), as on NFS.
    pub(crate) fn stale(&self, e: Errno) -> Errno {
        if self.sharing.is_shared() && e == Errno::ENOENT {
            Errno::ESTALE
        } else {
            e
        }
    }

    /// Makes the store's client look backing name `name` in `dir` up again at the store,
    /// after its cached entry led to an object that is gone (see `CloakFs::lookup_backing`).
    pub(crate) fn forget_stale_name(&self, dir: BorrowedFd<'_>, name: &str) {
        // Its result (the new object's attributes, or ENOENT) is read by the lookup after it.
        let _ = rustix::fs::statx(
            dir,
            name,
            AtFlags::SYMLINK_NOFOLLOW | AtFlags::STATX_FORCE_SYNC,
            StatxFlags::BASIC_STATS,
        );
    }

    /// The connection's capabilities that depend on sharing: shared, locks passed to us (the
    /// writeback cache is never taken then: its cached size would hide other clients' growth).
    pub(crate) fn capabilities(&self) -> InitFlags {
        if self.sharing.is_shared() {
            InitFlags::FUSE_POSIX_LOCKS | InitFlags::FUSE_FLOCK_LOCKS
        } else {
            InitFlags::empty()
        }
    }

    /// The capabilities not to take when sharing: readdirplus, whose entries of files would
    /// carry a zero entry timeout (`entry_ttl`), so that the kernel looks each one up again
    /// before using it; every entry's lookup at the store (several round trips each) would be
    /// work thrown away. Listings are plain READDIR then, as gocryptfs's.
    pub(crate) fn not_wanted(&self) -> InitFlags {
        if self.sharing.is_shared() {
            crate::ops::READDIRPLUS
        } else {
            InitFlags::empty()
        }
    }

    /// Refuses (EPERM), if this mount is shared, a write of a SQLite database's first page
    /// that switches it to WAL mode (file format numbers 2 at bytes 18 and 19 after the
    /// header string: `PRAGMA journal_mode=WAL`), so the PRAGMA fails and its transaction is
    /// rolled back: the database stays in rollback-journal mode, which works from every
    /// client. WAL's index is shared memory (a mapping of `DB-shm`) that SQLite assumes every
    /// connection sees at once, which no two machines do (SQLite's documentation rules WAL
    /// out on network file systems).
    pub(crate) fn refuse_sqlite_wal_header(&self, offset: u64, data: &[u8]) -> Res<()> {
        const MAGIC: &[u8] = b"SQLite format 3\0";
        if self.sharing.is_shared()
            && offset == 0
            && data.len() > 19
            && data.starts_with(MAGIC)
            && (data[18] == 2 || data[19] == 2)
        {
            self.refused_sqlite_wal(OsStr::new("a database's first page"));
            return Err(Errno::EPERM);
        }
        Ok(())
    }

    /// The database whose SQLite write-ahead log or WAL index a new file `name` would be
    /// (`DB-wal`, `DB-shm`), if this mount is shared: such a file is refused when `DB` exists
    /// beside it, so a database put in WAL mode elsewhere (see
    /// [`Self::refuse_sqlite_wal_header`]) is not opened in WAL mode here.
    pub(crate) fn sqlite_wal_base<'n>(&self, name: &'n OsStr) -> Option<&'n OsStr> {
        use std::os::unix::ffi::OsStrExt;
        if !self.sharing.is_shared() {
            return None;
        }
        let b = name.as_bytes();
        let base = b
            .strip_suffix(b"-wal")
            .or_else(|| b.strip_suffix(b"-shm"))?;
        (!base.is_empty()).then(|| OsStr::from_bytes(base))
    }

    /// Says, once per mount, that SQLite's WAL mode was refused (for `name`).
    pub(crate) fn refused_sqlite_wal(&self, name: &OsStr) {
        if !self
            .wal_refused
            .swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            tracing::warn!(
                "{}: SQLite's WAL mode refused on shared storage (its index is each machine's \
                 own memory, so clients would not see each other's commits); the database \
                 keeps its rollback journal, which works from every client",
                name.to_string_lossy()
            );
        }
    }

    /// After node `ino`'s plaintext file `f` was opened: shared, bring it up to date with the
    /// store and make the kernel fetch its attributes again (close-to-open).
    pub(crate) fn opened(&self, inode: &Inode, f: &ContentFile) -> cloakfs_core::Result<()> {
        if !self.sharing.is_shared() {
            return Ok(());
        }
        inode.revalidate(f, true)?;
        let ino = inode.nodeid;
        if let Some(n) = self.notifier.get() {
            // A negative offset invalidates the attributes only; pages go by the open flags.
            let _ = n.inval_inode(INodeNo(ino), -1, 0);
        }
        Ok(())
    }

    /// The backing description that carries `owner`'s locks on `inode`, opened on first use.
    fn lock_file(&self, inode: &Inode, owner: u64) -> Res<Arc<File>> {
        let mut locks = self.locks.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(f) = locks.get(&(inode.nodeid, owner)) {
            return Ok(f.clone());
        }
        let fd = crate::sys::reopen(inode.fd(), OFlags::RDWR)
            .or_else(|_| crate::sys::reopen(inode.fd(), OFlags::RDONLY))
            .map_err(errno)?;
        let f = Arc::new(File::from(fd));
        locks.insert((inode.nodeid, owner), f.clone());
        Ok(f)
    }

    /// Drops `owner`'s locks on node `ino`.
    pub(crate) fn drop_owner(&self, ino: u64, owner: u64) {
        let gone = self
            .locks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&(ino, owner));
        if let Some(f) = gone {
            unlock_all(&f);
        }
    }

    /// Drops every owner's locks on node `ino` (its last handle closed).
    pub(crate) fn drop_node(&self, ino: u64) {
        let mut gone = Vec::new();
        self.locks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|(n, _), f| {
                if *n == ino {
                    gone.push(f.clone());
                }
                *n != ino
            });
        gone.iter().for_each(|f| unlock_all(f));
    }
}

impl CloakFs {
    /// Shared: lets the lease of `inode`'s open file go, its changes flushed to the store
    /// (`ContentFile::settle`), before the application's close or lock makes them another
    /// client's to see. A flush that fails is data lost after it was acknowledged: reported
    /// by the next fsync and close (`Inode::lose`).
    pub(crate) fn settle(&self, inode: &Inode) {
        if let Some(file) = inode.current() {
            if let Err(e) = file.settle() {
                inode.lose(self.fail(&e, file.backing().as_fd(), Some("flush")));
            }
        }
    }

    /// F_GETLK: the first lock, held by another owner here or by any other client, that
    /// conflicts with `typ` on plaintext bytes `[start, end]`: `(start, end, typ, pid)`, or
    /// `typ` F_UNLCK if none.
    pub(crate) fn do_getlk(
        &self,
        ino: INodeNo,
        owner: u64,
        start: u64,
        end: u64,
        typ: i32,
    ) -> Res<(u64, u64, i32, u32)> {
        let inode = self.node(ino)?;
        let (s, e) = app_lock_range(start, end).ok_or(Errno::EINVAL)?;
        let f = self.coherence.lock_file(&inode, owner)?;
        match ofd_conflict(&f, typ, s, e - s).map_err(io_errno)? {
            None => Ok((start, end, libc::F_UNLCK, 0)),
            Some((kind, s, len)) => {
                let last = if len == 0 || s + len >= cloakfs_core::io::shared::WAITING_BYTE {
                    i64::MAX as u64
                } else {
                    s + len - 1
                };
                // OFD locks have no owning process; 0 is what NFS reports for a remote one.
                Ok((s, last, kind, 0))
            }
        }
    }

    /// F_SETLK(W) and flock: takes or releases `owner`'s lock `typ` on plaintext bytes
    /// `[start, end]`, waiting for conflicting locks if `sleep` (a waiting lock occupies one
    /// of the mount's worker threads, and tries again from here rather than queueing at the
    /// store: see `wait_for_lock`).
    pub(crate) fn do_setlk(
        &self,
        ino: INodeNo,
        owner: u64,
        start: u64,
        end: u64,
        typ: i32,
        sleep: bool,
    ) -> Res<()> {
        let inode = self.node(ino)?;
        let (s, e) = app_lock_range(start, end).ok_or(Errno::EINVAL)?;
        let f = self.coherence.lock_file(&inode, owner)?;
        // What this client changed goes to the store before a lock changes hands here.
        self.settle(&inode);
        if sleep && typ != libc::F_UNLCK {
            wait_for_lock(&f, typ, s, e - s).map_err(io_errno)?;
        } else {
            ofd_lock(&f, typ, s, e - s, false).map_err(io_errno)?;
        }
        if typ != libc::F_UNLCK {
            // As NFS does: what another client wrote before it unlocked shows to the new
            // holder (SQLite checks its change counter right after it locks).
            if let Some(file) = inode.current() {
                inode
                    .revalidate(&file, false)
                    .map_err(|e| self.fail(&e, inode.fd(), None))?;
            }
            if let Some(n) = self.coherence.notifier.get() {
                let _ = n.inval_inode(ino, 0, 0);
            }
        }
        Ok(())
    }
}

fn io_errno(e: std::io::Error) -> Errno {
    Errno::from_i32(e.raw_os_error().unwrap_or(libc::EIO))
}

/// Releases every lock held through `f` before it is closed: a FUSE store (GlusterFS) learns
/// of a close only later, in the background, and would keep the locks until then.
fn unlock_all(f: &File) {
    if let Err(e) = ofd_lock(f, libc::F_UNLCK, 0, 0, false) {
        tracing::warn!("releasing a lock owner's locks: {e}");
    }
}
