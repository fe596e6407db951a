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
    ReplyWrite, ReplyXattr, Request, SetXAttrFlags, TimeOrNow, WriteFlags,
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

/// Implements FUSE operations that reply: each asks the gate about the request as an [`Op`]
/// (`as ...`), then calls the same operation of the handlers it names with the same
/// arguments, holding the gate's pass until they return; or replies with the gate's errno.
macro_rules! through_the_gate {
    ($(fn $name:ident($($arg:ident: $ty:ty),* $(,)?) -> $reply:ty, as $op:expr;)*) => {
        $(
            fn $name(&self, req: &Request, $($arg: $ty,)* reply: $reply) {
                match self.gate.admit(req, $op) {
                    Ok(handlers) => handlers.$name(req, $($arg,)* reply),
                    Err(e) => reply.error(e),
                }
            }
        )*
    };
}

impl<G: RequestGate> Filesystem for Gated<G> {
    fn init(&mut self, req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        self.gate.whole_mount().init(req, config)
    }

    fn destroy(&mut self) {
        self.gate.whole_mount().destroy()
    }

    fn forget(&self, req: &Request, ino: INodeNo, nlookup: u64) {
        if let Ok(handlers) = self.gate.admit(req, Op::Forget { ino }) {
            handlers.forget(req, ino, nlookup)
        }
    }

    through_the_gate! {
        fn lookup(parent: INodeNo, name: &OsStr) -> ReplyEntry, as Op::Lookup { parent, name };
        fn getattr(ino: INodeNo, fh: Option<FileHandle>) -> ReplyAttr,
            as Op::Getattr { ino, on_handle: fh.is_some() };
        fn setattr(
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
        ) -> ReplyAttr, as Op::Setattr { ino, on_handle: fh.is_some() };
        fn readlink(ino: INodeNo) -> ReplyData, as Op::Readlink { ino };
        fn mknod(parent: INodeNo, name: &OsStr, mode: u32, umask: u32, rdev: u32) -> ReplyEntry,
            as Op::Mknod { parent };
        fn mkdir(parent: INodeNo, name: &OsStr, mode: u32, umask: u32) -> ReplyEntry,
            as Op::Mkdir { parent };
        fn unlink(parent: INodeNo, name: &OsStr) -> ReplyEmpty, as Op::Unlink { parent };
        fn rmdir(parent: INodeNo, name: &OsStr) -> ReplyEmpty, as Op::Rmdir { parent };
        fn symlink(parent: INodeNo, link_name: &OsStr, target: &Path) -> ReplyEntry,
            as Op::Symlink { parent };
        fn rename(
            parent: INodeNo,
            name: &OsStr,
            newparent: INodeNo,
            newname: &OsStr,
            flags: RenameFlags,
        ) -> ReplyEmpty, as Op::Rename { parent, newparent };
        fn link(ino: INodeNo, newparent: INodeNo, newname: &OsStr) -> ReplyEntry,
            as Op::Link { ino, newparent };
        fn open(ino: INodeNo, flags: OpenFlags) -> ReplyOpen, as Op::Open { ino, flags };
        fn read(
            ino: INodeNo,
            fh: FileHandle,
            offset: u64,
            size: u32,
            flags: OpenFlags,
            lock_owner: Option<LockOwner>,
        ) -> ReplyData, as Op::Read { ino };
        fn write(
            ino: INodeNo,
            fh: FileHandle,
            offset: u64,
            data: &[u8],
            write_flags: WriteFlags,
            flags: OpenFlags,
            lock_owner: Option<LockOwner>,
        ) -> ReplyWrite, as Op::Write { ino, flags: write_flags };
        fn flush(ino: INodeNo, fh: FileHandle, lock_owner: LockOwner) -> ReplyEmpty,
            as Op::Flush { ino };
        fn release(
            ino: INodeNo,
            fh: FileHandle,
            flags: OpenFlags,
            lock_owner: Option<LockOwner>,
            flush: bool,
        ) -> ReplyEmpty, as Op::Release { ino };
        fn fsync(ino: INodeNo, fh: FileHandle, datasync: bool) -> ReplyEmpty, as Op::Fsync { ino };
        fn opendir(ino: INodeNo, flags: OpenFlags) -> ReplyOpen, as Op::Opendir { ino };
        fn readdir(ino: INodeNo, fh: FileHandle, offset: u64) -> ReplyDirectory,
            as Op::Readdir { ino };
        fn readdirplus(ino: INodeNo, fh: FileHandle, offset: u64) -> ReplyDirectoryPlus,
            as Op::Readdirplus { ino };
        fn releasedir(ino: INodeNo, fh: FileHandle, flags: OpenFlags) -> ReplyEmpty,
            as Op::Releasedir { ino };
        fn fsyncdir(ino: INodeNo, fh: FileHandle, datasync: bool) -> ReplyEmpty,
            as Op::Fsyncdir { ino };
        fn statfs(ino: INodeNo) -> ReplyStatfs, as Op::Statfs { ino };
        fn setxattr(
            ino: INodeNo,
            name: &OsStr,
            value: &[u8],
            flags: i32,
            position: u32,
            setxattr_flags: SetXAttrFlags,
        ) -> ReplyEmpty, as Op::Setxattr { ino };
        fn getxattr(ino: INodeNo, name: &OsStr, size: u32) -> ReplyXattr, as Op::Getxattr { ino };
        fn listxattr(ino: INodeNo, size: u32) -> ReplyXattr, as Op::Listxattr { ino };
        fn removexattr(ino: INodeNo, name: &OsStr) -> ReplyEmpty, as Op::Removexattr { ino };
        fn access(ino: INodeNo, mask: AccessFlags) -> ReplyEmpty, as Op::Access { ino, mask };
        fn create(
            parent: INodeNo,
            name: &OsStr,
            mode: u32,
            umask: u32,
            flags: i32,
        ) -> ReplyCreate, as Op::Create { parent };
        fn getlk(
            ino: INodeNo,
            fh: FileHandle,
            lock_owner: LockOwner,
            start: u64,
            end: u64,
            typ: i32,
            pid: u32,
        ) -> ReplyLock, as Op::Getlk;
        fn setlk(
            ino: INodeNo,
            fh: FileHandle,
            lock_owner: LockOwner,
            start: u64,
            end: u64,
            typ: i32,
            pid: u32,
            sleep: bool,
        ) -> ReplyEmpty, as Op::Setlk;
        fn bmap(ino: INodeNo, blocksize: u32, idx: u64) -> ReplyBmap, as Op::Bmap;
        fn ioctl(
            ino: INodeNo,
            fh: FileHandle,
            flags: IoctlFlags,
            cmd: u32,
            in_data: &[u8],
            out_size: u32,
        ) -> ReplyIoctl, as Op::Ioctl;
        fn poll(
            ino: INodeNo,
            fh: FileHandle,
            ph: PollNotifier,
            events: PollEvents,
            flags: PollFlags,
        ) -> ReplyPoll, as Op::Poll;
        fn fallocate(ino: INodeNo, fh: FileHandle, offset: u64, length: u64, mode: i32)
            -> ReplyEmpty, as Op::Fallocate { ino };
        fn lseek(ino: INodeNo, fh: FileHandle, offset: i64, whence: i32) -> ReplyLseek,
            as Op::Lseek;
        fn copy_file_range(
            ino_in: INodeNo,
            fh_in: FileHandle,
            offset_in: u64,
            ino_out: INodeNo,
            fh_out: FileHandle,
            offset_out: u64,
            len: u64,
            flags: CopyFileRangeFlags,
        ) -> ReplyWrite, as Op::CopyFileRange;
    }
}
