//! The file system state and the helpers every request handler shares: node lookup, errors of
//! the core library, attributes, and access to a node's open plaintext file.

use crate::attr::{self, Meta};
use crate::dir::DirHandle;
use crate::dirids::DirIdCache;
use crate::durable::Syncer;
use crate::inode::{Inode, InodeTable, Kind};
use crate::prune::Pruner;
use crate::shared::Coherence;
use crate::sys::{self, errno, NodeFd, Res};
use cloakfs_core::format::content::ContentCodec;
use cloakfs_core::io::file::ContentFile;
use cloakfs_core::io::shared::Sharing;
use cloakfs_core::Volume;
use fuser::{AccessFlags, Errno, FileAttr, INodeNo, Notifier, Request};
use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::fs::{AtFlags, OFlags};
use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// The mounted plaintext view of one cipher directory.
pub(crate) struct CloakFs {
    pub(crate) volume: Volume,
    pub(crate) codec: Arc<ContentCodec>,
    pub(crate) inodes: InodeTable,
    pub(crate) dirs: Mutex<HashMap<u64, Arc<DirHandle>>>,
    next_fh: AtomicU64,
    /// Attribute and entry lifetime in the kernel's caches.
    pub(crate) ttl: Duration,
    pub(crate) read_only: bool,
    /// Largest plaintext size whose backing offsets still fit a signed 64-bit file offset.
    pub(crate) max_size: u64,
    /// Effective user of the daemon (root chowns new objects to their creator).
    euid: u32,
    /// In the multi-user tree, the attaching user (uid, gid): the root shows as theirs, and
    /// requests run with switched file-system credentials, so new objects need no chown and
    /// shared open files need an explicit access check.
    pub(crate) attach_owner: Option<(u32, u32)>,
    /// What the log has said once already (see `first_report`).
    warned: Mutex<HashSet<(u64, Vec<u8>)>>,
    /// Directory IDs of directories whose nodes the kernel may have forgotten.
    pub(crate) dir_ids: DirIdCache,
    /// Keeps the nodes (one descriptor each) below the descriptor limit.
    pub(crate) pruner: Pruner,
    /// Whether nodes may be held open for reading (a local backing file system).
    local_opens: bool,
    /// Makes new directory IDs durable off the request path.
    pub(crate) syncer: Syncer,
    /// Whether the kernel may take the writeback cache (see `ops::WriteCache`).
    pub(crate) writeback_cache: bool,
    /// Ask for FUSE over io_uring in the handshake if the kernel offers it.
    pub(crate) io_uring: bool,
    /// Whether users other than the mount's owner reach it (allow_other, or default_permissions
    /// asked for): only then is there a permission for the kernel to check against POSIX ACLs
    /// (the owner's own access is decided by the mode bits alone), and only then is that worth
    /// default_permissions' cost: the kernel fetches a directory's attributes again before the
    /// next create or unlink in it, after every change in it.
    pub(crate) admits_others: bool,
    /// Whether the kernel enforces POSIX ACLs (FUSE_POSIX_ACL, set at the handshake where
    /// `admits_others`).
    pub(crate) posix_acl: bool,
    /// Whether the kernel leaves the caller's umask to us (FUSE_DONT_MASK, set at the
    /// handshake where the backing file system keeps ACLs): new objects then get the parent's
    /// default ACL or the umask from the backing file system (see `sys::with_umask`).
    pub(crate) dont_mask: bool,
    /// Whether other machines share the cipher directory, and what that needs.
    pub(crate) coherence: Coherence,
    /// Open plaintext files of an adopted tree.
    pub(crate) plain: crate::plain::PlainFiles,
    /// Which directories' default recipients a sharing volume's new files get.
    pub(crate) defaults: cloakfs_core::tools::share::AllowedDefaults,
    /// Directories whose default recipients were reported as not applied (by node).
    pub(crate) defaults_noted: Mutex<HashSet<u64>>,
    /// The config on disk, which writes stop for when it changes under the mount.
    pub(crate) config_watch: crate::config_follow::ConfigWatch,
}

impl CloakFs {
    /// Registers one user of `inode`'s file (`Inode::acquire`) with this mount's codec,
    /// coherence and read-only state.
    pub(crate) fn acquire(
        &self,
        inode: &Inode,
        writable: bool,
    ) -> cloakfs_core::Result<Arc<ContentFile>> {
        inode.acquire(
            &self.codec,
            self.coherence.sharing,
            writable,
            self.read_only,
        )
    }

    /// Opens the cipher directory's root for serving `volume`. `notifier` is filled in once
    /// the session exists.
    pub(crate) fn new(
        volume: Volume,
        cipherdir: &Path,
        ttl: Duration,
        read_only: bool,
        notifier: Arc<OnceLock<Notifier>>,
    ) -> std::io::Result<Self> {
        let fd = rustix::fs::open(
            cipherdir,
            rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .map_err(|e| {
            std::io::Error::new(
                std::io::Error::from(e).kind(),
                format!("cipher directory {}: {e}", cipherdir.display()),
            )
        })?;
        Self::from_fd(volume, fd, ttl, read_only, 0, None, notifier)
    }

    /// Serves `volume` from the cipher directory behind (`O_PATH`) descriptor `fd`. `base`
    /// and `attach_owner` are 0 and None for a mount of its own, else the attach's node
    /// number base and owner in the multi-user tree.
    pub(crate) fn from_fd(
        volume: Volume,
        fd: OwnedFd,
        ttl: Duration,
        read_only: bool,
        base: u64,
        attach_owner: Option<(u32, u32)>,
        notifier: Arc<OnceLock<Notifier>>,
    ) -> std::io::Result<Self> {
        let meta = Meta::of_fd(&fd)?;
        if meta.kind() != Some(fuser::FileType::Directory) {
            return Err(std::io::Error::from_raw_os_error(libc::ENOTDIR));
        }
        let local_opens = sys::opens_are_local(fd.as_fd());
        let inodes = InodeTable::new(NodeFd::path(fd), &meta, volume.root_dir_id(), base);
        let layout = volume.content().layout();
        let params = volume.config().params.clone();
        let volume_config = volume.config().clone();
        let max_size = (i64::MAX as u64 - cloakfs_core::format::layout::HEADER_LEN)
            / layout.cipher_block_size()
            * layout.block_size();
        let defaults = cloakfs_core::tools::share::AllowedDefaults::for_volume(&volume);
        Ok(Self {
            max_size,
            codec: volume.content().clone(),
            volume,
            inodes,
            dirs: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            ttl,
            read_only,
            euid: rustix::process::geteuid().as_raw(),
            attach_owner,
            warned: Mutex::new(HashSet::new()),
            dir_ids: DirIdCache::default(),
            coherence: Coherence::new(Sharing::Alone, notifier.clone()),
            pruner: Pruner::for_fd_limit(notifier),
            local_opens,
            syncer: Syncer::new(),
            writeback_cache: false,
            io_uring: false,
            admits_others: false,
            posix_acl: false,
            dont_mask: false,
            plain: crate::plain::PlainFiles::new(&params, false),
            defaults,
            defaults_noted: Mutex::new(HashSet::new()),
            config_watch: crate::config_follow::ConfigWatch::new(volume_config),
        })
    }

    /// The same file system, serving the plaintext entries of a converted adopted tree if
    /// `accept` (the user's `--accept-plaintext`).
    pub(crate) fn accept_plaintext(mut self, accept: bool) -> Self {
        self.plain = crate::plain::PlainFiles::new(&self.volume.config().params, accept);
        self
    }

    /// The same file system, its cipher directory shared with other machines as `sharing`
    /// says.
    pub(crate) fn sharing(mut self, sharing: Sharing) -> Self {
        self.coherence = Coherence::new(sharing, self.coherence.notifier());
        self
    }

    /// The node `nodeid`; ESTALE if the kernel should not know it.
    pub(crate) fn node(&self, nodeid: fuser::INodeNo) -> Res<Arc<Inode>> {
        self.inodes.get(nodeid.0).ok_or(Errno::ESTALE)
    }

    /// Refuses a change on a read-only mount, and on one whose config changed under it in a
    /// way it cannot follow (see `config_follow`).
    pub(crate) fn writable(&self) -> Res<()> {
        if self.read_only {
            return Err(Errno::EROFS);
        }
        self.follow_config()
    }

    /// Refuses a plaintext size the backing file could not represent.
    pub(crate) fn check_size(&self, offset: u64, len: u64) -> Res<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.max_size => Ok(()),
            _ => Err(Errno::EFBIG),
        }
    }

    /// A fresh handle number.
    pub(crate) fn new_fh(&self) -> u64 {
        self.next_fh.fetch_add(1, Ordering::Relaxed)
    }

    /// The errno for a core-library error about backing object `fd`. Failed authentication
    /// and unknown format versions are logged once here, naming the backing file (and, in the
    /// message, the block); plain I/O errors are only passed on.
    pub(crate) fn fail(
        &self,
        e: &cloakfs_core::Error,
        fd: BorrowedFd<'_>,
        what: Option<&str>,
    ) -> Errno {
        use cloakfs_core::Error as E;
        match e {
            E::Io(_) | E::InvalidName | E::NameTooLong => {}
            _ => {
                let what = what.map(|w| format!(" ({w})")).unwrap_or_default();
                tracing::error!("{}{what}: {e}", sys::describe(fd));
            }
        }
        Errno::from_i32(e.errno())
    }

    /// Whether this daemon runs as root for a caller who is not (allow_other): then the
    /// backing file system sees root's privileges, not the caller's.
    pub(crate) fn serves_other_user(&self, req: &Request) -> bool {
        self.euid == 0 && req.uid() != 0
    }

    /// Who owns an object that request `req` creates, when that must be set explicitly: a
    /// root daemon serving another user (allow_other) gives new objects to the caller. The
    /// group is left alone under a set-group-ID parent, whose group new objects inherit.
    /// In the tree, requests already run as the right user.
    pub(crate) fn new_owner(&self, req: &Request, parent: &Inode) -> Option<(u32, Option<u32>)> {
        if !self.serves_other_user(req) || self.attach_owner.is_some() {
            return None;
        }
        let sgid = rustix::fs::fstat(parent.fd())
            .map(|st| Meta::from_stat(&st).mode & libc::S_ISGID != 0)
            .unwrap_or(false);
        Some((req.uid(), if sgid { None } else { Some(req.gid()) }))
    }

    /// Plaintext length of a symlink target (the stored length if it fails to decrypt, so a
    /// damaged link can still be listed and removed; readlink reports the damage).
    fn symlink_len(&self, fd: BorrowedFd<'_>) -> u64 {
        let Ok(root) = self.node(INodeNo(self.inodes.root())) else {
            return 0;
        };
        match rustix::fs::readlinkat(fd, "", Vec::new()) {
            Ok(stored) => match cloakfs_core::io::long_targets::read_target(
                self.volume.meta(),
                root.fd(),
                stored.as_bytes(),
            ) {
                Ok(t) => t.len() as u64,
                Err(_) => stored.as_bytes().len() as u64,
            },
            Err(_) => 0,
        }
    }

    /// The attributes of `inode`, whose backing object is described by `m`.
    pub(crate) fn attr_of(&self, inode: &Inode, m: &Meta) -> FileAttr {
        let size = match inode.kind {
            Kind::File if inode.is_plain() => m.size,
            Kind::File => match inode.current() {
                Some(f) => f.size(),
                None => self.codec.layout().plain_size_lenient(m.size),
            },
            Kind::Symlink if inode.is_plain() => m.size,
            Kind::Symlink => *inode
                .symlink_len
                .get_or_init(|| self.symlink_len(inode.fd())),
            Kind::Dir => m.size,
            Kind::Special => 0,
        };
        let mut a = attr::file_attr(inode.nodeid, m, size);
        if let Some((uid, gid)) = self.attach_owner {
            if inode.nodeid == self.inodes.root() {
                // What the tree shows of an attach: its owner's private directory.
                a.uid = uid;
                a.gid = gid;
                a.perm = 0o700;
            }
        }
        a
    }

    /// How long the kernel may cache the attributes of `ino`: not at all for an attach root
    /// in the tree, so every stat of it reaches the gate.
    pub(crate) fn attr_ttl(&self, ino: INodeNo) -> Duration {
        if self.attach_owner.is_some() && ino.0 == self.inodes.root() {
            Duration::ZERO
        } else {
            self.ttl
        }
    }

    /// In the tree, checks `access` on `inode`'s backing object with the thread's current
    /// (switched) file-system credentials. Needed where no backing open happens that the
    /// kernel would check, e.g. when an already open shared file is reused.
    pub(crate) fn check_access(&self, inode: &Inode, access: rustix::fs::Access) -> Res<()> {
        if self.attach_owner.is_none() || access.is_empty() {
            return Ok(());
        }
        sys::eaccess(inode.fd(), access).map_err(errno)
    }

    /// Fresh attributes of `inode`.
    pub(crate) fn stat(&self, inode: &Inode) -> Res<FileAttr> {
        // An object the store no longer has keeps what the kernel cached until it is closed.
        let m = match self.fresh_meta(inode.fd()) {
            Err(rustix::io::Errno::STALE) => Meta::of_fd(inode.fd()),
            r => r,
        };
        Ok(self.attr_of(inode, &m.map_err(errno)?))
    }

    /// Attributes of `inode` for a GETATTR, and how long the kernel may keep them. Right after
    /// an open fetched them from the shared store (close-to-open), the store's client still
    /// has them: served from there, to be kept only for what is left of the cache timeout, so
    /// they are never older than it.
    pub(crate) fn attr_for_kernel(&self, inode: &Inode) -> Res<(FileAttr, Duration)> {
        let ttl = self.attr_ttl(INodeNo(inode.nodeid));
        if let Some(age) = inode.refreshed_within(ttl) {
            let m = Meta::of_fd(inode.fd()).map_err(errno)?;
            return Ok((self.attr_of(inode, &m), ttl - age));
        }
        Ok((self.stat(inode)?, ttl))
    }

    /// The attributes of `fd`'s object, from the store itself when shared (see `force_stat`):
    /// ESTALE if the store no longer has the object; a store that cannot answer leaves what
    /// the kernel has cached.
    fn fresh_meta(&self, fd: BorrowedFd<'_>) -> rustix::io::Result<Meta> {
        if self.coherence.sharing.is_shared() {
            match cloakfs_core::io::shared::force_stat(fd) {
                Ok(st) => return Ok(Meta::from_statx(&st)),
                Err(rustix::io::Errno::STALE) => return Err(rustix::io::Errno::STALE),
                Err(_) => {}
            }
        }
        Meta::of_fd(fd)
    }

    /// Looks up backing entry `backing` of `parent`, plaintext `name`, for the kernel
    /// (counting one reference). `kind` is the listing's file type, if known.
    pub(crate) fn lookup_backing(
        &self,
        parent: &Inode,
        backing: &str,
        name: &OsStr,
        kind: Option<fuser::FileType>,
    ) -> Res<(Arc<Inode>, FileAttr)> {
        let open = || sys::open_node(parent.fd(), backing, kind, self.local_opens).map_err(errno);
        let mut fd = open()?;
        let mut meta = self.fresh_meta(fd.fd());
        if meta.as_ref().err() == Some(&rustix::io::Errno::STALE) {
            // The store's client resolved the name from its own cache to an object another
            // client has removed or replaced since (GlusterFS keeps names for a second, and an
            // O_PATH open never asks the store). A stat by name that must ask the store gets
            // ESTALE, which the kernel answers by looking the name up again at the store
            // (LOOKUP_REVAL): the name is then current, gone or the other client's new file.
            self.coherence.forget_stale_name(parent.fd(), backing);
            fd = open()?;
            meta = self.fresh_meta(fd.fd());
        }
        self.lookup_stated(fd, &meta.map_err(errno)?, parent, name)
    }

    /// The node hold for `dir`, a directory just made and open for reading: itself on a local
    /// file system, else an `O_PATH` handle.
    pub(crate) fn hold_dir(&self, dir: OwnedFd) -> Res<NodeFd> {
        if self.local_opens {
            return Ok(NodeFd::readable(dir));
        }
        sys::reopen(dir.as_fd(), OFlags::PATH | OFlags::DIRECTORY)
            .map(NodeFd::path)
            .map_err(errno)
    }

    /// The node hold for `fd`, just created as `backing` in `parent` and open read-write
    /// (which a node must not keep: that would refuse exec with ETXTBSY), with the object's
    /// attributes: the same object opened again by name (readable on a local file system),
    /// else an `O_PATH` handle through `/proc`.
    pub(crate) fn hold_created(
        &self,
        parent: &Inode,
        backing: &str,
        fd: BorrowedFd<'_>,
    ) -> Res<(NodeFd, Meta)> {
        let m = Meta::of_fd(fd).map_err(errno)?;
        if self.local_opens {
            let kind = Some(fuser::FileType::RegularFile);
            if let Ok(again) = sys::open_node(parent.fd(), backing, kind, true) {
                // The same object, unless the name was replaced meanwhile.
                if rustix::fs::fstat(again.fd())
                    .is_ok_and(|st| (st.st_dev, st.st_ino) == (m.dev, m.ino))
                {
                    return Ok((again, m));
                }
            }
        }
        let held = sys::reopen(fd, OFlags::PATH).map_err(errno)?;
        Ok((NodeFd::path(held), m))
    }

    /// Counts one kernel reference to the object behind `fd`, known to the kernel as `name`
    /// in `parent`.
    pub(crate) fn lookup_fd(
        &self,
        fd: NodeFd,
        parent: &Inode,
        name: &OsStr,
    ) -> Res<(Arc<Inode>, FileAttr)> {
        let m = Meta::of_fd(fd.fd()).map_err(errno)?;
        self.lookup_stated(fd, &m, parent, name)
    }

    /// [`CloakFs::lookup_fd`] for an object whose attributes `m` were just read.
    pub(crate) fn lookup_stated(
        &self,
        fd: NodeFd,
        m: &Meta,
        parent: &Inode,
        name: &OsStr,
    ) -> Res<(Arc<Inode>, FileAttr)> {
        let fd = match (fd.for_xattrs(), Kind::of_mode(m.mode)) {
            // Not what the listing said (replaced since): held open it might be a device.
            (Some(open), Kind::Symlink | Kind::Special) => {
                NodeFd::path(sys::reopen(open, OFlags::PATH).map_err(errno)?)
            }
            _ => fd,
        };
        let (inode, live) = self.inodes.lookup(fd, m, parent.nodeid, name.as_bytes());
        if let Some(n) = live.and_then(|live| self.pruner.due(live, self.inodes.clock())) {
            self.pruner.send(self.inodes.least_used(n));
        }
        let attr = self.attr_of(&inode, m);
        Ok((inode, attr))
    }

    /// Runs `f` on the open plaintext file of `inode`, opening it for the duration if no
    /// handle has it open (e.g. truncate by path).
    pub(crate) fn with_file<T>(
        &self,
        inode: &Inode,
        writable: bool,
        f: impl FnOnce(&ContentFile) -> cloakfs_core::Result<T>,
    ) -> Res<T> {
        if inode.kind != Kind::File {
            return Err(if inode.kind == Kind::Dir {
                Errno::EISDIR
            } else {
                Errno::EINVAL
            });
        }
        let (file, temporary) = match inode.current() {
            Some(file) => (file, false),
            None => (
                self.acquire(inode, writable)
                    .map_err(|e| self.fail(&e, inode.fd(), None))?,
                true,
            ),
        };
        let r = f(&file).map_err(|e| self.fail(&e, file.backing().as_fd(), None));
        drop(file);
        if temporary {
            inode.release();
        }
        r
    }

    /// Closes every backing file and directory (at unmount). Every write already reached
    /// the backing files (writes are synchronous), so nothing else is pending; making it
    /// durable (syncfs) is left to the caller.
    pub(crate) fn shutdown(&self) {
        self.syncer.stop();
        tracing::debug!("directory ID files read: {}", self.dir_ids.reads());
        tracing::debug!("looks at the config: {}", self.config_watch.checks());
        self.dirs.lock().unwrap_or_else(|e| e.into_inner()).clear();
        drop(self.inodes.drain());
    }
}

impl CloakFs {
    pub(crate) fn do_statfs(&self) -> Res<(u64, u64, u64, u64, u64, u32, u32)> {
        let root = self.node(INodeNo(self.inodes.root()))?;
        let st = rustix::fs::fstatfs(root.fd()).map_err(errno)?;
        let bsize = u32::try_from(st.f_bsize).unwrap_or(4096);
        let frsize = u32::try_from(st.f_frsize).unwrap_or(bsize);
        Ok((
            st.f_blocks,
            st.f_bfree,
            st.f_bavail,
            st.f_files,
            st.f_ffree,
            bsize,
            frsize,
        ))
    }

    /// The umask a create request's caller asked for, if the backing create is to apply it
    /// (the kernel has not: see `dont_mask`); else 0.
    pub(crate) fn creation_umask(&self, umask: u32) -> u32 {
        if self.dont_mask {
            umask & 0o777
        } else {
            0
        }
    }

    /// Whether this is the first report of `what` about node `node` (a backing entry that does
    /// not decrypt, a directory without its ID file, a conflict copy...): the log says each
    /// once per mount, however often the kernel asks.
    pub(crate) fn first_report(&self, node: u64, what: &[u8]) -> bool {
        self.warned
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert((node, what.to_vec()))
    }

    /// Whether the backing file system keeps POSIX ACLs (ext4, xfs, btrfs, tmpfs: yes; vfat,
    /// most network file systems: no).
    pub(crate) fn backing_keeps_acls(&self) -> bool {
        let Ok(root) = self.node(INodeNo(self.inodes.root())) else {
            return false;
        };
        let path = sys::proc_path(root.fd());
        !matches!(
            rustix::fs::getxattr_query(path.as_str(), "system.posix_acl_access"),
            Err(rustix::io::Errno::NOTSUP)
        )
    }

    pub(crate) fn do_access(&self, ino: INodeNo, mask: AccessFlags) -> Res<()> {
        let inode = self.node(ino)?;
        if mask.contains(AccessFlags::W_OK) {
            self.writable()?;
        }
        if mask == AccessFlags::F_OK || inode.kind == Kind::Symlink {
            return Ok(());
        }
        let access = rustix::fs::Access::from_bits_retain(mask.bits() as u32);
        if self.attach_owner.is_some() {
            // As the switched file-system ids, not the real ones (root).
            return sys::eaccess(inode.fd(), access).map_err(errno);
        }
        rustix::fs::accessat(
            rustix::fs::CWD,
            sys::proc_path(inode.fd()),
            access,
            AtFlags::empty(),
        )
        .map_err(errno)
    }
}
