//! The inode table: every node the kernel knows, with a descriptor of its backing object
//! (`O_PATH`, or readable: see [`NodeFd`]), keyed by the backing (st_dev, st_ino) so that
//! hard links are one node.
//!
//! A node's number is its backing inode number when that is unambiguous (same device as the
//! cipher directory), so numbers stay stable across lookups and mounts; anything else gets a
//! number from a private range. Holding the descriptor keeps the backing inode alive, so its
//! number cannot be reused while the kernel still knows the node.
//!
//! In the multi-user tree several tables share one FUSE number space: each gets a *base*
//! (`attach_id << 40`) and numbers its nodes `base | n` from a private counter, its root
//! being `base | 1`, so no two attaches can ever hand out the same number.

use crate::attr::Meta;
use crate::prune::{self, SeenAs};
use crate::sys::NodeFd;
use cloakfs_core::format::content::ContentCodec;
use cloakfs_core::format::names::DirId;
use cloakfs_core::io::file::ContentFile;
use cloakfs_core::io::shared::{ChangeStamp, Sharing};
use rustix::fd::{BorrowedFd, OwnedFd};
use rustix::fs::OFlags;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, RwLock};

/// FUSE's number for the root directory.
pub(crate) const ROOT: u64 = 1;
/// Bits of a node number local to one table in the multi-user tree (the rest is the base).
pub(crate) const LOCAL_BITS: u32 = 40;
/// Mask of the local part of a node number in the multi-user tree.
const LOCAL_MASK: u64 = (1 << LOCAL_BITS) - 1;
/// Node numbers from here up are handed out for objects whose inode number cannot serve.
const SYNTHETIC_BASE: u64 = 1 << 63;

/// What a node is, as far as the front end cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Dir,
    File,
    Symlink,
    Special,
}

impl Kind {
    pub(crate) fn of_mode(mode: u32) -> Self {
        match mode & libc::S_IFMT {
            libc::S_IFDIR => Kind::Dir,
            libc::S_IFREG => Kind::File,
            libc::S_IFLNK => Kind::Symlink,
            _ => Kind::Special,
        }
    }
}

/// The open plaintext view of a regular file, shared by all its handles.
#[derive(Default)]
struct OpenState {
    file: Option<Arc<ContentFile>>,
    /// Open handles (and operations in progress that opened the file themselves).
    users: u32,
    /// Whether `file` was opened read-write.
    writable: bool,
    /// Open handles (the numbers given to the kernel at open and create).
    handles: HashSet<u64>,
    /// A write the kernel had already acknowledged that did not reach the backing file, or a
    /// failed fsync of it, and the handles still to be told (see [`Inode::lose`]).
    lost: Option<(fuser::Errno, HashSet<u64>)>,
    /// The handle whose CREATE made the file, while it is open and no capability was set
    /// through this mount since (see [`Inode::created`]).
    made_by: Option<u64>,
    /// Open handles that bypass the page cache (see [`Inode::opened_uncached`]).
    uncached: HashSet<u64>,
}

/// One node known to the kernel.
pub(crate) struct Inode {
    pub(crate) nodeid: u64,
    /// The hold on the backing object.
    fd: NodeFd,
    pub(crate) kind: Kind,
    key: (u64, u64),
    /// The directory's ID (directories only).
    pub(crate) dir_id: crate::dirids::NodeDirId,
    /// Plaintext length of the symlink target (symlinks never change).
    pub(crate) symlink_len: OnceLock<u64>,
    open: Mutex<OpenState>,
    /// Signalled when a handle closes (see [`Inode::wait_closed`]).
    closed: std::sync::Condvar,
    /// The table's clock when a request last used this node (for pruning).
    last_used: AtomicU64,
    /// A plaintext entry of an adopted tree (see `plain`).
    plain: std::sync::atomic::AtomicBool,
    /// When the store last told its attributes (nanoseconds since [`epoch`], plus one; 0:
    /// not yet), on shared storage.
    refreshed: AtomicU64,
    /// The backing file's change stamp when an open last revalidated it (shared storage).
    stamp: Mutex<Option<ChangeStamp>>,
}

/// The instant node freshness is counted from.
fn epoch() -> std::time::Instant {
    static EPOCH: OnceLock<std::time::Instant> = OnceLock::new();
    *EPOCH.get_or_init(std::time::Instant::now)
}

impl std::fmt::Debug for Inode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inode")
            .field("nodeid", &self.nodeid)
            .field("kind", &self.kind)
            .finish_non_exhaustive()
    }
}

/// Whether a failed read-write open may be retried read-only.
fn denied(e: rustix::io::Errno) -> bool {
    use rustix::io::Errno as E;
    matches!(e, E::ACCESS | E::PERM | E::ROFS | E::TXTBSY)
}

impl Inode {
    fn new(nodeid: u64, fd: NodeFd, m: &Meta) -> Self {
        Self {
            nodeid,
            fd,
            kind: Kind::of_mode(m.mode),
            key: (m.dev, m.ino),
            dir_id: Default::default(),
            symlink_len: OnceLock::new(),
            open: Mutex::new(OpenState::default()),
            closed: std::sync::Condvar::new(),
            last_used: AtomicU64::new(0),
            plain: std::sync::atomic::AtomicBool::new(false),
            refreshed: AtomicU64::new(0),
            stamp: Mutex::new(None),
        }
    }

    /// Brings open file `f` of this node up to date with the shared store (see
    /// `ContentFile::revalidate`); `keep_pages`: the store client's cached pages may stay if
    /// the file did not change since the last revalidation. The attributes the store told it
    /// count as fresh from now (see [`Self::refreshed_within`]).
    pub(crate) fn revalidate(&self, f: &ContentFile, keep_pages: bool) -> cloakfs_core::Result<()> {
        let mut stamp = self.stamp.lock().unwrap_or_else(|e| e.into_inner());
        let seen = if keep_pages { *stamp } else { None };
        // A revalidation that failed leaves no stamp to trust.
        let fresh = f.revalidate(seen);
        *stamp = fresh.as_ref().ok().copied().flatten();
        if stamp.is_some() {
            let now = epoch().elapsed().as_nanos() as u64 + 1;
            self.refreshed.store(now, Ordering::Relaxed);
        }
        fresh.map(|_| ())
    }

    /// How long ago the store last told the node's attributes, if less than `within`.
    pub(crate) fn refreshed_within(
        &self,
        within: std::time::Duration,
    ) -> Option<std::time::Duration> {
        let at = self.refreshed.load(Ordering::Relaxed).checked_sub(1)?;
        let age = epoch()
            .elapsed()
            .checked_sub(std::time::Duration::from_nanos(at))?;
        (age < within).then_some(age)
    }

    /// Whether no open handle has the node, waiting up to `limit` for the last ones to close:
    /// the kernel sends a RELEASE after close(2) returned, so a handle its user closed may
    /// still be open here for a moment.
    pub(crate) fn wait_closed(&self, limit: std::time::Duration) -> bool {
        let st = self.state();
        let (st, _) = self
            .closed
            .wait_timeout_while(st, limit, |st| !st.handles.is_empty())
            .unwrap_or_else(|e| e.into_inner());
        st.handles.is_empty()
    }

    /// Marks the node as a plaintext entry of an adopted tree.
    pub(crate) fn mark_plain(&self) {
        self.plain.store(true, Ordering::Relaxed);
    }

    /// Marks the node as an encrypted entry again: `cloakfs encrypt` renamed its object.
    pub(crate) fn mark_encrypted(&self) {
        self.plain.store(false, Ordering::Relaxed);
    }

    /// Whether the node is a plaintext entry of an adopted tree.
    pub(crate) fn is_plain(&self) -> bool {
        self.plain.load(Ordering::Relaxed)
    }

    /// The backing descriptor (`O_PATH`, or open for reading).
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.fd.fd()
    }

    /// The backing descriptor, if the xattr calls can take it.
    pub(crate) fn xattr_fd(&self) -> Option<BorrowedFd<'_>> {
        self.fd.for_xattrs()
    }

    /// Changes the backing object's mode (see [`NodeFd::chmod`]).
    pub(crate) fn chmod(&self, mode: rustix::fs::Mode) -> rustix::io::Result<()> {
        self.fd.chmod(mode)
    }

    fn state(&self) -> MutexGuard<'_, OpenState> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The shared open file, if any handle has it open.
    pub(crate) fn current(&self) -> Option<Arc<ContentFile>> {
        self.state().file.clone()
    }

    /// Registers one user of the plaintext file (an open handle, or an operation that needs
    /// the file), opening the backing file on first use. The backing file is opened read-write
    /// whenever possible (the kernel's writeback cache reads through write-only handles), and
    /// read-only only when that is denied and no write is wanted.
    pub(crate) fn acquire(
        &self,
        codec: &Arc<ContentCodec>,
        sharing: Sharing,
        writable: bool,
        read_only_mount: bool,
    ) -> cloakfs_core::Result<Arc<ContentFile>> {
        let mut st = self.state();
        if let Some(f) = st.file.clone() {
            if !writable || st.writable {
                st.users += 1;
                return Ok(f);
            }
            // Upgrade: later operations pick up the read-write file from here.
            let fd = crate::sys::reopen(self.fd(), OFlags::RDWR).map_err(std::io::Error::from)?;
            let f = Arc::new(ContentFile::open(codec.clone(), fd.into())?.with_sharing(sharing));
            st.file = Some(f.clone());
            st.writable = true;
            st.users += 1;
            return Ok(f);
        }
        let (fd, rw) = if read_only_mount {
            (crate::sys::reopen(self.fd(), OFlags::RDONLY), false)
        } else {
            match crate::sys::reopen(self.fd(), OFlags::RDWR) {
                Err(e) if !writable && denied(e) => {
                    (crate::sys::reopen(self.fd(), OFlags::RDONLY), false)
                }
                r => (r, true),
            }
        };
        let fd = fd.map_err(std::io::Error::from)?;
        let f = Arc::new(ContentFile::open(codec.clone(), fd.into())?.with_sharing(sharing));
        st.file = Some(f.clone());
        st.writable = rw;
        st.users = 1;
        Ok(f)
    }

    /// Replaces `stale`, the open file that a user just found failing, with a fresh open of
    /// the backing file for every user, unless another user did so already; the mode stays.
    /// On shared storage a store's client may give up open descriptions when it connects to
    /// the store anew (sshfs's `reconnect`: each call on a description opened before fails
    /// with EIO), while a new open of the same name works.
    pub(crate) fn renew(
        &self,
        stale: &Arc<ContentFile>,
        codec: &Arc<ContentCodec>,
        sharing: Sharing,
    ) -> cloakfs_core::Result<Arc<ContentFile>> {
        let mut st = self.state();
        if let Some(f) = &st.file {
            if !Arc::ptr_eq(f, stale) {
                return Ok(f.clone());
            }
        }
        let mode = if st.writable {
            OFlags::RDWR
        } else {
            OFlags::RDONLY
        };
        let fd = crate::sys::reopen(self.fd(), mode).map_err(std::io::Error::from)?;
        let f = Arc::new(ContentFile::open(codec.clone(), fd.into())?.with_sharing(sharing));
        st.file = Some(f.clone());
        Ok(f)
    }

    /// Installs a file just created read-write as this node's open file (unless one is open
    /// already) and registers one user. `m` is the new file's fstat, just taken.
    pub(crate) fn install(
        &self,
        codec: &Arc<ContentCodec>,
        sharing: Sharing,
        fd: OwnedFd,
        m: &Meta,
    ) -> cloakfs_core::Result<Arc<ContentFile>> {
        let mut st = self.state();
        if let Some(f) = st.file.clone() {
            if st.writable {
                st.users += 1;
                return Ok(f);
            }
        }
        let f = ContentFile::open_stated(codec.clone(), fd.into(), m.size, m.blocks)?;
        let f = Arc::new(f.with_sharing(sharing));
        st.file = Some(f.clone());
        st.writable = true;
        st.users += 1;
        Ok(f)
    }

    /// Frees the data of this node's backing file, just unlinked for good, unless a handle
    /// has it open: the daemon's descriptor would otherwise keep the blocks allocated until
    /// the kernel forgets the node, after `rm` has returned (and after a `sync` that follows
    /// it), and the file system would free them while later work runs (measured: 1 GiB freed
    /// 170 ms after `rm` returned). Best effort: the file is already gone from every view.
    pub(crate) fn free_unlinked_data(&self) {
        let st = self.state();
        // No name left (whatever raced with the unlink), and nothing here has it open.
        let gone = rustix::fs::fstat(self.fd()).is_ok_and(|m| m.st_nlink == 0);
        if gone && st.users == 0 && st.file.is_none() {
            if let Ok(fd) = crate::sys::reopen(self.fd(), OFlags::WRONLY) {
                let _ = rustix::fs::ftruncate(&fd, 0);
            }
        }
    }

    /// Records that data of this open file was lost after the kernel had acknowledged it
    /// (a write from its page cache that failed, or a failed fsync, after which the backing
    /// file system may have dropped the data). Every fsync and close of a handle open at that
    /// moment then reports the first such error, until the error is handled: each of those
    /// handles is closed (each told at its close), or the file is truncated to nothing (no
    /// lost byte is part of it). Handles opened later did not write what was lost.
    pub(crate) fn lose(&self, e: fuser::Errno) {
        let mut st = self.state();
        if st.lost.is_none() {
            tracing::error!(
                "node {}: data lost after it was acknowledged: {e:?}",
                self.nodeid
            );
            let told = st.handles.clone();
            if !told.is_empty() {
                st.lost = Some((e, told));
            }
        }
    }

    /// The error that [`Inode::lose`] recorded, if handle `fh` was open then and the error is
    /// not handled yet.
    pub(crate) fn lost(&self, fh: u64) -> Option<fuser::Errno> {
        match &self.state().lost {
            Some((e, handles)) if handles.contains(&fh) => Some(*e),
            _ => None,
        }
    }

    /// Forgets a recorded loss: the file was truncated to nothing.
    pub(crate) fn emptied(&self) {
        self.state().lost = None;
    }

    /// Runs `f` while nothing has the file open, holding the open state's lock so that nothing
    /// opens it meanwhile (a withdrawal replaces the backing file); `None`, without running
    /// `f`, if a handle or an operation has it open.
    pub(crate) fn while_closed<R>(&self, f: impl FnOnce() -> R) -> Option<R> {
        let st = self.state();
        if st.users > 0 || st.file.is_some() || !st.handles.is_empty() {
            return None;
        }
        Some(f())
    }

    /// Whether the backing file has no name left: replaced under its name (a withdrawal,
    /// here or in another mount) or removed, since the kernel looked it up.
    pub(crate) fn replaced(&self) -> bool {
        rustix::fs::fstat(self.fd()).is_ok_and(|m| m.st_nlink == 0)
    }

    /// Registers open handle `fh` (after a successful open or create); returns whether it
    /// must bypass the page cache, as every handle must while one that does is open (see
    /// [`Inode::opened_uncached`]). Otherwise it caches: a write through the page cache stays
    /// coherent with shared mappings of the file, which a direct write is not (the kernel
    /// drops the pages it covers before it writes, so a mapping that faults a page in or
    /// dirties it meanwhile keeps the old bytes and may write them back over the new ones:
    /// xfstests generic/346).
    pub(crate) fn opened(&self, fh: u64) -> bool {
        let mut st = self.state();
        let uncached = !st.uncached.is_empty();
        st.handles.insert(fh);
        if uncached {
            st.uncached.insert(fh);
        }
        uncached
    }

    /// Registers open handle `fh` that bypasses the page cache whatever else has the file
    /// open: an O_APPEND handle on shared storage, whose writes land at the store's end of the
    /// file, not where the kernel's cached size says it ends (pages the kernel cached of such
    /// a write would hold it at the wrong offset). Handles opened while it is open bypass the
    /// cache as well, as after [`Inode::opened`]. Returns true.
    pub(crate) fn opened_uncached(&self, fh: u64) -> bool {
        let mut st = self.state();
        st.handles.insert(fh);
        st.uncached.insert(fh);
        true
    }

    /// Registers open handle `fh` of a file its CREATE has just made, as [`Inode::opened`]
    /// does. Until that handle is released, or a capability is set through this mount, the
    /// file is known to have no `security.capability`, which the kernel asks for before the
    /// first cached write after every CREATE: the answer needs no system call. A capability
    /// set on the backing file directly meanwhile shows once the handle's RELEASE is served,
    /// which close(2) does not wait for (no exec can read it before: the file is open for
    /// writing), and the backing write drops it anyway.
    pub(crate) fn created(&self, fh: u64) -> bool {
        let uncached = self.opened(fh);
        self.state().made_by = Some(fh);
        uncached
    }

    /// Whether the file is known to have no `security.capability` (see [`Inode::created`]).
    pub(crate) fn capability_absent(&self) -> bool {
        self.state().made_by.is_some()
    }

    /// A capability was set or removed through this mount.
    pub(crate) fn capability_changed(&self) {
        self.state().made_by = None;
    }

    /// Handle `fh` is released: it was told of any loss at its close. The last handle to be
    /// told handles the loss.
    pub(crate) fn closed(&self, fh: u64) {
        let mut st = self.state();
        st.handles.remove(&fh);
        st.uncached.remove(&fh);
        if st.made_by == Some(fh) {
            st.made_by = None;
        }
        if let Some((_, handles)) = &mut st.lost {
            handles.remove(&fh);
            if handles.is_empty() {
                st.lost = None;
            }
        }
        if st.handles.is_empty() {
            self.closed.notify_all();
        }
    }

    /// Drops one user; the last one closes the backing file (then returns true).
    pub(crate) fn release(&self) -> bool {
        let closing = {
            let mut st = self.state();
            st.users = st.users.saturating_sub(1);
            if st.users == 0 {
                st.writable = false;
                st.file.take()
            } else {
                None
            }
        };
        let last = closing.is_some();
        // Closed outside the lock.
        drop(closing);
        last
    }
}

struct Entry {
    inode: Arc<Inode>,
    lookups: u64,
    /// The name the kernel last looked it up by, if known (what a prune invalidates).
    seen_as: Option<SeenAs>,
}

#[derive(Default)]
struct Tables {
    nodes: HashMap<u64, Entry>,
    keys: HashMap<(u64, u64), u64>,
    /// Last number handed out from the private range (or, with a base, the local counter).
    next_synthetic: u64,
}

/// All nodes the kernel holds references to.
pub(crate) struct InodeTable {
    inner: RwLock<Tables>,
    root_dev: u64,
    /// 0 for a mount of its own (numbers from backing inodes); else the high bits every
    /// number of this table carries in the multi-user tree.
    base: u64,
    /// Nodes made so far: the time scale of least-recently-used.
    clock: AtomicU64,
}

impl InodeTable {
    /// A table holding only the root, whose backing directory is `fd` with ID `root_id`.
    /// `base` is 0 for a mount of its own, else `attach_id << LOCAL_BITS`.
    pub(crate) fn new(fd: NodeFd, m: &Meta, root_id: DirId, base: u64) -> Self {
        debug_assert_eq!(base & LOCAL_MASK, 0);
        let root_nodeid = base | ROOT;
        let root = Inode::new(root_nodeid, fd, m);
        root.dir_id.get_or_init(root_id);
        let mut t = Tables {
            next_synthetic: if base == 0 { SYNTHETIC_BASE } else { ROOT },
            ..Tables::default()
        };
        t.keys.insert(root.key, root_nodeid);
        t.nodes.insert(
            root_nodeid,
            Entry {
                inode: Arc::new(root),
                lookups: 1,
                seen_as: None,
            },
        );
        prune::node_made();
        Self {
            inner: RwLock::new(t),
            root_dev: m.dev,
            base,
            clock: AtomicU64::new(0),
        }
    }

    /// The number of this table's root.
    pub(crate) fn root(&self) -> u64 {
        self.base | ROOT
    }

    /// Whether numbers come from a per-table counter (the multi-user tree).
    pub(crate) fn is_tree(&self) -> bool {
        self.base != 0
    }

    /// Every node number the kernel currently holds (for cache invalidations).
    pub(crate) fn node_ids(&self) -> Vec<u64> {
        self.read().nodes.keys().copied().collect()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Tables> {
        self.inner.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Tables> {
        self.inner.write().unwrap_or_else(|e| e.into_inner())
    }

    /// The node `nodeid`, if the kernel still holds it, marked as used now.
    pub(crate) fn get(&self, nodeid: u64) -> Option<Arc<Inode>> {
        let inode = self.read().nodes.get(&nodeid).map(|e| e.inode.clone())?;
        inode
            .last_used
            .store(self.clock.load(Ordering::Relaxed), Ordering::Relaxed);
        Some(inode)
    }

    /// The directory node and the name the kernel last looked node `nodeid` up by.
    pub(crate) fn seen_as(&self, nodeid: u64) -> Option<SeenAs> {
        self.read().nodes.get(&nodeid)?.seen_as.clone()
    }

    /// Records that backing object (`dev`, `ino`) is named `name` in directory node `parent`
    /// now: renamed through the mount, which the kernel does not look up again.
    pub(crate) fn renamed(&self, dev: u64, ino: u64, parent: u64, name: &[u8]) {
        let mut t = self.write();
        if let Some(&n) = t.keys.get(&(dev, ino)) {
            if let Some(e) = t.nodes.get_mut(&n) {
                e.seen_as = Some((parent, name.into()));
            }
        }
    }

    /// The node of backing object (`dev`, `ino`), if the kernel knows one.
    pub(crate) fn by_key(&self, dev: u64, ino: u64) -> Option<Arc<Inode>> {
        let t = self.read();
        let nodeid = t.keys.get(&(dev, ino))?;
        t.nodes.get(nodeid).map(|e| e.inode.clone())
    }

    /// Nodes made by this table so far.
    pub(crate) fn clock(&self) -> u64 {
        self.clock.load(Ordering::Relaxed)
    }

    /// The names to invalidate to free about `n` of the least recently used nodes that no
    /// handle has open, each by its own name, so that only those leave the kernel's cache.
    /// Nodes that no other known node lies in go first: a directory's name would take every
    /// unused name below it, recently used ones too, and a directory on the way to used
    /// files may look idle, since a path walk through the kernel's cached names sends it no
    /// request. Directories that hold known nodes go only when too few others are idle.
    pub(crate) fn least_used(&self, n: usize) -> Vec<SeenAs> {
        let t = self.read();
        let root = self.root();
        let parents: HashSet<u64> = t
            .nodes
            .values()
            .filter_map(|e| Some(e.seen_as.as_ref()?.0))
            .collect();
        let (mut leaves, mut holding): (Vec<_>, Vec<_>) = t
            .nodes
            .values()
            .filter(|e| e.inode.nodeid != root && e.inode.current().is_none())
            .filter_map(|e| {
                let used = e.inode.last_used.load(Ordering::Relaxed);
                Some((used, e.seen_as.as_ref()?, e.inode.nodeid))
            })
            .partition(|&(_, _, nodeid)| !parents.contains(&nodeid));
        let oldest = |v: &mut Vec<(u64, &SeenAs, u64)>, k: usize| {
            if k < v.len() {
                v.select_nth_unstable_by_key(k, |&(used, _, _)| used);
                v.truncate(k);
            }
        };
        oldest(&mut leaves, n);
        oldest(&mut holding, n - leaves.len());
        leaves
            .into_iter()
            .chain(holding)
            .map(|(_, seen, _)| seen.clone())
            .collect()
    }

    fn plain_number(&self, dev: u64, ino: u64) -> bool {
        self.base == 0 && dev == self.root_dev && ino > ROOT && ino < SYNTHETIC_BASE
    }

    /// The number a directory listing reports for backing inode `ino` of device `dev`.
    pub(crate) fn number_hint(&self, dev: u64, ino: u64) -> u64 {
        if let Some(&n) = self.read().keys.get(&(dev, ino)) {
            return n;
        }
        if self.plain_number(dev, ino) {
            ino
        } else if self.base != 0 {
            // Only a hint, but inside this table's range.
            self.base | LOCAL_MASK
        } else {
            // Only a hint: readdir numbers are not node IDs.
            SYNTHETIC_BASE - 1
        }
    }

    /// Counts one kernel lookup of the object behind `fd` (described by `m`), found as
    /// plaintext `name` in directory node `parent`, adding a node for it unless one exists
    /// (then `fd` is closed). With a new node, also returns how many nodes the process has.
    pub(crate) fn lookup(
        &self,
        fd: NodeFd,
        m: &Meta,
        parent: u64,
        name: &[u8],
    ) -> (Arc<Inode>, Option<usize>) {
        let key = (m.dev, m.ino);
        let mut t = self.write();
        if let Some(&n) = t.keys.get(&key) {
            if let Some(e) = t.nodes.get_mut(&n) {
                e.lookups += 1;
                if !matches!(&e.seen_as, Some((p, s)) if *p == parent && **s == *name) {
                    e.seen_as = Some((parent, name.into()));
                }
                return (e.inode.clone(), None);
            }
        }
        let nodeid = if self.plain_number(m.dev, m.ino) && !t.nodes.contains_key(&m.ino) {
            m.ino
        } else if self.base != 0 {
            // Wraps within the local range (never 0, the root or the readdir hint), skipping
            // numbers still in use: a number the kernel has forgotten may be given again.
            loop {
                t.next_synthetic = if t.next_synthetic >= LOCAL_MASK - 1 {
                    ROOT + 1
                } else {
                    t.next_synthetic + 1
                };
                if !t.nodes.contains_key(&(self.base | t.next_synthetic)) {
                    break self.base | t.next_synthetic;
                }
            }
        } else {
            t.next_synthetic += 1;
            t.next_synthetic
        };
        let inode = Arc::new(Inode::new(nodeid, fd, m));
        inode.last_used.store(
            self.clock.fetch_add(1, Ordering::Relaxed) + 1,
            Ordering::Relaxed,
        );
        t.keys.insert(key, nodeid);
        t.nodes.insert(
            nodeid,
            Entry {
                inode: inode.clone(),
                lookups: 1,
                seen_as: Some((parent, name.into())),
            },
        );
        (inode, Some(prune::node_made()))
    }

    /// Drops `n` kernel references to `nodeid`; the last one frees the node.
    pub(crate) fn forget(&self, nodeid: u64, n: u64) {
        if nodeid == self.root() {
            return;
        }
        let freed = {
            let mut t = self.write();
            let Some(e) = t.nodes.get_mut(&nodeid) else {
                return;
            };
            e.lookups = e.lookups.saturating_sub(n);
            if e.lookups != 0 {
                return;
            }
            let freed = t.nodes.remove(&nodeid);
            if let Some(e) = &freed {
                t.keys.remove(&e.inode.key);
                prune::node_freed();
            }
            freed
        };
        // Closed outside the lock: closing the last descriptor of an unlinked file makes the
        // backing file system free it (rm -rf), which must not stall every other request.
        drop(freed);
    }

    /// Removes every node (at unmount), returning them so the caller can close them.
    pub(crate) fn drain(&self) -> Vec<Arc<Inode>> {
        let mut t = self.write();
        t.keys.clear();
        t.nodes
            .drain()
            .map(|(_, e)| {
                prune::node_freed();
                e.inode
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_node() -> Inode {
        let f = tempfile::tempfile().unwrap();
        let m = crate::attr::Meta::of_fd(&f).unwrap();
        Inode::new(2, NodeFd::readable(f.into()), &m)
    }

    /// A table rooted in directory `root`.
    fn table_in(root: &std::path::Path) -> InodeTable {
        let dir = std::fs::File::open(root).unwrap();
        let m = Meta::of_fd(&dir).unwrap();
        InodeTable::new(NodeFd::readable(dir.into()), &m, DirId([0; 16]), 0)
    }

    /// Looks up `path` (inside directory node `parent`) in `t`, as the kernel would: its node.
    fn add(t: &InodeTable, path: &std::path::Path, parent: u64) -> u64 {
        let f = std::fs::File::open(path).unwrap();
        let m = Meta::of_fd(&f).unwrap();
        let name = path.file_name().unwrap().as_encoded_bytes();
        t.lookup(NodeFd::readable(f.into()), &m, parent, name)
            .0
            .nodeid
    }

    fn names(seen: &[SeenAs]) -> Vec<&[u8]> {
        let mut v: Vec<&[u8]> = seen.iter().map(|(_, n)| &n[..]).collect();
        v.sort();
        v
    }

    /// Pruning frees the least recently used nodes by their own names, a directory that
    /// known nodes lie in only when too few others are idle (its name would take them all,
    /// however recently used, and a path walk through cached names sends it no request).
    #[test]
    fn pruning_picks_least_used_leaves_by_their_own_names() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("d")).unwrap();
        for f in ["d/a", "d/b", "x"] {
            std::fs::write(root.path().join(f), b"").unwrap();
        }
        let t = table_in(root.path());
        let d = add(&t, &root.path().join("d"), t.root());
        let a = add(&t, &root.path().join("d/a"), d);
        let b = add(&t, &root.path().join("d/b"), d);
        add(&t, &root.path().join("x"), t.root());

        // Looked up in the order d, a, b, x; d is never a candidate while a or b is known.
        assert_eq!(names(&t.least_used(1)), [b"a"]);
        assert_eq!(names(&t.least_used(3)), [&b"a"[..], b"b", b"x"]);
        // A request on a marks it used: b is now the oldest.
        t.get(a).unwrap();
        assert_eq!(names(&t.least_used(1)), [b"b"]);
        // With too few such nodes idle, a directory that holds some goes too.
        assert_eq!(names(&t.least_used(4)), [&b"a"[..], b"b", b"d", b"x"]);
        // Once the kernel has forgotten what lies in d, d itself is like a file.
        t.forget(a, 1);
        t.forget(b, 1);
        assert_eq!(names(&t.least_used(1)), [b"d"]);
        assert_eq!(names(&t.least_used(10)), [&b"d"[..], b"x"]);
    }

    /// A file's handles cache unless one that bypasses the page cache is open (an appending
    /// handle on shared storage); those opened while it is open bypass it too, until it
    /// closes.
    #[test]
    fn handles_opened_beside_an_uncached_one_bypass_the_cache_too() {
        let node = file_node();
        assert!(!node.created(1), "a new file's handle caches");
        assert!(!node.opened(2));
        assert!(node.opened_uncached(3));
        assert!(node.opened(4), "opened while an uncached handle is open");
        node.closed(3);
        assert!(node.opened(5), "handle 4 is still uncached");
        node.closed(4);
        node.closed(5);
        assert!(!node.opened(6), "all uncached handles closed");
        assert!(node.capability_absent(), "the creator's handle is open");
        node.closed(1);
        assert!(!node.capability_absent());
    }
}
