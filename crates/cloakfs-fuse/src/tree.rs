//! The multi-user attach tree: one FUSE mount (normally `/crypt`) whose root is a virtual,
//! read-only directory and whose entries are *attaches*, each the plaintext view of one
//! cipher directory (NCryptfs section 3.3, CFS's /crypt).
//!
//! The tree only routes requests (its request gate, `tree_ops::TreeGate`) and switches
//! credentials; who may do what is decided by a [`Gate`] supplied by the daemon, before
//! anything is decrypted.
//!
//! API contract (implemented by the FUSE helper; used by `cloakfs-daemon`):
//! - [`mount_tree`] mounts the tree (allow_other, no default_permissions, no writeback
//!   cache) and returns the unserved mount plus a cloneable [`TreeHandle`];
//! - [`TreeHandle::attach`] / [`TreeHandle::detach`] add and remove attaches at run time;
//! - [`TreeHandle::invalidate`] drops the kernel's cached attributes and pages of every node
//!   of one attach (after a revocation or timeout), so the next access reaches the gate.

use crate::creds::Creds;
use crate::fs::CloakFs;
use crate::inode::LOCAL_BITS;
use crate::MountOptions;
use cloakfs_core::Volume;
use fuser::{INodeNo, Notifier};
use rustix::fd::OwnedFd;
use std::collections::HashMap;
use std::ffi::OsStr;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::{Duration, SystemTime};

/// Identifies one attach for the life of the daemon (never reused).
pub type AttachId = u64;

/// Who sent a FUSE request, from the request header (the kernel fills it in).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
}

/// The kind of access a request needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// See that an entry exists and its attributes: lookup, getattr, statfs, access(F_OK).
    Look,
    /// Plaintext content or names: open for reading, read, readdir, readlink, getxattr,
    /// listxattr, access(R_OK).
    Read,
    /// Any change: create, mkdir, mknod, symlink, link, unlink, rmdir, rename, setattr,
    /// open for writing, write, fallocate, setxattr, removexattr, access(W_OK).
    Write,
    /// Open for execution (`__FMODE_EXEC` in the open flags), access(X_OK).
    Exec,
}

/// What one request needs from the gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Need {
    pub access: Access,
    /// The request works on an already open file or directory handle (read, write, fsync,
    /// readdir, getattr with a handle, ...), as opposed to reaching something new. Timeouts
    /// with the `fail-new` and `sleep-new` behaviours let these through.
    pub on_open_handle: bool,
}

/// The gate's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Go ahead. With `bypass`, the backing files are used with the attach owner's
    /// credentials; otherwise with the caller's (so lower-level permission checks apply to
    /// the caller).
    Allow { bypass: bool },
    /// Refuse with EACCES.
    Deny,
}

/// Decides every request on an attach. Called on a FUSE worker thread before any backing
/// file is touched; may block (sleeping timeouts) for a bounded time.
pub trait Gate: Send + Sync + 'static {
    fn check(&self, attach: AttachId, caller: &Caller, need: Need) -> Verdict;
}

/// One attach to add.
pub struct AttachSpec {
    /// Entry name under the tree root (a single path component).
    pub name: String,
    pub volume: Volume,
    /// `O_PATH | O_DIRECTORY` descriptor of the cipher directory (opened with the
    /// attaching user's credentials).
    pub cipherdir: OwnedFd,
    /// The attaching user: the attach root shows as theirs, mode 0700, and `bypass` uses
    /// their credentials.
    pub owner_uid: u32,
    pub owner_gid: u32,
    pub owner_groups: Vec<u32>,
    /// Left out of root listings, still reachable by its exact name.
    pub hidden: bool,
    pub read_only: bool,
}

/// Node number of the tree root (FUSE's root).
pub(crate) const TREE_ROOT: u64 = crate::inode::ROOT;

/// The attach a node number belongs to (0: the tree root).
pub(crate) fn attach_of_node(ino: u64) -> AttachId {
    ino >> LOCAL_BITS
}

/// One attached cipher directory.
pub(crate) struct Attach {
    pub(crate) id: AttachId,
    pub(crate) name: String,
    pub(crate) hidden: bool,
    pub(crate) fs: CloakFs,
    /// Used for requests the gate lets through with `bypass`.
    pub(crate) owner: Creds,
}

/// State shared by the FUSE workers and every [`TreeHandle`].
pub(crate) struct Shared {
    /// Requests clone an attach's `Arc` and drop the lock at once, so detach never waits
    /// for a request and a detached attach lives only as long as its requests in flight.
    attaches: RwLock<HashMap<AttachId, Arc<Attach>>>,
    next_id: AtomicU64,
    pub(crate) gate: Arc<dyn Gate>,
    /// Entry and attribute lifetime for nodes inside attaches.
    ttl: Duration,
    /// Shown as the tree root's times; moves with every attach and detach.
    pub(crate) changed: Mutex<SystemTime>,
}

impl Shared {
    pub(crate) fn new(gate: Arc<dyn Gate>, ttl: Duration) -> Self {
        Self {
            attaches: RwLock::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            gate,
            ttl,
            changed: Mutex::new(SystemTime::now()),
        }
    }

    fn map(&self) -> std::sync::RwLockReadGuard<'_, HashMap<AttachId, Arc<Attach>>> {
        self.attaches.read().unwrap_or_else(|e| e.into_inner())
    }

    fn map_mut(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<AttachId, Arc<Attach>>> {
        self.attaches.write().unwrap_or_else(|e| e.into_inner())
    }

    fn touch(&self) {
        *self.changed.lock().unwrap_or_else(|e| e.into_inner()) = SystemTime::now();
    }

    /// The attach serving node `ino`, if it is still attached.
    pub(crate) fn attach(&self, ino: INodeNo) -> Option<Arc<Attach>> {
        match attach_of_node(ino.0) {
            0 => None,
            id => self.map().get(&id).cloned(),
        }
    }

    /// The attach named `name`.
    pub(crate) fn by_name(&self, name: &OsStr) -> Option<Arc<Attach>> {
        self.map()
            .values()
            .find(|a| OsStr::new(&a.name) == name)
            .cloned()
    }

    /// Every attach, in attach order.
    pub(crate) fn all(&self) -> Vec<Arc<Attach>> {
        let mut v: Vec<_> = self.map().values().cloned().collect();
        v.sort_by_key(|a| a.id);
        v
    }

    /// Detaches everything and closes its files (at unmount).
    pub(crate) fn shutdown(&self) {
        let all: Vec<_> = self.map_mut().drain().map(|(_, a)| a).collect();
        for a in all {
            a.fs.shutdown();
        }
    }
}

/// Checks that `name` can be an entry of the tree root.
fn valid_name(name: &str) -> io::Result<()> {
    let bad = name.is_empty()
        || name == "."
        || name == ".."
        || name.len() > 255
        || name.contains(['/', '\0']);
    if bad {
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{name:?} is not a valid attach name"),
        ))
    } else {
        Ok(())
    }
}

/// Adds, removes and invalidates attaches of a mounted tree. Cheap to clone; used from the
/// daemon's control threads. Never call it from a FUSE worker thread (a [`Gate`]): the
/// kernel may wait for that very thread while handling an invalidation.
#[derive(Clone)]
pub struct TreeHandle {
    shared: Arc<Shared>,
    notifier: Notifier,
    mountpoint: PathBuf,
    /// The mount's device (major, minor), if /proc/self/mountinfo showed it.
    device: Option<(u32, u32)>,
}

impl std::fmt::Debug for TreeHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TreeHandle")
            .field("attaches", &self.names())
            .finish_non_exhaustive()
    }
}

impl TreeHandle {
    /// Adds an attach under `spec.name`. Fails with `AlreadyExists` if the name is taken,
    /// `InvalidInput` for a name that is not a single path component.
    pub fn attach(&self, spec: AttachSpec) -> io::Result<AttachId> {
        valid_name(&spec.name)?;
        if self.shared.by_name(OsStr::new(&spec.name)).is_some() {
            return Err(name_taken(&spec.name));
        }
        let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        if id >= 1 << (64 - LOCAL_BITS) {
            return Err(io::Error::other("no attach numbers left"));
        }
        let fs = CloakFs::from_fd(
            spec.volume,
            spec.cipherdir,
            self.shared.ttl,
            spec.read_only,
            id << LOCAL_BITS,
            Some((spec.owner_uid, spec.owner_gid)),
            Arc::new(OnceLock::from(self.notifier.clone())),
        )?;
        let attach = Arc::new(Attach {
            id,
            name: spec.name,
            hidden: spec.hidden,
            fs,
            owner: Creds {
                uid: spec.owner_uid,
                gid: spec.owner_gid,
                groups: spec.owner_groups,
            },
        });
        {
            let mut map = self.shared.map_mut();
            // Checked again: another attach may have taken the name meanwhile.
            if map.values().any(|a| a.name == attach.name) {
                return Err(name_taken(&attach.name));
            }
            map.insert(id, attach);
        }
        self.shared.touch();
        Ok(id)
    }

    /// Removes attach `id` (`NotFound` if unknown). Its entry disappears at once and later
    /// requests on its nodes fail with EIO; the kernel is told to forget its cached names,
    /// attributes and pages. Its open files are closed now, its volume and keys go once the
    /// last request in flight is done with them.
    pub fn detach(&self, id: AttachId) -> io::Result<()> {
        let not_found = || io::Error::new(io::ErrorKind::NotFound, format!("no attach {id}"));
        // Pages that shared mappings wrote and nobody synced yet: the kernel writes them back
        // as it drops them, which needs the attach, and their writers were told the stores
        // succeeded.
        let nodes = self
            .shared
            .map()
            .get(&id)
            .ok_or_else(not_found)?
            .fs
            .inodes
            .node_ids();
        self.inval_nodes(&nodes);
        let attach = self.shared.map_mut().remove(&id).ok_or_else(not_found)?;
        self.shared.touch();
        let nodes = attach.fs.inodes.node_ids();
        attach.fs.shutdown();
        if let Err(e) = self
            .notifier
            .inval_entry(INodeNo(TREE_ROOT), OsStr::new(&attach.name))
        {
            tracing::debug!("invalidating the entry of detached attach {id}: {e}");
        }
        self.inval_nodes(&nodes);
        Ok(())
    }

    /// Drops the kernel's cached attributes and pages of every node of attach `id` that the
    /// kernel knows, so the next access to any of them is a request (and reaches the gate).
    pub fn invalidate(&self, id: AttachId) {
        let Some(attach) = self.shared.map().get(&id).cloned() else {
            return;
        };
        let nodes = attach.fs.inodes.node_ids();
        drop(attach);
        self.inval_nodes(&nodes);
    }

    /// The tree mount's device (major, minor): every file in the tree has it.
    pub fn device(&self) -> Option<(u32, u32)> {
        self.device
    }

    /// Detaches the tree from the file system name space (a lazy unmount): nothing new can
    /// reach it by path; what is open in it stays open, and the tree is served until the
    /// last of it is closed (or [`TreeHandle::abort`]).
    pub fn unmount(&self) {
        crate::sys::detach(&self.mountpoint);
    }

    /// Aborts the tree's FUSE connection: every request on it fails (ENOTCONN) from now on,
    /// and [`MountedTree::run`] returns. Needs root and the fuse control file system
    /// (`/sys/fs/fuse/connections`, mounted by systemd); `NotFound` without it.
    pub fn abort(&self) -> io::Result<()> {
        let (major, minor) = self.device.ok_or_else(|| {
            io::Error::new(io::ErrorKind::NotFound, "the tree's device is unknown")
        })?;
        crate::sys::abort_connection(major, minor)
    }

    /// The current attaches, in attach order.
    pub fn names(&self) -> Vec<(AttachId, String)> {
        self.shared
            .all()
            .iter()
            .map(|a| (a.id, a.name.clone()))
            .collect()
    }

    fn inval_nodes(&self, nodes: &[u64]) {
        for &n in nodes {
            // Offset 0, length 0: the attributes and every cached page.
            if let Err(e) = self.notifier.inval_inode(INodeNo(n), 0, 0) {
                tracing::debug!("invalidating node {n:#x}: {e}");
            }
        }
    }
}

fn name_taken(name: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::AlreadyExists,
        format!("an attach named {name:?} exists"),
    )
}

/// A mounted but not yet served tree. Dropping it without calling [`MountedTree::run`]
/// unmounts.
pub struct MountedTree {
    session: fuser::Session<crate::gate::Gated<crate::tree_ops::TreeGate>>,
    /// Where it is mounted.
    pub mountpoint: PathBuf,
}

impl std::fmt::Debug for MountedTree {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MountedTree")
            .field("mountpoint", &self.mountpoint)
            .finish_non_exhaustive()
    }
}

impl MountedTree {
    /// Serves requests until the tree is unmounted, then closes every attach's files (see
    /// [`crate::Mounted::run`]).
    pub fn run(self) -> io::Result<()> {
        crate::serve(
            self.session,
            crate::Transport::DevFuse("the multi-user tree does not use io_uring yet".into()),
            self.mountpoint,
        )
    }
}

/// Mounts an empty tree at `mountpoint`: every user may reach it (allow_other) and the kernel
/// checks no permission itself (no default_permissions), since `gate` and the backing file
/// system decide; without the writeback cache, since written pages would reach us from
/// kernel threads with the wrong caller. Of `opts`, the fsname, read_only, kernel options,
/// cache timeout (for nodes inside attaches) and threads (at least 16: gate calls may
/// sleep) are used. Starts no thread (see [`crate::mount`]). Needs root.
pub fn mount_tree(
    mountpoint: &Path,
    gate: Arc<dyn Gate>,
    opts: &MountOptions,
) -> io::Result<(MountedTree, TreeHandle)> {
    crate::sys::raise_nofile_limit();
    crate::creds::init();
    let shared = Arc::new(Shared::new(gate, opts.cache_timeout));
    let fs = crate::gate::Gated::new(crate::tree_ops::TreeGate::new(shared.clone()));
    // Resolved now: once mounted, looking at the mount point waits for the server.
    let canonical = std::fs::canonicalize(mountpoint).unwrap_or_else(|_| mountpoint.into());
    let session = crate::new_session(fs, mountpoint, &opts.tree_session_config())?;
    let notifier = session.notifier();
    let device = crate::sys::mount_device_numbers(&canonical);
    Ok((
        MountedTree {
            session,
            mountpoint: mountpoint.to_path_buf(),
        },
        TreeHandle {
            shared,
            notifier,
            mountpoint: canonical,
            device,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for bad in ["", ".", "..", "a/b", "a\0b", &"x".repeat(256)] {
            assert_eq!(
                valid_name(bad).unwrap_err().kind(),
                io::ErrorKind::InvalidInput,
                "{bad:?}"
            );
        }
        for good in ["alice", "...", ".x", &"x".repeat(255)] {
            valid_name(good).unwrap();
        }
    }

    #[test]
    fn node_numbers() {
        assert_eq!(attach_of_node(TREE_ROOT), 0);
        assert_eq!(attach_of_node((3 << LOCAL_BITS) | 1), 3);
        assert_eq!(
            attach_of_node((3 << LOCAL_BITS) | ((1 << LOCAL_BITS) - 1)),
            3
        );
    }
}
