//! The one place where FUSE requests meet a check: [`Gated`] is the `fuser::Filesystem` of
//! every mount whose requests are checked (key binding and `cloakfs run`: `binding`; the
//! multi-user tree: `tree_ops`). It forwards each request to the handlers its
//! [`RequestGate`] names, or replies with the errno the gate gives.
//!
//! Invariant: no request reaches the handlers without the gate's yes. What the gate lets
//! through unchecked is the gate's own decision, said in its `admit`, and each gate documents
//! it (the kernel's own requests that reveal nothing: forgetting nodes, releasing handles).
//! Only the two calls that are not requests bypass `admit`: `init` (the handshake, before any
//! request) and `destroy` (after the last); both go to [`RequestGate::whole_mount`].

use fuser::{
    AccessFlags, BsdFileFlags, CopyFileRangeFlags, Errno, FileHandle, Filesystem, INodeNo,
    IoctlFlags, KernelConfig, LockOwner, OpenFlags, PollEvents, PollFlags, PollNotifier,
    RenameFlags, ReplyAttr, ReplyBmap, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus,
    ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyLock, ReplyLseek, ReplyOpen, ReplyPoll, ReplyStatfs,
    ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use std::ffi::OsStr;
use std::ops::Deref;
use std::path::Path;
use std::time::SystemTime;

/// A FUSE request as a gate sees it: the operation, the nodes it acts on (the parent
/// directory for the operations on a name), and the arguments that decide what it needs
/// (`on_handle`: the request names an open handle; the write flags; the open flags). The
/// operations no gate tells apart by node carry nothing.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Op<'a> {
    Lookup { parent: INodeNo, name: &'a OsStr },
    Forget { ino: INodeNo },
    Getattr { ino: INodeNo, on_handle: bool },
    Setattr { ino: INodeNo, on_handle: bool },
    Readlink { ino: INodeNo },
    Mknod { parent: INodeNo },
    Mkdir { parent: INodeNo },
    Unlink { parent: INodeNo },
    Rmdir { parent: INodeNo },
    Symlink { parent: INodeNo },
    Rename { parent: INodeNo, newparent: INodeNo },
    Link { ino: INodeNo, newparent: INodeNo },
    Open { ino: INodeNo, flags: OpenFlags },
    Read { ino: INodeNo },
    Write { ino: INodeNo, flags: WriteFlags },
    Flush { ino: INodeNo },
    Release { ino: INodeNo },
    Fsync { ino: INodeNo },
    Opendir { ino: INodeNo },
    Readdir { ino: INodeNo },
    Readdirplus { ino: INodeNo },
    Releasedir { ino: INodeNo },
    Fsyncdir { ino: INodeNo },
    Statfs { ino: INodeNo },
    Setxattr { ino: INodeNo },
    Getxattr { ino: INodeNo },
    Listxattr { ino: INodeNo },
    Removexattr { ino: INodeNo },
    Access { ino: INodeNo, mask: AccessFlags },
    Create { parent: INodeNo },
    Getlk,
    Setlk,
    Bmap,
    Ioctl,
    Poll,
    Fallocate { ino: INodeNo },
    Lseek,
    CopyFileRange,
}

/// Decides, for each request, whether it is served and by which handlers.
pub(crate) trait RequestGate: Send + Sync + 'static {
    /// The handlers requests are forwarded to.
    type Handlers: Filesystem + ?Sized;
    /// An admitted request's handlers, and whatever must be held while they run (the
    /// credentials the request runs as).
    type Pass<'a>: Deref<Target = Self::Handlers>
    where
        Self: 'a;

    /// The handlers of the mount as a whole, for the handshake and the end of the session.
    fn whole_mount(&mut self) -> &mut Self::Handlers;

    /// The handlers that serve `op`, sent by the caller in `req`'s header; or the errno
    /// to reply instead.
    fn admit<'a>(&'a self, req: &Request, op: Op<'_>) -> Result<Self::Pass<'a>, Errno>;
}

/// A file system whose every request passes its gate first.
pub(crate) struct Gated<G> {
    gate: G,
}

impl<G> Gated<G> {
    pub(crate) fn new(gate: G) -> Self {
        Self { gate }
    }
}

/// The handlers the gate names for `$op`, held until the end of the enclosing block; or
/// replies with the gate's errno and returns.
macro_rules! admit {
    ($self:ident, $req:ident, $op:expr, $reply:ident) => {
        match $self.gate.admit($req, $op) {
            Ok(pass) => pass,
            Err(e) => return $reply.error(e),
        }
    };
}

impl<G: RequestGate> Filesystem for Gated<G> {
    fn init(&mut self, req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        self.gate.whole_mount().init(req, config)
    }

    fn destroy(&mut self) {
        self.gate.whole_mount().destroy()
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let handlers = admit!(self, req, Op::Lookup { parent, name }, reply);
        handlers.lookup(req, parent, name, reply)
    }

    fn forget(&self, req: &Request, ino: INodeNo, nlookup: u64) {
        if let Ok(handlers) = self.gate.admit(req, Op::Forget { ino }) {
            handlers.forget(req, ino, nlookup)
        }
    }

    fn getattr(&self, req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        let handlers = admit!(
            self,
            req,
            Op::Getattr {
                ino,
                on_handle: fh.is_some(),
            },
            reply
        );
        handlers.getattr(req, ino, fh, reply)
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
        flags: Option<BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let handlers = admit!(
            self,
            req,
            Op::Setattr {
                ino,
                on_handle: fh.is_some(),
            },
            reply
        );
        handlers.setattr(
            req, ino, mode, uid, gid, size, atime, mtime, ctime, fh, crtime, chgtime, bkuptime,
            flags, reply,
        )
    }

    fn readlink(&self, req: &Request, ino: INodeNo, reply: ReplyData) {
        let handlers = admit!(self, req, Op::Readlink { ino }, reply);
        handlers.readlink(req, ino, reply)
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
        let handlers = admit!(self, req, Op::Mknod { parent }, reply);
        handlers.mknod(req, parent, name, mode, umask, rdev, reply)
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
        let handlers = admit!(self, req, Op::Mkdir { parent }, reply);
        handlers.mkdir(req, parent, name, mode, umask, reply)
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let handlers = admit!(self, req, Op::Unlink { parent }, reply);
        handlers.unlink(req, parent, name, reply)
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let handlers = admit!(self, req, Op::Rmdir { parent }, reply);
        handlers.rmdir(req, parent, name, reply)
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let handlers = admit!(self, req, Op::Symlink { parent }, reply);
        handlers.symlink(req, parent, link_name, target, reply)
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
        let handlers = admit!(self, req, Op::Rename { parent, newparent }, reply);
        handlers.rename(req, parent, name, newparent, newname, flags, reply)
    }

    fn link(
        &self,
        req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let handlers = admit!(self, req, Op::Link { ino, newparent }, reply);
        handlers.link(req, ino, newparent, newname, reply)
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let handlers = admit!(self, req, Op::Open { ino, flags }, reply);
        handlers.open(req, ino, flags, reply)
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
        let handlers = admit!(self, req, Op::Read { ino }, reply);
        handlers.read(req, ino, fh, offset, size, flags, lock_owner, reply)
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
        let handlers = admit!(
            self,
            req,
            Op::Write {
                ino,
                flags: write_flags,
            },
            reply
        );
        handlers.write(
            req,
            ino,
            fh,
            offset,
            data,
            write_flags,
            flags,
            lock_owner,
            reply,
        )
    }

    fn flush(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        let handlers = admit!(self, req, Op::Flush { ino }, reply);
        handlers.flush(req, ino, fh, lock_owner, reply)
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
        let handlers = admit!(self, req, Op::Release { ino }, reply);
        handlers.release(req, ino, fh, flags, lock_owner, flush, reply)
    }

    fn fsync(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        let handlers = admit!(self, req, Op::Fsync { ino }, reply);
        handlers.fsync(req, ino, fh, datasync, reply)
    }

    fn opendir(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let handlers = admit!(self, req, Op::Opendir { ino }, reply);
        handlers.opendir(req, ino, flags, reply)
    }

    fn readdir(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        reply: ReplyDirectory,
    ) {
        let handlers = admit!(self, req, Op::Readdir { ino }, reply);
        handlers.readdir(req, ino, fh, offset, reply)
    }

    fn readdirplus(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        reply: ReplyDirectoryPlus,
    ) {
        let handlers = admit!(self, req, Op::Readdirplus { ino }, reply);
        handlers.readdirplus(req, ino, fh, offset, reply)
    }

    fn releasedir(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        let handlers = admit!(self, req, Op::Releasedir { ino }, reply);
        handlers.releasedir(req, ino, fh, flags, reply)
    }

    fn fsyncdir(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        let handlers = admit!(self, req, Op::Fsyncdir { ino }, reply);
        handlers.fsyncdir(req, ino, fh, datasync, reply)
    }

    fn statfs(&self, req: &Request, ino: INodeNo, reply: ReplyStatfs) {
        let handlers = admit!(self, req, Op::Statfs { ino }, reply);
        handlers.statfs(req, ino, reply)
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        position: u32,
        reply: ReplyEmpty,
    ) {
        let handlers = admit!(self, req, Op::Setxattr { ino }, reply);
        handlers.setxattr(req, ino, name, value, flags, position, reply)
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let handlers = admit!(self, req, Op::Getxattr { ino }, reply);
        handlers.getxattr(req, ino, name, size, reply)
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let handlers = admit!(self, req, Op::Listxattr { ino }, reply);
        handlers.listxattr(req, ino, size, reply)
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let handlers = admit!(self, req, Op::Removexattr { ino }, reply);
        handlers.removexattr(req, ino, name, reply)
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        let handlers = admit!(self, req, Op::Access { ino, mask }, reply);
        handlers.access(req, ino, mask, reply)
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
        let handlers = admit!(self, req, Op::Create { parent }, reply);
        handlers.create(req, parent, name, mode, umask, flags, reply)
    }

    fn getlk(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        reply: ReplyLock,
    ) {
        let handlers = admit!(self, req, Op::Getlk, reply);
        handlers.getlk(req, ino, fh, lock_owner, start, end, typ, pid, reply)
    }

    fn setlk(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        sleep: bool,
        reply: ReplyEmpty,
    ) {
        let handlers = admit!(self, req, Op::Setlk, reply);
        handlers.setlk(req, ino, fh, lock_owner, start, end, typ, pid, sleep, reply)
    }

    fn bmap(&self, req: &Request, ino: INodeNo, blocksize: u32, idx: u64, reply: ReplyBmap) {
        let handlers = admit!(self, req, Op::Bmap, reply);
        handlers.bmap(req, ino, blocksize, idx, reply)
    }

    fn ioctl(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        flags: IoctlFlags,
        cmd: u32,
        in_data: &[u8],
        out_size: u32,
        reply: ReplyIoctl,
    ) {
        let handlers = admit!(self, req, Op::Ioctl, reply);
        handlers.ioctl(req, ino, fh, flags, cmd, in_data, out_size, reply)
    }

    fn poll(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        ph: PollNotifier,
        events: PollEvents,
        flags: PollFlags,
        reply: ReplyPoll,
    ) {
        let handlers = admit!(self, req, Op::Poll, reply);
        handlers.poll(req, ino, fh, ph, events, flags, reply)
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
        let handlers = admit!(self, req, Op::Fallocate { ino }, reply);
        handlers.fallocate(req, ino, fh, offset, length, mode, reply)
    }

    fn lseek(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        let handlers = admit!(self, req, Op::Lseek, reply);
        handlers.lseek(req, ino, fh, offset, whence, reply)
    }

    fn copy_file_range(
        &self,
        req: &Request,
        ino_in: INodeNo,
        fh_in: FileHandle,
        offset_in: u64,
        ino_out: INodeNo,
        fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        let handlers = admit!(self, req, Op::CopyFileRange, reply);
        handlers.copy_file_range(
            req, ino_in, fh_in, offset_in, ino_out, fh_out, offset_out, len, flags, reply,
        )
    }
}
