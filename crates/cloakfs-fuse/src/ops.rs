//! The FUSE request handlers: each decodes its request, calls the matching operation on the
//! cipher directory, and replies.

use crate::attr::negative_attr;
use crate::fs::CloakFs;
use crate::sys::{self, errno, Res};
use fuser::{
    AccessFlags, Errno, FileAttr, FileHandle, Filesystem, FopenFlags, Generation, INodeNo,
    InitFlags, IoctlFlags, KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate,
    ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyOpen,
    ReplyStatfs, ReplyWrite, ReplyXattr, Request, SetXAttrFlags, TimeOrNow, WriteFlags,
};
use std::ffi::OsStr;
use std::path::Path;
use std::time::SystemTime;

/// Largest write request asked of the kernel (its own limit is usually 1 MiB too).
pub(crate) const MAX_WRITE: u32 = 1 << 20;
/// Readahead asked of the kernel for the mount, in KiB: enough for several 1 MiB reads in
/// flight, so the backing disk's reads overlap decryption and replies. Measured on a cold 1 GiB
/// read here: 1 MiB gave 1.1-1.3 GB/s, 8 MiB 1.5-1.9 GB/s, 16 and 32 MiB no more.
pub(crate) const READAHEAD_KIB: u64 = 8 << 10;
/// Share, in percent, of the system's dirty-page limit that the mount's cached writes may hold.
/// The kernel gives a FUSE mount 1%, strictly enforced, so that an untrusted server cannot pin
/// memory; at 1% a stream's writer is throttled into lockstep with the daemon and the cores
/// idle in turns. Measured on a 1 GiB `dd conv=fsync` here: 1% 1.18-1.23 s, 5% 1.00-1.20 s
/// (the plain directory 1.03-1.09 s).
pub(crate) const DIRTY_SHARE_PERCENT: u64 = 5;
/// Background requests (readahead, writeback) the kernel may have in flight.
const MAX_BACKGROUND: u16 = 64;

fn reply_entry(reply: ReplyEntry, fs: &CloakFs, r: Res<FileAttr>) {
    match r {
        Ok(attr) => reply.entry(&fs.coherence.entry_ttl(fs.ttl, &attr), &attr, Generation(0)),
        Err(e) => reply.error(e),
    }
}

fn reply_empty(reply: ReplyEmpty, r: Res<()>) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(e),
    }
}

/// How the kernel caches writes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum WriteCache {
    /// Every write(2) waits for our reply, so every error (EFBIG past the largest file the
    /// backing file system holds, ENOSPC, EIO) reaches the writer; pages stay cached for
    /// reads. Cached pages are dropped when a size change shows up, not on every mtime change
    /// (our own writes change it).
    WriteThrough,
    /// Like `WriteThrough`, but cached pages are also dropped whenever the mtime changes (the
    /// multi-user tree, where other users' writes reach the cipher directory directly).
    WriteThroughMtime,
    /// The kernel's writeback cache (`-o writeback_cache`): writes are acknowledged from the
    /// page cache and reach us later in large batches; an error then can only be reported at
    /// fsync and close.
    Writeback,
}

/// What the handshake decided about FUSE over io_uring.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum UringOutcome {
    /// The INIT reply asked for it: the kernel now holds every request until each CPU's queue
    /// has a ring entry.
    Negotiated,
    /// The mount does not want it (`--no-io-uring`, or the multi-user tree).
    TurnedOff,
    /// The kernel does not offer it.
    NotOffered,
    /// The kernel offers it but this process may not set up a ring (why).
    NotAllowed(String),
}

thread_local! {
    /// The outcome of the last handshake on this thread. The handshake runs on the thread that
    /// mounts (`fuser::Session::new`), which takes it right after.
    static URING_OUTCOME: std::cell::RefCell<UringOutcome> =
        const { std::cell::RefCell::new(UringOutcome::TurnedOff) };
}

/// What the handshake just made on this thread decided about FUSE over io_uring.
pub(crate) fn take_uring_outcome() -> UringOutcome {
    URING_OUTCOME.with(|o| o.replace(UringOutcome::TurnedOff))
}

/// Negotiates the connection: large writes, readdirplus, parallel directory operations,
/// kept caches, the write cache `cache` (the multi-user tree never takes the writeback
/// cache: cached writes reach us from kernel threads with the wrong caller), and `extra` (locks
/// passed to us on shared storage: see `Coherence::capabilities`).
pub(crate) fn negotiate(
    config: &mut KernelConfig,
    cache: WriteCache,
    io_uring: bool,
    extra: InitFlags,
) {
    negotiate_except(config, cache, io_uring, extra, InitFlags::empty());
}

/// The capabilities that make the kernel list directories with readdirplus.
pub(crate) const READDIRPLUS: InitFlags =
    InitFlags::FUSE_DO_READDIRPLUS.union(InitFlags::FUSE_READDIRPLUS_AUTO);

/// [`negotiate`] without the capabilities in `except` (a file system that does not serve
/// readdirplus, such as the reverse view, leaves out [`READDIRPLUS`]).
pub(crate) fn negotiate_except(
    config: &mut KernelConfig,
    cache: WriteCache,
    io_uring: bool,
    extra: InitFlags,
    except: InitFlags,
) {
    let mut want = InitFlags::FUSE_ASYNC_READ
        | InitFlags::FUSE_BIG_WRITES
        | InitFlags::FUSE_MAX_PAGES
        | InitFlags::FUSE_PARALLEL_DIROPS
        | InitFlags::FUSE_ATOMIC_O_TRUNC
        // Not FUSE_ASYNC_DIO: with it the kernel queues an AIO O_DIRECT write and returns
        // before we have written it, having dropped the range's cached pages only before; a
        // buffered read meanwhile caches the old data, which then outlives the write
        // (xfstests generic/451). Without it such a write completes before io_submit returns
        // and the kernel drops the pages again after it, as for any direct write.
        | InitFlags::FUSE_CACHE_SYMLINKS
        // ioctls on directories: `cloakfs encrypt` (ENCRYPT_IOCTL).
        | InitFlags::FUSE_HAS_IOCTL_DIR
        | READDIRPLUS
        // We clear setuid/setgid where the kernel tells us to (see `kill_suidgid`); the
        // backing file system drops security.capability on our own writes, truncates and
        // chowns. In return the kernel stops asking for security.capability before writes.
        | InitFlags::FUSE_HANDLE_KILLPRIV_V2
        // Handles that bypass the page cache may still be mapped shared (through it).
        | InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP;
    match cache {
        WriteCache::WriteThrough => {}
        WriteCache::WriteThroughMtime => want |= InitFlags::FUSE_AUTO_INVAL_DATA,
        // The kernel then keeps written pages and sends them in large batches; it also
        // handles O_APPEND and mtime itself (and ignores AUTO_INVAL_DATA for files).
        WriteCache::Writeback => want |= InitFlags::FUSE_WRITEBACK_CACHE,
    }
    want |= extra;
    want &= !except;
    // Asked for only when it can work: once the INIT reply carries the flag, the kernel sends
    // nothing until the rings are registered.
    let outcome = if !io_uring {
        UringOutcome::TurnedOff
    } else if !config
        .capabilities()
        .contains(InitFlags::FUSE_OVER_IO_URING)
    {
        UringOutcome::NotOffered
    } else {
        match crate::uring::probe() {
            Ok(()) => {
                want |= InitFlags::FUSE_OVER_IO_URING;
                UringOutcome::Negotiated
            }
            Err(e) => UringOutcome::NotAllowed(e.to_string()),
        }
    };
    URING_OUTCOME.with(|o| o.replace(outcome));
    let _ = config.add_capabilities(want & config.capabilities());
    if let Err(max) = config.set_max_write(MAX_WRITE) {
        let _ = config.set_max_write(max);
    }
    if let Err(max) = config.set_max_readahead(u32::MAX) {
        let _ = config.set_max_readahead(max);
    }
    let _ = config.set_max_background(MAX_BACKGROUND);
    let _ = config.set_congestion_threshold(MAX_BACKGROUND * 3 / 4);
    tracing::debug!(
        "FUSE capabilities offered {:?}, negotiated {:?}",
        config.capabilities(),
        want & config.capabilities()
    );
}

impl Filesystem for CloakFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // The writeback cache only if writable and alone (its cached size would hide other
        // clients' growth).
        let writeback =
            self.writeback_cache && !self.read_only && !self.coherence.sharing.is_shared();
        negotiate_except(
            config,
            if writeback {
                WriteCache::Writeback
            } else {
                WriteCache::WriteThrough
            },
            self.io_uring,
            self.coherence.capabilities(),
            self.coherence.not_wanted(),
        );
        // Where the backing file system keeps ACLs, the kernel stops applying the umask to
        // new objects: it sends the caller's, which the backing file system applies unless the
        // parent has a default ACL (`with_umask`). Where other users reach the mount, POSIX
        // ACLs are also enforced by the kernel, as on the backing file system: it then checks
        // permissions itself (default_permissions) against the mode and the ACLs it asks us
        // for (system.posix_acl_*, passed through to the backing objects and cached by the
        // kernel until it sets or drops them, or forgets the node). With FUSE_SETXATTR_EXT
        // the kernel says when an ACL change must clear set-gid (see `set_xattr`); a kernel
        // that does not offer it never asks.
        let keeps_acls = self.backing_keeps_acls();
        let offered = config.capabilities();
        self.dont_mask = keeps_acls
            && offered.contains(InitFlags::FUSE_DONT_MASK)
            && config.add_capabilities(InitFlags::FUSE_DONT_MASK).is_ok();
        self.posix_acl = self.admits_others
            && keeps_acls
            && offered.contains(InitFlags::FUSE_POSIX_ACL)
            && config.add_capabilities(InitFlags::FUSE_POSIX_ACL).is_ok();
        if self.posix_acl {
            let _ = config.add_capabilities(InitFlags::FUSE_SETXATTR_EXT);
        }
        if self.admits_others && !self.posix_acl {
            tracing::info!(
                "POSIX ACLs are not enforced: the cipher directory's file system does not keep \
                 them, or the kernel does not offer FUSE_POSIX_ACL"
            );
        }
        if self.adopted() {
            // The kernel refuses passthrough opens on a writeback-cached mount.
            let offered = config.capabilities().contains(InitFlags::FUSE_PASSTHROUGH);
            let on = offered
                && !writeback
                && config.set_max_stack_depth(1).is_ok()
                && config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_ok();
            self.plain
                .passthrough
                .store(on, std::sync::atomic::Ordering::Relaxed);
            if !on {
                tracing::info!(
                    "FUSE passthrough not available (kernel offers it: {offered}, writeback \
                     cache: {writeback}): plaintext files are served through the daemon"
                );
            }
        }
        Ok(())
    }

    fn destroy(&mut self) {
        self.shutdown();
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self.do_lookup(parent, name) {
            Ok(attr) => reply.entry(
                &self.coherence.entry_ttl(self.ttl, &attr),
                &attr,
                Generation(0),
            ),
            // A cacheable "no such entry": compilers probe many missing headers.
            Err(e) if e == Errno::ENOENT => reply.entry(
                &self.coherence.negative_ttl(self.ttl),
                &negative_attr(),
                Generation(0),
            ),
            Err(e) => reply.error(e),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.inodes.forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.node(ino).and_then(|i| self.attr_for_kernel(&i)) {
            Ok((attr, ttl)) => reply.attr(&ttl, &attr),
            Err(e) => reply.error(e),
        }
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
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        match self.do_setattr(req, ino, mode, uid, gid, size, atime, mtime, fh.is_some()) {
            Ok(attr) => reply.attr(&self.attr_ttl(ino), &attr),
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.do_readlink(ino) {
            Ok(t) => reply.data(&t),
            Err(e) => reply.error(e),
        }
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
        let umask = self.creation_umask(umask);
        reply_entry(
            reply,
            self,
            self.do_mknod(req, parent, name, mode, umask, rdev),
        );
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
        let umask = self.creation_umask(umask);
        reply_entry(reply, self, self.do_mkdir(req, parent, name, mode, umask));
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        reply_empty(reply, self.do_unlink(parent, name));
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        reply_empty(reply, self.do_rmdir(parent, name));
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        reply_entry(reply, self, self.do_symlink(req, parent, link_name, target));
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        reply_empty(
            reply,
            self.do_rename(parent, name, newparent, newname, flags),
        );
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        reply_entry(reply, self, self.do_link(ino, newparent, newname));
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let fh = self.new_fh();
        match self.do_open(req, ino, fh, flags.0) {
            Ok(()) => {
                let inode = self.node(ino).ok();
                let append = flags.0 & libc::O_APPEND != 0;
                let uncached = inode.as_ref().is_some_and(|i| {
                    if append && self.coherence.sharing.is_shared() && !i.is_plain() {
                        // Shared: its writes land at the store's end (see `write`).
                        i.opened_uncached(fh)
                    } else {
                        i.opened(fh)
                    }
                });
                // A handle that cannot write has nothing to report at close: no FLUSH for it
                // (the writeback cache flushes every handle regardless), unless its close must
                // drop locks held on the shared store.
                let mut fopen = self.coherence.open_flags();
                if !crate::file::open_writes(flags.0) && !self.coherence.sharing.is_shared() {
                    fopen |= FopenFlags::FOPEN_NOFLUSH;
                }
                if uncached {
                    fopen |= FopenFlags::FOPEN_DIRECT_IO;
                }
                let passthrough = inode
                    .filter(|i| i.is_plain())
                    .and_then(|i| self.passthrough_for(&i, fh, |f| reply.open_backing(f)));
                match passthrough {
                    // The kernel refuses passthrough with any flag but these.
                    Some(id) => reply.opened_passthrough(
                        FileHandle(fh),
                        fopen & (FopenFlags::FOPEN_NOFLUSH | FopenFlags::FOPEN_DIRECT_IO),
                        &id,
                    ),
                    None => reply.opened(FileHandle(fh), fopen),
                }
            }
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        if let Some(h) = self.plain.get(fh.0) {
            let mut buf = vec![0u8; size as usize];
            return match rustix::io::pread(&h.file, &mut buf, offset) {
                Ok(n) => reply.data(&buf[..n]),
                Err(e) => reply.error(crate::sys::errno(e)),
            };
        }
        self.do_read(ino, offset, size, reply);
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
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let inode = match self.node(ino) {
            Ok(i) => i,
            Err(e) => return reply.error(e),
        };
        if self.plain.get(fh.0).is_some() {
            // Plaintext files are only opened for reading (see `open_plain`).
            return reply.error(Errno::EBADF);
        }
        let r = self.writable().and_then(|()| {
            self.check_size(offset, data.len() as u64)?;
            if write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID) {
                self.kill_suidgid(req, &inode)?;
            }
            self.coherence.refuse_sqlite_wal_header(offset, data)?;
            // Shared: an O_APPEND write (not a page the kernel writes back) goes to the end
            // of the file as the store has it under the file's lease, not to the offset the
            // kernel took from its cached size, which other clients' appends have passed.
            let append = self.coherence.sharing.is_shared()
                && flags.0 & libc::O_APPEND != 0
                && !write_flags.contains(WriteFlags::FUSE_WRITE_CACHE);
            self.with_file(&inode, true, |f| {
                if append {
                    f.append(data).map(|_| data.len())
                } else {
                    f.write_at(offset, data)
                }
            })
        });
        if let Err(e) = r {
            if write_flags.contains(WriteFlags::FUSE_WRITE_CACHE) {
                // From the page cache (writeback, or a shared mapping): the writer was told
                // it succeeded long ago. Only fsync and close can still tell it otherwise.
                inode.lose(e);
            }
        }
        match r {
            Ok(n) => reply.written(n as u32),
            Err(e) => reply.error(e),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        if self.coherence.sharing.is_shared() {
            // A close publishes this client's changes to the store, then drops the closing
            // process's locks (the kernel leaves that to flush).
            if let Some(inode) = self.inodes.get(ino.0) {
                self.settle(&inode);
            }
            self.coherence.drop_owner(ino.0, lock_owner.0);
        }
        // A close of a handle that may have written (read-only handles send none, alone): the
        // kernel has written its cached pages and reported their errors once; a write lost
        // earlier is reported by every close until it is handled (see `Inode::lose`). Locks
        // are the kernel's, alone.
        match self.inodes.get(ino.0).and_then(|i| i.lost(fh.0)) {
            Some(e) => reply.error(e),
            None => reply.ok(),
        }
    }

    fn getlk(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        _pid: u32,
        reply: fuser::ReplyLock,
    ) {
        match self.do_getlk(ino, lock_owner.0, start, end, typ) {
            Ok((start, end, typ, pid)) => reply.locked(start, end, typ, pid),
            Err(e) => reply.error(e),
        }
    }

    fn setlk(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        _pid: u32,
        sleep: bool,
        reply: ReplyEmpty,
    ) {
        reply_empty(
            reply,
            self.do_setlk(ino, lock_owner.0, start, end, typ, sleep),
        );
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        if let Some(owner) = lock_owner {
            // The handle's flock, after its changes reached the store.
            if let Some(inode) = self.inodes.get(ino.0) {
                self.settle(&inode);
            }
            self.coherence.drop_owner(ino.0, owner.0);
        }
        if let Some(inode) = self.inodes.get(ino.0) {
            inode.closed(fh.0);
            if self.plain.remove(fh.0).is_none() && inode.release() {
                self.coherence.drop_node(ino.0);
            }
        }
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        if let Some(h) = self.plain.get(fh.0) {
            let r = if datasync {
                rustix::fs::fdatasync(&h.file)
            } else {
                rustix::fs::fsync(&h.file)
            };
            return reply_empty(reply, r.map_err(crate::sys::errno));
        }
        let r = self.syncer.drain().and_then(|()| {
            let inode = self.node(ino)?;
            let mut synced = Ok(());
            self.with_file(&inode, false, |f| {
                synced = f.sync(datasync);
                Ok(())
            })?;
            if let Err(e) = synced {
                // The backing file system reports a failed writeback to one fsync only, and
                // may have dropped the data: ours report it until it is handled.
                inode.lose(self.fail(&e, inode.fd(), Some("fsync")));
            }
            inode.lost(fh.0).map_or(Ok(()), Err)
        });
        reply_empty(reply, r);
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.do_opendir(ino) {
            // The kernel may keep the listing; it drops it when the directory changes
            // through this mount or its mtime changes.
            Ok(fh) => reply.opened(
                FileHandle(fh),
                self.coherence.open_flags() | FopenFlags::FOPEN_CACHE_DIR,
            ),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        reply: ReplyDirectory,
    ) {
        self.do_readdir(ino, fh, offset, reply);
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        reply: ReplyDirectoryPlus,
    ) {
        self.do_readdirplus(ino, fh, offset, reply);
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.dirs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&fh.0);
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let r = self.syncer.drain().and_then(|()| {
            let inode = self.node(ino)?;
            sys::sync_dir(inode.fd()).map_err(errno)
        });
        reply_empty(reply, r);
    }

    /// `cloakfs encrypt` (ENCRYPT_IOCTL on a directory, the entry's name as its argument)
    /// is the only ioctl. ENOTTY is what a regular file answers to others (Python's open()
    /// asks TCGETS on every file), without fuser's warning per request.
    fn ioctl(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        cmd: u32,
        in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        if cmd != crate::ENCRYPT_IOCTL {
            return reply.error(Errno::ENOTTY);
        }
        let name = in_data.split(|&b| b == 0).next().unwrap_or_default();
        let r = self.node(ino).and_then(|dir| {
            if name.is_empty() {
                return self.finish_conversion(&dir).map(|()| 0);
            }
            self.encrypt_in_place(&dir, std::os::unix::ffi::OsStrExt::from_bytes(name))
                .map(|done| done as i32)
        });
        match r {
            Ok(done) => reply.ioctl(done, &[]),
            Err(e) => reply.error(e),
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match self.do_statfs() {
            Ok((blocks, bfree, bavail, files, ffree, bsize, frsize)) => reply.statfs(
                blocks,
                bfree,
                bavail,
                files,
                ffree,
                bsize,
                cloakfs_core::format::names::NAME_MAX as u32,
                frsize,
            ),
            Err(e) => reply.error(e),
        }
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        position: u32,
        setxattr_flags: SetXAttrFlags,
        reply: ReplyEmpty,
    ) {
        reply_empty(
            reply,
            self.set_xattr(ino, name, value, flags, position, setxattr_flags),
        );
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        crate::xattr::reply_xattr(reply, size, self.get_xattr(ino, name));
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        crate::xattr::reply_xattr(reply, size, self.list_xattr(ino));
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        reply_empty(reply, self.remove_xattr(ino, name));
    }

    fn access(&self, _req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        reply_empty(reply, self.do_access(ino, mask));
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
        let umask = self.creation_umask(umask);
        match self.do_create(req, parent, name, mode, umask, flags) {
            Ok((attr, made)) => {
                let fh = self.new_fh();
                let uncached = match self.node(attr.ino) {
                    Ok(inode) if made && !self.coherence.sharing.is_shared() => inode.created(fh),
                    // Shared: an appending handle's writes land at the store's end (`write`).
                    Ok(inode)
                        if flags & libc::O_APPEND != 0
                            && self.coherence.sharing.is_shared()
                            && !inode.is_plain() =>
                    {
                        inode.opened_uncached(fh)
                    }
                    Ok(inode) => inode.opened(fh),
                    Err(_) => false,
                };
                let mut fopen = self.coherence.open_flags();
                if uncached {
                    fopen |= FopenFlags::FOPEN_DIRECT_IO;
                }
                reply.created(
                    &self.coherence.entry_ttl(self.ttl, &attr),
                    &attr,
                    Generation(0),
                    FileHandle(fh),
                    fopen,
                )
            }
            Err(e) => reply.error(e),
        }
    }

    fn fallocate(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        reply_empty(reply, self.do_fallocate(req, ino, offset, length, mode));
    }
}
