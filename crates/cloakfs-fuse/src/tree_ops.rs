//! The FUSE request handlers of the multi-user tree: the virtual root directory, and the
//! routing of every other request to the attach owning its node, after the gate admitted it
//! and with the credentials it runs as. No permission logic lives here.

use crate::creds::{CredGuard, Creds};
use crate::file::{open_access, FMODE_EXEC};
use crate::tree::{attach_of_node, Access, Attach, Caller, Need, Shared, Verdict, TREE_ROOT};
use fuser::{
    AccessFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation,
    INodeNo, IoctlFlags, KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate,
    ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyOpen,
    ReplyStatfs, ReplyWrite, ReplyXattr, Request, SetXAttrFlags, TimeOrNow, WriteFlags,
};
use std::ffi::OsStr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

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

/// Gets a routed request's attach and credentials, or replies with the error and returns.
macro_rules! route {
    ($self:ident, $req:expr, $ino:expr, $needs:expr, $reply:ident) => {
        match $self.route($req, $ino, $needs) {
            Ok(routed) => routed,
            Err(e) => return $reply.error(e),
        }
    };
}

/// Replies with `$err` and returns if `$ino` is the tree root.
macro_rules! not_root {
    ($ino:expr, $err:expr, $reply:ident) => {
        if $ino.0 == TREE_ROOT {
            return $reply.error($err);
        }
    };
}

/// The `fuser::Filesystem` of the tree.
pub(crate) struct TreeFs {
    shared: Arc<Shared>,
}

impl TreeFs {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        Self { shared }
    }

    /// Asks the gate about every need of `req` on attach `a`; on admission switches this
    /// thread to the credentials the request runs as (the owner's only if every answer
    /// says bypass).
    fn admit(&self, a: &Attach, req: &Request, needs: &[Need]) -> Result<CredGuard, Errno> {
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

    /// The attach of node `ino`, admitted for `needs` and running as the right user. EIO
    /// for a node of a detached attach.
    fn route(
        &self,
        req: &Request,
        ino: INodeNo,
        needs: &[Need],
    ) -> Result<(Arc<Attach>, CredGuard), Errno> {
        let a = self.shared.attach(ino).ok_or(Errno::EIO)?;
        let creds = self.admit(&a, req, needs)?;
        Ok((a, creds))
    }

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

    fn root_lookup(&self, req: &Request, name: &OsStr, reply: ReplyEntry) {
        let Some(a) = self.shared.by_name(name) else {
            return reply.error(Errno::ENOENT);
        };
        let _creds = match self.admit(&a, req, &[LOOK]) {
            Ok(c) => c,
            // A hidden attach does not show itself to those who may not use it.
            Err(e) if e == Errno::EACCES && a.hidden => return reply.error(Errno::ENOENT),
            Err(e) => return reply.error(e),
        };
        let root = INodeNo(a.fs.inodes.root());
        match a.fs.node(root).and_then(|i| a.fs.stat(&i)) {
            // Not cached: every path walk through the attach asks the gate again.
            Ok(attr) => reply.entry(&Duration::ZERO, &attr, Generation(0)),
            Err(e) => reply.error(e),
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

impl Filesystem for TreeFs {
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

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        if parent.0 == TREE_ROOT {
            return self.root_lookup(req, name, reply);
        }
        let (a, _creds) = route!(self, req, parent, &[LOOK], reply);
        a.fs.lookup(req, parent, name, reply);
    }

    fn forget(&self, req: &Request, ino: INodeNo, nlookup: u64) {
        if let Some(a) = self.shared.attach(ino) {
            a.fs.forget(req, ino, nlookup);
        }
    }

    fn getattr(&self, req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        if ino.0 == TREE_ROOT {
            return reply.attr(&Duration::ZERO, &self.root_attr());
        }
        let n = need(Access::Look, fh.is_some());
        let (a, _creds) = route!(self, req, ino, &[n], reply);
        a.fs.getattr(req, ino, fh, reply);
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        crtime: Option<SystemTime>,
        chgtime: Option<SystemTime>,
        bkuptime: Option<SystemTime>,
        flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        not_root!(ino, Errno::EACCES, reply);
        let n = need(Access::Write, fh.is_some());
        let (a, _creds) = route!(self, req, ino, &[n], reply);
        a.fs.setattr(
            req, ino, mode, uid, gid, size, atime, mtime, ctime, fh, crtime, chgtime, bkuptime,
            flags, reply,
        );
    }

    fn readlink(&self, req: &Request, ino: INodeNo, reply: ReplyData) {
        not_root!(ino, Errno::EINVAL, reply);
        let (a, _creds) = route!(self, req, ino, &[READ], reply);
        a.fs.readlink(req, ino, reply);
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        not_root!(parent, Errno::EACCES, reply);
        let (a, _creds) = route!(self, req, parent, &[WRITE], reply);
        a.fs.mknod(req, parent, name, mode, umask, rdev, reply);
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        not_root!(parent, Errno::EACCES, reply);
        let (a, _creds) = route!(self, req, parent, &[WRITE], reply);
        a.fs.mkdir(req, parent, name, mode, umask, reply);
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        not_root!(parent, Errno::EACCES, reply);
        let (a, _creds) = route!(self, req, parent, &[WRITE], reply);
        a.fs.unlink(req, parent, name, reply);
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        not_root!(parent, Errno::EACCES, reply);
        let (a, _creds) = route!(self, req, parent, &[WRITE], reply);
        a.fs.rmdir(req, parent, name, reply);
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        not_root!(parent, Errno::EACCES, reply);
        let (a, _creds) = route!(self, req, parent, &[WRITE], reply);
        a.fs.symlink(req, parent, link_name, target, reply);
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        not_root!(parent, Errno::EACCES, reply);
        not_root!(newparent, Errno::EACCES, reply);
        if attach_of_node(parent.0) != attach_of_node(newparent.0) {
            return reply.error(Errno::EXDEV);
        }
        let (a, _creds) = route!(self, req, parent, &[WRITE], reply);
        a.fs.rename(req, parent, name, newparent, newname, flags, reply);
    }

    fn link(
        &self,
        req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        not_root!(ino, Errno::EACCES, reply);
        not_root!(newparent, Errno::EACCES, reply);
        if attach_of_node(ino.0) != attach_of_node(newparent.0) {
            return reply.error(Errno::EXDEV);
        }
        let (a, _creds) = route!(self, req, newparent, &[WRITE], reply);
        a.fs.link(req, ino, newparent, newname, reply);
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        not_root!(ino, Errno::EISDIR, reply);
        let (a, _creds) = route!(self, req, ino, &[open_need(flags.0)], reply);
        a.fs.open(req, ino, flags, reply);
    }

    fn read(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        flags: OpenFlags,
        lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        not_root!(ino, Errno::EISDIR, reply);
        let (a, _creds) = route!(self, req, ino, &[need(Access::Read, true)], reply);
        a.fs.read(req, ino, fh, offset, size, flags, lock_owner, reply);
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        flags: OpenFlags,
        lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        not_root!(ino, Errno::EISDIR, reply);
        let (a, _creds) = if write_flags.contains(WriteFlags::FUSE_WRITE_CACHE) {
            // From the page cache (a shared mapping): the kernel's writeback, which carries
            // no caller (uid 0, pid 0), of data the writer was told was written long ago.
            // It comes on a handle the gate admitted for writing at open; refusing it now
            // would lose acknowledged data. Run as the owner (quota, reserved blocks).
            let Some(a) = self.shared.attach(ino) else {
                return reply.error(Errno::EIO);
            };
            let creds = match CredGuard::switch(&a.owner) {
                Ok(c) => c,
                Err(e) => {
                    tracing::error!("attach {}: cannot switch credentials: {e}", a.name);
                    return reply.error(Errno::EIO);
                }
            };
            (a, creds)
        } else {
            route!(self, req, ino, &[need(Access::Write, true)], reply)
        };
        a.fs.write(
            req,
            ino,
            fh,
            offset,
            data,
            write_flags,
            flags,
            lock_owner,
            reply,
        );
    }

    fn flush(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        match self.shared.attach(ino) {
            Some(a) => a.fs.flush(req, ino, fh, lock_owner, reply),
            None => reply.ok(),
        }
    }

    fn release(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        flags: OpenFlags,
        lock_owner: Option<LockOwner>,
        flush: bool,
        reply: ReplyEmpty,
    ) {
        match self.shared.attach(ino) {
            Some(a) => a.fs.release(req, ino, fh, flags, lock_owner, flush, reply),
            None => reply.ok(),
        }
    }

    fn fsync(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        not_root!(ino, Errno::EISDIR, reply);
        let (a, _creds) = route!(self, req, ino, &[need(Access::Look, true)], reply);
        a.fs.fsync(req, ino, fh, datasync, reply);
    }

    fn opendir(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if ino.0 == TREE_ROOT {
            // Not cached: the listing changes with every attach and detach.
            return reply.opened(FileHandle(0), FopenFlags::empty());
        }
        let (a, _creds) = route!(self, req, ino, &[READ], reply);
        a.fs.opendir(req, ino, flags, reply);
    }

    fn readdir(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        if ino.0 == TREE_ROOT {
            for (node, next, name) in self.root_entries(offset) {
                if reply.add(INodeNo(node), next, FileType::Directory, name) {
                    break;
                }
            }
            return reply.ok();
        }
        let (a, _creds) = route!(self, req, ino, &[need(Access::Read, true)], reply);
        a.fs.readdir(req, ino, fh, offset, reply);
    }

    fn readdirplus(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        if ino.0 == TREE_ROOT {
            for (node, next, name) in self.root_entries(offset) {
                // Neutral attributes, never cached: an attach's real ones are only for
                // those the gate lets look (the kernel needs a node number, or the entry
                // would be skipped as deleted).
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
            return reply.ok();
        }
        let (a, _creds) = route!(self, req, ino, &[need(Access::Read, true)], reply);
        a.fs.readdirplus(req, ino, fh, offset, reply);
    }

    fn releasedir(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        match self.shared.attach(ino) {
            Some(a) => a.fs.releasedir(req, ino, fh, flags, reply),
            None => reply.ok(),
        }
    }

    fn fsyncdir(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        if ino.0 == TREE_ROOT {
            return reply.ok();
        }
        let (a, _creds) = route!(self, req, ino, &[need(Access::Look, true)], reply);
        a.fs.fsyncdir(req, ino, fh, datasync, reply);
    }

    /// Nothing to decrypt or change: answered like the single mount does, ungated.
    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        reply.error(Errno::ENOTTY);
    }

    fn statfs(&self, req: &Request, ino: INodeNo, reply: ReplyStatfs) {
        if ino.0 == TREE_ROOT {
            let name_max = cloakfs_core::format::names::NAME_MAX as u32;
            return reply.statfs(0, 0, 0, 0, 0, 4096, name_max, 4096);
        }
        let (a, _creds) = route!(self, req, ino, &[LOOK], reply);
        a.fs.statfs(req, ino, reply);
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        position: u32,
        setxattr_flags: SetXAttrFlags,
        reply: ReplyEmpty,
    ) {
        not_root!(ino, Errno::EACCES, reply);
        let (a, _creds) = route!(self, req, ino, &[WRITE], reply);
        a.fs.setxattr(
            req,
            ino,
            name,
            value,
            flags,
            position,
            setxattr_flags,
            reply,
        );
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        not_root!(ino, Errno::from_i32(libc::ENODATA), reply);
        let (a, _creds) = route!(self, req, ino, &[READ], reply);
        a.fs.getxattr(req, ino, name, size, reply);
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        if ino.0 == TREE_ROOT {
            return crate::xattr::reply_xattr(reply, size, Ok(Vec::new()));
        }
        let (a, _creds) = route!(self, req, ino, &[READ], reply);
        a.fs.listxattr(req, ino, size, reply);
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        not_root!(ino, Errno::EACCES, reply);
        let (a, _creds) = route!(self, req, ino, &[WRITE], reply);
        a.fs.removexattr(req, ino, name, reply);
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        if ino.0 == TREE_ROOT {
            // dr-xr-xr-x for everyone, root included.
            return if mask.contains(AccessFlags::W_OK) {
                reply.error(Errno::EACCES)
            } else {
                reply.ok()
            };
        }
        // As `route`, with the needs depending on the node's kind.
        let Some(a) = self.shared.attach(ino) else {
            return reply.error(Errno::EIO);
        };
        let dir =
            a.fs.node(ino)
                .is_ok_and(|n| n.kind == crate::inode::Kind::Dir);
        let _creds = match self.admit(&a, req, &access_needs(mask, dir)) {
            Ok(creds) => creds,
            Err(e) => return reply.error(e),
        };
        a.fs.access(req, ino, mask, reply);
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        not_root!(parent, Errno::EACCES, reply);
        let (a, _creds) = route!(self, req, parent, &[WRITE], reply);
        a.fs.create(req, parent, name, mode, umask, flags, reply);
    }

    fn fallocate(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        not_root!(ino, Errno::EISDIR, reply);
        let (a, _creds) = route!(self, req, ino, &[need(Access::Write, true)], reply);
        a.fs.fallocate(req, ino, fh, offset, length, mode, reply);
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
