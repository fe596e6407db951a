//! The multi-user tree's gate (see `gate`) and the handlers of its virtual root directory:
//! every request on a node inside an attach is routed to that attach's file system, after the
//! daemon's gate admitted it and with the credentials it runs as; what the daemon's gate
//! answers lives in the daemon, not here.

use crate::creds::{CredGuard, Creds};
use crate::file::{open_access, FMODE_EXEC};
use crate::gate::{Op, RequestGate};
use crate::tree::{attach_of_node, Access, Attach, Caller, Need, Shared, Verdict, TREE_ROOT};
use fuser::{
    AccessFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation,
    INodeNo, KernelConfig, LockOwner, OpenFlags, ReplyAttr, ReplyDirectory, ReplyDirectoryPlus,
    ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyXattr, Request, WriteFlags,
};
use std::ffi::OsStr;
use std::sync::Arc;
use std::time::Duration;

const fn need(access: Access, on_open_handle: bool) -> Need {
    Need {
        access,
        on_open_handle,
    }
}

const LOOK: Need = need(Access::Look, false);
const READ: Need = need(Access::Read, false);
const WRITE: Need = need(Access::Write, false);

/// What opening with `flags` needs: exec for execve, write for any writing or truncating
/// open, else read.
fn open_need(flags: i32) -> Need {
    let a = open_access(flags);
    let access = if flags & FMODE_EXEC != 0 {
        Access::Exec
    } else if a.contains(rustix::fs::Access::WRITE_OK) {
        Access::Write
    } else {
        Access::Read
    };
    need(access, false)
}

/// What access(2) with `mask` needs: one need per bit asked (F_OK alone: look). Searching a
/// directory (X_OK on it, as chdir asks) is looking, not executing.
fn access_needs(mask: AccessFlags, dir: bool) -> Vec<Need> {
    let mut v = Vec::new();
    if mask.contains(AccessFlags::R_OK) {
        v.push(READ);
    }
    if mask.contains(AccessFlags::W_OK) {
        v.push(WRITE);
    }
    if mask.contains(AccessFlags::X_OK) {
        v.push(if dir { LOOK } else { need(Access::Exec, false) });
    }
    if v.is_empty() {
        v.push(LOOK);
    }
    v
}

/// The gate of the multi-user tree: routes every request by its node number, to the attach
/// that owns the node (after the daemon's [`crate::tree::Gate`] admitted it, with the
/// credentials it runs as) or to the tree root's own handlers.
///
/// Unchecked: forgetting nodes and releasing or flushing handles (the kernel finishing with
/// what was admitted; they reveal nothing), and the kernel's writeback of a shared mapping's
/// pages (admitted for writing at open); the tree root itself, root's read-only directory,
/// which every user may list.
pub(crate) struct TreeGate {
    shared: Arc<Shared>,
    root: TreeRoot,
}

impl TreeGate {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        Self {
            root: TreeRoot {
                shared: shared.clone(),
            },
            shared,
        }
    }

    /// Asks the daemon's gate about every need of `req` on attach `a`; on admission switches
    /// this thread to the credentials the request runs as (the owner's only if every answer
    /// says bypass).
    fn check(&self, a: &Attach, req: &Request, needs: &[Need]) -> Result<CredGuard, Errno> {
        let caller = Caller {
            uid: req.uid(),
            gid: req.gid(),
            pid: req.pid(),
        };
        let mut bypass = true;
        for &n in needs {
            match self.shared.gate.check(a.id, &caller, n) {
                Verdict::Deny => return Err(Errno::EACCES),
                Verdict::Allow { bypass: b } => bypass &= b,
            }
        }
        let switched = if bypass {
            CredGuard::switch(&a.owner)
        } else {
            CredGuard::switch(&Creds::of_caller(caller.uid, caller.gid, caller.pid))
        };
        switched.map_err(|e| {
            tracing::error!("attach {}: cannot switch credentials: {e}", a.name);
            Errno::EACCES
        })
    }

    /// The tree root's handlers, running as the daemon.
    fn root(&self) -> TreePass<'_> {
        TreePass {
            _creds: None,
            handlers: TreeHandlers::Root(&self.root),
        }
    }

    /// Attach `a`'s handlers, running as `creds` (None: as the daemon).
    fn attach(&self, a: Arc<Attach>, creds: Option<CredGuard>) -> TreePass<'_> {
        TreePass {
            _creds: creds,
            handlers: TreeHandlers::Attach(a),
        }
    }

    /// The handlers of node `ino` for what the kernel sends to finish with it (no attach: the
    /// root's node or handle, or one of a detached attach, with nothing left to do).
    fn unchecked(&self, ino: INodeNo) -> TreePass<'_> {
        match self.shared.attach(ino) {
            Some(a) => self.attach(a, None),
            None => self.root(),
        }
    }

    /// A lookup in the tree root: attach `name`'s entry, if the caller may look at it.
    fn attach_entry(&self, req: &Request, name: &OsStr) -> Result<TreePass<'_>, Errno> {
        let a = self.shared.by_name(name).ok_or(Errno::ENOENT)?;
        let creds = match self.check(&a, req, &[LOOK]) {
            Ok(c) => c,
            // A hidden attach does not show itself to those who may not use it.
            Err(e) if e == Errno::EACCES && a.hidden => return Err(Errno::ENOENT),
            Err(e) => return Err(e),
        };
        Ok(TreePass {
            _creds: Some(creds),
            handlers: TreeHandlers::AttachEntry(AttachEntry(a)),
        })
    }

    /// A write from the page cache (a shared mapping): the kernel's writeback, which carries
    /// no caller (uid 0, pid 0), of data the writer was told was written long ago. It comes on
    /// a handle the gate admitted for writing at open; refusing it now would lose acknowledged
    /// data. Run as the owner (quota, reserved blocks).
    fn writeback(&self, ino: INodeNo) -> Result<TreePass<'_>, Errno> {
        let a = self.shared.attach(ino).ok_or(Errno::EIO)?;
        let creds = CredGuard::switch(&a.owner).map_err(|e| {
            tracing::error!("attach {}: cannot switch credentials: {e}", a.name);
            Errno::EIO
        })?;
        Ok(self.attach(a, Some(creds)))
    }

    /// access(2): the needs depend on the node's kind.
    fn access(
        &self,
        req: &Request,
        ino: INodeNo,
        mask: AccessFlags,
    ) -> Result<TreePass<'_>, Errno> {
        if ino.0 == TREE_ROOT {
            return Ok(self.root());
        }
        let a = self.shared.attach(ino).ok_or(Errno::EIO)?;
        let dir =
            a.fs.node(ino)
                .is_ok_and(|n| n.kind == crate::inode::Kind::Dir);
        let creds = self.check(&a, req, &access_needs(mask, dir))?;
        Ok(self.attach(a, Some(creds)))
    }
}

/// Refuses a request on two nodes unless both are in one attach: EACCES at the tree root,
/// EXDEV across attaches.
fn within_one_attach(a: INodeNo, b: INodeNo) -> Result<(), Errno> {
    if a.0 == TREE_ROOT || b.0 == TREE_ROOT {
        return Err(Errno::EACCES);
    }
    if attach_of_node(a.0) != attach_of_node(b.0) {
        return Err(Errno::EXDEV);
    }
    Ok(())
}

/// What the tree root, root's read-only directory, answers to a request that would change it
/// or use it as a file (None: its handlers serve the request).
fn root_refusal(op: Op<'_>) -> Option<Errno> {
    match op {
        Op::Setattr { .. }
        | Op::Mknod { .. }
        | Op::Mkdir { .. }
        | Op::Unlink { .. }
        | Op::Rmdir { .. }
        | Op::Symlink { .. }
        | Op::Create { .. }
        | Op::Setxattr { .. }
        | Op::Removexattr { .. } => Some(Errno::EACCES),
        Op::Readlink { .. } => Some(Errno::EINVAL),
        Op::Open { .. }
        | Op::Read { .. }
        | Op::Write { .. }
        | Op::Fsync { .. }
        | Op::Fallocate { .. } => Some(Errno::EISDIR),
        Op::Getxattr { .. } => Some(Errno::from_i32(libc::ENODATA)),
        _ => None,
    }
}

impl RequestGate for TreeGate {
    type Handlers = dyn Filesystem;
    type Pass<'a> = TreePass<'a>;

    fn whole_mount(&mut self) -> &mut dyn Filesystem {
        &mut self.root
    }

    fn admit<'a>(&'a self, req: &Request, op: Op<'_>) -> Result<TreePass<'a>, Errno> {
        let (ino, need) = match op {
            // Nothing to decrypt or change: answered like the single mount answers ioctls
            // other than its own.
            Op::Ioctl => return Err(Errno::ENOTTY),
            // Not served in the tree, as before the gate: locks stay in the kernel (the
            // handshake asks for no lock requests), and the kernel falls back for the others.
            Op::Getlk | Op::Setlk | Op::Bmap | Op::Poll | Op::Lseek | Op::CopyFileRange => {
                return Err(Errno::ENOSYS)
            }
            Op::Forget { ino }
            | Op::Flush { ino }
            | Op::Release { ino }
            | Op::Releasedir { ino } => return Ok(self.unchecked(ino)),
            Op::Lookup { parent, name } if parent.0 == TREE_ROOT => {
                return self.attach_entry(req, name)
            }
            Op::Write { ino, flags }
                if ino.0 != TREE_ROOT && flags.contains(WriteFlags::FUSE_WRITE_CACHE) =>
            {
                return self.writeback(ino)
            }
            Op::Access { ino, mask } => return self.access(req, ino, mask),
            Op::Rename { parent, newparent } => {
                within_one_attach(parent, newparent)?;
                (parent, WRITE)
            }
            Op::Link { ino, newparent } => {
                within_one_attach(ino, newparent)?;
                (newparent, WRITE)
            }
            Op::Lookup { parent: ino, .. } | Op::Statfs { ino } => (ino, LOOK),
            Op::Getattr { ino, on_handle } => (ino, need(Access::Look, on_handle)),
            Op::Setattr { ino, on_handle } => (ino, need(Access::Write, on_handle)),
            Op::Readlink { ino }
            | Op::Opendir { ino }
            | Op::Getxattr { ino }
            | Op::Listxattr { ino } => (ino, READ),
            Op::Mknod { parent: ino }
            | Op::Mkdir { parent: ino }
            | Op::Unlink { parent: ino }
            | Op::Rmdir { parent: ino }
            | Op::Symlink { parent: ino }
            | Op::Create { parent: ino }
            | Op::Setxattr { ino }
            | Op::Removexattr { ino } => (ino, WRITE),
            Op::Open { ino, flags } => (ino, open_need(flags.0)),
            Op::Read { ino } | Op::Readdir { ino } | Op::Readdirplus { ino } => {
                (ino, need(Access::Read, true))
            }
            Op::Write { ino, .. } | Op::Fallocate { ino } => (ino, need(Access::Write, true)),
            Op::Fsync { ino } | Op::Fsyncdir { ino } => (ino, need(Access::Look, true)),
        };
        if ino.0 == TREE_ROOT {
            return root_refusal(op).map_or_else(|| Ok(self.root()), Err);
        }
        let a = self.shared.attach(ino).ok_or(Errno::EIO)?;
        let creds = self.check(&a, req, &[need])?;
        Ok(self.attach(a, Some(creds)))
    }
}

/// An admitted request's handlers, and the credentials it runs as until it is done.
pub(crate) struct TreePass<'a> {
    /// Switched back on drop (None: the daemon's own).
    _creds: Option<CredGuard>,
    handlers: TreeHandlers<'a>,
}

enum TreeHandlers<'a> {
    Root(&'a TreeRoot),
    Attach(Arc<Attach>),
    AttachEntry(AttachEntry),
}

impl std::ops::Deref for TreePass<'_> {
    type Target = dyn Filesystem;

    fn deref(&self) -> &(dyn Filesystem + 'static) {
        match &self.handlers {
            TreeHandlers::Root(root) => *root,
            TreeHandlers::Attach(a) => &a.fs,
            TreeHandlers::AttachEntry(entry) => entry,
        }
    }
}

/// The tree root's entry of one attach: what a lookup of its name in the root answers.
struct AttachEntry(Arc<Attach>);

impl Filesystem for AttachEntry {
    fn lookup(&self, _req: &Request, _parent: INodeNo, _name: &OsStr, reply: ReplyEntry) {
        let a = &self.0;
        let root = INodeNo(a.fs.inodes.root());
        match a.fs.node(root).and_then(|i| a.fs.stat(&i)) {
            // Not cached: every path walk through the attach asks the gate again.
            Ok(attr) => reply.entry(&Duration::ZERO, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }
}

/// The handlers of the tree as a whole (handshake, end) and of the nodes no attach serves:
/// the tree root, and what the kernel still sends on nodes and handles of detached attaches.
struct TreeRoot {
    shared: Arc<Shared>,
}

impl TreeRoot {
    /// Attributes of the tree root: root's read-only directory.
    fn root_attr(&self) -> FileAttr {
        let t = *self
            .shared
            .changed
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        FileAttr {
            ino: INodeNo(TREE_ROOT),
            size: 0,
            blocks: 0,
            atime: t,
            mtime: t,
            ctime: t,
            crtime: t,
            kind: FileType::Directory,
            perm: 0o555,
            nlink: 2,
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        }
    }

    /// The tree root's listing from `offset`: (node, offset of the next entry, kind, name).
    /// Attaches are listed in attach order with offset `id + 2`, so offsets stay valid while
    /// attaches come and go.
    fn root_entries(&self, offset: u64) -> Vec<(u64, u64, String)> {
        let mut v = vec![
            (TREE_ROOT, 1, ".".to_string()),
            (TREE_ROOT, 2, "..".to_string()),
        ];
        for a in self.shared.all() {
            if !a.hidden {
                v.push((a.fs.inodes.root(), a.id + 2, a.name.clone()));
            }
        }
        v.retain(|e| e.1 > offset);
        v
    }
}

impl Filesystem for TreeRoot {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        crate::ops::negotiate(
            config,
            crate::ops::WriteCache::WriteThroughMtime,
            false,
            fuser::InitFlags::empty(),
        );
        Ok(())
    }

    fn destroy(&mut self) {
        self.shared.shutdown();
    }

    fn getattr(&self, _req: &Request, _ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        reply.attr(&Duration::ZERO, &self.root_attr());
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn opendir(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        // Not cached: the listing changes with every attach and detach.
        reply.opened(FileHandle(0), FopenFlags::empty());
    }

    fn readdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        for (node, next, name) in self.root_entries(offset) {
            if reply.add(INodeNo(node), next, FileType::Directory, name) {
                break;
            }
        }
        reply.ok();
    }

    fn readdirplus(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        for (node, next, name) in self.root_entries(offset) {
            // Neutral attributes, never cached: an attach's real ones are only for those the
            // gate lets look (the kernel needs a node number, or the entry would be skipped
            // as deleted).
            let mut attr = self.root_attr();
            attr.ino = INodeNo(node);
            attr.perm = if node == TREE_ROOT { 0o555 } else { 0o700 };
            let full = reply.add(
                INodeNo(node),
                next,
                name,
                &Duration::ZERO,
                &attr,
                Generation(0),
            );
            if full {
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let name_max = cloakfs_core::format::names::NAME_MAX as u32;
        reply.statfs(0, 0, 0, 0, 0, 4096, name_max, 4096);
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, size: u32, reply: ReplyXattr) {
        crate::xattr::reply_xattr(reply, size, Ok(Vec::new()));
    }

    fn access(&self, _req: &Request, _ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        // dr-xr-xr-x for everyone, root included.
        if mask.contains(AccessFlags::W_OK) {
            reply.error(Errno::EACCES)
        } else {
            reply.ok()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn needs() {
        assert_eq!(open_need(libc::O_RDONLY).access, Access::Read);
        assert_eq!(open_need(libc::O_WRONLY).access, Access::Write);
        assert_eq!(open_need(libc::O_RDWR).access, Access::Write);
        assert_eq!(
            open_need(libc::O_RDONLY | libc::O_TRUNC).access,
            Access::Write
        );
        assert_eq!(open_need(libc::O_RDONLY | FMODE_EXEC).access, Access::Exec);
        assert!(!open_need(libc::O_RDONLY).on_open_handle);
        assert_eq!(access_needs(AccessFlags::F_OK, false), vec![LOOK]);
        assert_eq!(access_needs(AccessFlags::X_OK, true), vec![LOOK]);
        assert_eq!(
            access_needs(AccessFlags::R_OK | AccessFlags::X_OK, false),
            vec![READ, need(Access::Exec, false)]
        );
    }
}
