//! Regular files and attributes: open, create, read, fallocate and setattr, all through the
//! node's shared plaintext file.

use crate::attr;
use crate::fs::CloakFs;
use crate::inode::{Inode, Kind};
use crate::sys::{self, errno, Res};
use fuser::{Errno, FileAttr, INodeNo, ReplyData, Request, TimeOrNow};
use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::fs::{AtFlags, Mode, OFlags};
use std::cell::RefCell;
use std::ffi::OsStr;

thread_local! {
    /// A read's blocks, opened in place and sent from there when the reply cannot be built
    /// in its ring entry (/dev/fuse); reused by every read on this worker thread.
    static READ_BUF: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// `__FMODE_EXEC`: the kernel's mark on opens made by execve (passed on in FUSE open flags).
pub(crate) const FMODE_EXEC: i32 = 0x20;

/// Whether a handle opened with `flags` may write (or truncates at open).
pub(crate) fn open_writes(flags: i32) -> bool {
    flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0
}

/// The permission an open with `flags` needs on the backing file: execute for execve, else
/// read and/or write per the access mode (`O_TRUNC` writes).
pub(crate) fn open_access(flags: i32) -> rustix::fs::Access {
    use rustix::fs::Access;
    if flags & FMODE_EXEC != 0 {
        return Access::EXEC_OK;
    }
    let mut a = match flags & libc::O_ACCMODE {
        libc::O_WRONLY => Access::WRITE_OK,
        libc::O_RDWR => Access::READ_OK | Access::WRITE_OK,
        _ => Access::READ_OK,
    };
    if flags & libc::O_TRUNC != 0 {
        a |= Access::WRITE_OK;
    }
    a
}

impl CloakFs {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn do_setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        by_handle: bool,
    ) -> Res<FileAttr> {
        let inode = self.node(ino)?;
        let changes = mode.is_some()
            || uid.is_some()
            || gid.is_some()
            || size.is_some()
            || atime.is_some()
            || mtime.is_some();
        if changes {
            self.writable()?;
        }
        let fd = inode.fd();
        if let Some(mode) = mode {
            if inode.kind == Kind::Symlink {
                return Err(Errno::EOPNOTSUPP);
            }
            inode
                .chmod(Mode::from_raw_mode(mode & 0o7777))
                .map_err(errno)?;
        }
        if uid.is_some() || gid.is_some() {
            rustix::fs::chownat(
                fd,
                "",
                uid.map(rustix::fs::Uid::from_raw),
                gid.map(rustix::fs::Gid::from_raw),
                AtFlags::EMPTY_PATH | AtFlags::SYMLINK_NOFOLLOW,
            )
            .map_err(errno)?;
        }
        if let Some(size) = size {
            self.check_size(size, 0)?;
            if !by_handle {
                // truncate(2) by path may reuse a file someone else opened for writing.
                self.check_access(&inode, rustix::fs::Access::WRITE_OK)?;
            }
            if mode.is_none() {
                self.kill_suidgid_on_change(req, &inode)?;
            }
            if Self::is_plain_file(&inode) {
                self.truncate_plain(&inode, size)?;
            } else {
                self.with_file(&inode, true, |f| f.truncate(size))?;
            }
            if size == 0 {
                inode.emptied();
            }
        }
        if atime.is_some() || mtime.is_some() {
            rustix::fs::utimensat(
                fd,
                "",
                &attr::timestamps(atime, mtime),
                AtFlags::EMPTY_PATH | AtFlags::SYMLINK_NOFOLLOW,
            )
            .map_err(errno)?;
        }
        self.stat(&inode)
    }

    /// Clears setuid, and setgid if group-executable or if `req`'s caller is not in the
    /// file's group, as the kernel would on a write or truncate by a caller without
    /// CAP_FSETID (`setattr_should_drop_suidgid`; FUSE_HANDLE_KILLPRIV_V2 leaves it to us).
    /// Only a daemon that holds CAP_FSETID itself needs to: the backing file system clears
    /// them on the writes and truncates of anyone else.
    pub(crate) fn kill_suidgid(&self, req: &Request, inode: &Inode) -> Res<()> {
        let st = rustix::fs::fstat(inode.fd()).map_err(errno)?;
        let mode = st.st_mode;
        let mut kill = libc::S_ISUID;
        if mode & libc::S_ISGID != 0
            && (mode & libc::S_IXGRP != 0 || !caller_in_group(req, st.st_gid))
        {
            kill |= libc::S_ISGID;
        }
        if mode & kill == 0 {
            return Ok(());
        }
        match inode.chmod(Mode::from_raw_mode(mode & !kill & 0o7777)) {
            Ok(()) => {
                // The kernel keeps the mode it cached (a write's or fallocate's reply carries
                // no attributes): make it ask again, or `stat` shows the bits until the cache
                // times out. A negative offset leaves the page cache alone.
                if let Some(n) = self.pruner.notifier() {
                    let _ = n.inval_inode(fuser::INodeNo(inode.nodeid), -1, 0);
                }
                Ok(())
            }
            // Not the owner and no CAP_FOWNER: then no CAP_FSETID either, so the backing
            // write or truncate clears them.
            Err(rustix::io::Errno::PERM) => Ok(()),
            Err(e) => Err(errno(e)),
        }
    }

    /// [`Self::kill_suidgid`] for a change of contents that is not a write (a truncate by
    /// setattr or an open with O_TRUNC, an fallocate of any mode, as ext4's `file_modified`)
    /// by `req`, when the backing file system would not clear them: the caller lacks
    /// CAP_FSETID (not root) but this daemon holds it.
    fn kill_suidgid_on_change(&self, req: &Request, inode: &Inode) -> Res<()> {
        if self.serves_other_user(req) {
            self.kill_suidgid(req, inode)
        } else {
            Ok(())
        }
    }

    /// Opens file `ino` for handle `fh`.
    pub(crate) fn do_open(&self, req: &Request, ino: INodeNo, fh: u64, flags: i32) -> Res<()> {
        let inode = self.node(ino)?;
        match inode.kind {
            Kind::File => {}
            Kind::Dir => return Err(Errno::EISDIR),
            _ => return Err(Errno::EINVAL),
        }
        let trunc = flags & libc::O_TRUNC != 0;
        let writable = open_writes(flags);
        if writable {
            self.writable()?;
        }
        self.check_access(&inode, open_access(flags))?;
        if trunc {
            self.kill_suidgid_on_change(req, &inode)?;
        }
        if inode.is_plain() {
            return self.open_plain(&inode, fh, writable);
        }
        // A sharing volume's withdrawal replaces the backing file under its name (in this mount
        // or another): ESTALE makes the kernel look the name up again and open the new file, so
        // a withdrawn member gets EACCES there and the old node's cached pages are never served
        // to a new open, even while an older handle still has the old file open.
        if self.codec.key_source().is_wrapped() && inode.replaced() {
            return Err(Errno::ESTALE);
        }
        let mut f = self
            .acquire(&inode, writable)
            .map_err(|e| self.coherence.stale(self.fail(&e, inode.fd(), None)))?;
        let ready = |f: &cloakfs_core::io::file::ContentFile| {
            if trunc {
                f.truncate(0)
            } else {
                self.coherence.opened(&inode, f)
            }
        };
        let mut result = ready(&f);
        if result.as_ref().is_err_and(|e| e.errno() == libc::EIO)
            && self.coherence.sharing.is_shared()
        {
            // Another handle's open file may be one the store's client gave up on reconnecting
            // (see Inode::renew); a fresh one serves this open and the older handles.
            if let Ok(fresh) = inode.renew(&f, &self.codec, self.coherence.sharing) {
                f = fresh;
                result = ready(&f);
            }
        }
        if let Err(e) = result {
            let errno = self.fail(&e, f.backing().as_fd(), None);
            drop(f);
            inode.release();
            return Err(errno);
        }
        if trunc {
            inode.emptied();
        }
        Ok(())
    }

    /// Creates (or, without `O_EXCL`, opens) file `name` in `parent` for a CREATE request;
    /// returns its attributes and whether this request made it.
    pub(crate) fn do_create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
    ) -> Res<(FileAttr, bool)> {
        self.writable()?;
        sys::exact_modes();
        let p = self.node(parent)?;
        if let Some(db) = self.coherence.sqlite_wal_base(name) {
            let beside = self.stored_name(&p, db).is_ok_and(|s| {
                rustix::fs::statat(p.fd(), s.backing(), AtFlags::SYMLINK_NOFOLLOW).is_ok()
            });
            if beside {
                self.coherence.refused_sqlite_wal(name);
                return Err(Errno::EPERM);
            }
        }
        let stored = self.name_for_new(&p, name)?;
        let created = self.write_sidecar(p.fd(), &stored)?;
        let oflags = OFlags::CREATE | OFlags::RDWR | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let open = |oflags: OFlags| {
            sys::with_umask(umask, |mask| {
                let perm = Mode::from_raw_mode(mode & 0o7777 & mask);
                rustix::fs::openat(p.fd(), stored.backing(), oflags, perm)
            })
        };
        // Exclusive even when the caller did not ask, so that a new file is known to be new
        // (see `Inode::created`); a file that exists after all is opened as asked. Shared,
        // the new file has its header before its name appears (see `create_with_header`).
        let header = if self.coherence.sharing.is_shared() {
            cloakfs_core::io::file::new_file_header(&self.codec, &self.default_recipients(&p))
                .map_err(|e| Errno::from_i32(e.errno()))?
        } else {
            None
        };
        let with_header = match &header {
            Some(h) => sys::with_umask(umask, |mask| {
                let perm = Mode::from_raw_mode(mode & 0o7777 & mask);
                create_with_header(p.fd(), stored.backing(), oflags, perm, h)
            }),
            None => Ok(None),
        };
        let mut opened = match with_header {
            Ok(Some(fd)) => Ok(fd),
            Ok(None) => open(oflags | OFlags::EXCL),
            Err(e) => Err(e),
        }
        .map_err(|e| exclusive_failure(p.fd(), stored.backing(), e))
        .map(|fd| (fd, true));
        if flags & libc::O_EXCL == 0 && opened.as_ref().err() == Some(&rustix::io::Errno::EXIST) {
            opened = open(oflags).map(|fd| (fd, false));
        }
        let (fd, made) = match opened {
            Ok(fd) => fd,
            Err(e)
                if flags & libc::O_ACCMODE == libc::O_RDONLY
                    && matches!(e, rustix::io::Errno::ACCESS | rustix::io::Errno::PERM) =>
            {
                // An existing file we may only read: open it like open(2) would.
                let (inode, attr) = self
                    .lookup_backing(&p, stored.backing(), name, None)
                    .map_err(|_| errno(e))?;
                if inode.kind != Kind::File {
                    self.inodes.forget(inode.nodeid, 1);
                    return Err(Errno::EISDIR);
                }
                if let Err(e) = self.check_access(&inode, rustix::fs::Access::READ_OK) {
                    self.inodes.forget(inode.nodeid, 1);
                    return Err(e);
                }
                if let Err(e) = self.acquire(&inode, false) {
                    self.inodes.forget(inode.nodeid, 1);
                    return Err(self.fail(&e, inode.fd(), None));
                }
                return Ok((attr, false));
            }
            Err(e) => {
                if created {
                    self.remove_sidecar(p.fd(), &stored);
                }
                return Err(errno(e));
            }
        };
        if let Some((uid, gid)) = self.new_owner(req, &p) {
            rustix::fs::fchown(
                &fd,
                Some(rustix::fs::Uid::from_raw(uid)),
                gid.map(rustix::fs::Gid::from_raw),
            )
            .map_err(errno)?;
        }
        let (held, m) = self.hold_created(&p, stored.backing(), fd.as_fd())?;
        let (inode, attr) = self.lookup_stated(held, &m, &p, name)?;
        let file = match inode.install(&self.codec, self.coherence.sharing, fd, &m) {
            Ok(f) => f,
            Err(e) => {
                self.inodes.forget(inode.nodeid, 1);
                return Err(self.fail(&e, inode.fd(), None));
            }
        };
        if let Err(e) = file.inherit(&self.default_recipients(&p)) {
            tracing::warn!("{}: default recipients: {e}", sys::describe(inode.fd()));
        }
        if flags & libc::O_TRUNC == 0 || file.size() == 0 {
            return Ok((attr, made));
        }
        // An existing file opened with O_TRUNC.
        let truncated = self.kill_suidgid_on_change(req, &inode).and_then(|()| {
            file.truncate(0)
                .map_err(|e| self.fail(&e, file.backing().as_fd(), None))
        });
        if let Err(errno) = truncated {
            drop(file);
            inode.release();
            self.inodes.forget(inode.nodeid, 1);
            return Err(errno);
        }
        inode.emptied();
        Ok((self.stat(&inode)?, false))
    }

    pub(crate) fn do_read(&self, ino: INodeNo, offset: u64, size: u32, reply: ReplyData) {
        let inode = match self.node(ino) {
            Ok(i) => i,
            Err(e) => return reply.error(e),
        };
        let size = size as usize;
        READ_BUF.with_borrow_mut(|scratch| {
            crate::uring::with_reply_buffer(|ring| {
                let read = self.with_file(&inode, false, |f| {
                    let room = f.read_room(size);
                    match ring {
                        // Built where the ring sends it from: no copy of the reply.
                        Some(buf) if buf.len() >= room => {
                            let got = f.read_to(offset, size, buf)?;
                            if got.start > 0 {
                                buf.copy_within(got.clone(), 0);
                            }
                            Ok((buf, 0..got.len()))
                        }
                        _ => {
                            let got = f.read_into(offset, size, scratch)?;
                            Ok((scratch.as_mut_slice(), got))
                        }
                    }
                });
                match read {
                    Ok((buf, got)) => reply.data(&buf[got]),
                    Err(e) => reply.error(e),
                }
            })
        });
    }

    pub(crate) fn do_fallocate(
        &self,
        req: &Request,
        ino: INodeNo,
        offset: u64,
        length: u64,
        mode: i32,
    ) -> Res<()> {
        const KEEP: i32 = libc::FALLOC_FL_KEEP_SIZE;
        const PUNCH: i32 = libc::FALLOC_FL_PUNCH_HOLE;
        const ZERO: i32 = libc::FALLOC_FL_ZERO_RANGE;
        self.writable()?;
        if !matches!(mode, 0 | KEEP | ZERO) && mode != PUNCH | KEEP && mode != ZERO | KEEP {
            return Err(Errno::EOPNOTSUPP);
        }
        self.check_size(offset, length)?;
        let end = offset + length;
        let inode = self.node(ino)?;
        self.kill_suidgid_on_change(req, &inode)?;
        if Self::is_plain_file(&inode) {
            return self.fallocate_plain(&inode, offset, length, mode);
        }
        self.with_file(&inode, true, |f| match mode {
            0 => f.allocate(offset, length, false),
            KEEP => f.allocate(offset, length, true),
            m if m & ZERO != 0 => {
                // Zeros in place, and growth (unless KEEP_SIZE) reads as zeros too.
                f.punch_hole(offset, length)?;
                if m & KEEP == 0 && end > f.size() {
                    f.truncate(end)?;
                }
                Ok(())
            }
            _ => f.punch_hole(offset, length),
        })
    }
}

/// Prefix of a file being created with its header (internal: never listed; see
/// [`create_with_header`]).
const NEW_FILE_PREFIX: &str = "cloakfs.tmp.new.";

/// Makes regular file `backing` in `dir` (opened with `oflags` and `perm`) with `header`
/// already written, for a store shared with other clients: a file's header is written once,
/// and a client that found the file empty and wrote its own while another wrote blocks under
/// the first would leave them failing authentication (SFTP has no locks to prevent it). So
/// the header goes into a temporary file first, which is then hard-linked under the name (a
/// link never replaces a name: EEXIST if the name exists) and unlinked: the name never shows
/// an empty file. `Ok(None)` if the store makes no hard links: the caller creates the file as
/// it would alone.
pub(crate) fn create_with_header(
    dir: BorrowedFd<'_>,
    backing: &str,
    oflags: OFlags,
    perm: Mode,
    header: &[u8],
) -> rustix::io::Result<Option<OwnedFd>> {
    use rustix::io::Errno as E;
    let tmp = format!(
        "{NEW_FILE_PREFIX}{:016x}",
        u64::from_le_bytes(cloakfs_core::crypto::random::array())
    );
    let fd = rustix::fs::openat(dir, tmp.as_str(), oflags | OFlags::EXCL, perm)?;
    // A FUSE store (sshfs) sees the two names as two files: the file is opened again under
    // its own name. The temporary is removed while still open: such a store keeps it under a
    // hidden name until the close, which then reaches it after the removal (a close racing
    // the removal could leave the hidden file for good). Where the name cannot be opened
    // so (a new read-only file, for a caller who may not write it), the first open serves.
    let linked = write_all_at(fd.as_fd(), header)
        .and_then(|()| rustix::fs::linkat(dir, tmp.as_str(), dir, backing, AtFlags::empty()));
    let named = linked
        .is_ok()
        .then(|| rustix::fs::openat(dir, backing, oflags - OFlags::CREATE, perm).ok())
        .flatten();
    if let Err(e) = rustix::fs::unlinkat(dir, tmp.as_str(), AtFlags::empty()) {
        tracing::warn!(
            "{}: removing the temporary {tmp} of a create: {e}",
            sys::describe(dir)
        );
    }
    match linked {
        Ok(()) => Ok(Some(named.unwrap_or(fd))),
        Err(E::NOSYS | E::OPNOTSUPP | E::PERM | E::XDEV | E::MLINK)
            if rustix::fs::statat(dir, backing, AtFlags::SYMLINK_NOFOLLOW).is_err() =>
        {
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// Writes all of `bytes` at offset 0 of `fd`.
fn write_all_at(fd: BorrowedFd<'_>, bytes: &[u8]) -> rustix::io::Result<()> {
    let mut done = 0;
    while done < bytes.len() {
        match rustix::io::pwrite(fd, &bytes[done..], done as u64) {
            Ok(0) => return Err(rustix::io::Errno::IO),
            Ok(n) => done += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The error of an exclusive create of `backing` in `dir`: EEXIST if the name exists. A store
/// may say otherwise when another client made the name a moment before: sshfs answers EPERM
/// (SFTP v3 has no "file exists", only a generic failure), which would fail an `open(O_CREAT)`
/// that must open the other client's file.
pub(crate) fn exclusive_failure(
    dir: BorrowedFd<'_>,
    backing: &str,
    e: rustix::io::Errno,
) -> rustix::io::Errno {
    use rustix::io::Errno as E;
    if matches!(e, E::PERM | E::ACCESS)
        && rustix::fs::statat(dir, backing, AtFlags::SYMLINK_NOFOLLOW).is_ok()
    {
        E::EXIST
    } else {
        e
    }
}

/// Whether `req`'s caller has group `gid` as its primary or a supplementary group (read from
/// /proc only here, where a set-gid file without group execute is being written).
fn caller_in_group(req: &Request, gid: u32) -> bool {
    req.gid() == gid
        || crate::creds::Creds::of_caller(req.uid(), req.gid(), req.pid())
            .groups
            .contains(&gid)
}
