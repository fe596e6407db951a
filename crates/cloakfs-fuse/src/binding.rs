//! Key binding (Cryptfs, section 3): a mount that serves its plaintext only to the user who
//! mounted it, only to the processes of one Unix session of that user, or (`cloakfs run`)
//! only to the descendants of one process.
//!
//! [`Bound`] wraps the file system and checks the caller that the kernel names in each
//! request's header (uid and pid) before the request reaches the file system, so a refused
//! request gets EACCES before anything is looked up or decrypted. The kernel already keeps
//! other users out of a mount without `allow_other`; the binding also holds with
//! `allow_other` and `allow_root`, for root too, and a session binding keeps out the user's
//! own processes in other sessions.
//!
//! Requests the kernel sends on its own behalf are not a caller's: forgetting nodes and
//! releasing handles (never refused: they reveal nothing), and writing back cached pages and
//! their times (uid 0 with pid 0, or from a kernel thread), whose data a bound caller wrote.

use fuser::{
    AccessFlags, BsdFileFlags, CopyFileRangeFlags, Errno, FileHandle, Filesystem, INodeNo,
    IoctlFlags, KernelConfig, LockOwner, OpenFlags, PollEvents, PollFlags, PollNotifier,
    RenameFlags, ReplyAttr, ReplyBmap, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus,
    ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyLock, ReplyLseek, ReplyOpen, ReplyPoll, ReplyStatfs,
    ReplyWrite, ReplyXattr, Request, SetXAttrFlags, TimeOrNow, WriteFlags,
};
use rustix::event::{PollFd, PollFlags as PollEventsOf};
use rustix::fd::OwnedFd;
use std::collections::HashSet;
use std::ffi::OsStr;
use std::path::Path;
use std::sync::Mutex;
use std::time::SystemTime;

/// Whom a mount serves (`cloakfs mount --bind user|session`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Binding {
    /// Only processes running as `uid`.
    User { uid: u32 },
    /// Only processes running as `uid` in Unix session `sid`.
    Session { uid: u32, sid: u32 },
    /// Only processes running as `uid` that descend from process `ancestor` (`cloakfs run`,
    /// a child subreaper, so that what COMMAND leaves behind is reparented below it). A
    /// process of the same user outside that tree that reaches the view through
    /// `/proc/PID/root` or `/proc/PID/cwd` of one inside, or enters its namespaces with
    /// `nsenter`, is refused: it does not descend from `ancestor`.
    Tree { uid: u32, ancestor: u32 },
}

impl Binding {
    /// Bound to the calling process's real user.
    pub fn this_user() -> Self {
        Binding::User {
            uid: rustix::process::getuid().as_raw(),
        }
    }

    /// Bound to the calling process's real user and Unix session. Call it before
    /// daemonizing: the daemon leads a session of its own.
    pub fn this_session() -> std::io::Result<Self> {
        let sid = rustix::process::getsid(None)?;
        Ok(Binding::Session {
            uid: rustix::process::getuid().as_raw(),
            sid: sid.as_raw_nonzero().get() as u32,
        })
    }

    /// Whether a request from `uid` and `pid` (the request header's) is one this mount
    /// serves.
    fn admits(&self, uid: u32, pid: u32) -> bool {
        match *self {
            Binding::User { uid: bound } => uid == bound,
            Binding::Session { uid: bound, sid } => {
                uid == bound && pid != 0 && session_of(pid) == Some(sid)
            }
            Binding::Tree {
                uid: bound,
                ancestor,
            } => uid == bound && pid != 0 && descends_from(pid, ancestor),
        }
    }
}

impl std::fmt::Display for Binding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Binding::User { uid } => write!(f, "user {uid}"),
            Binding::Session { uid, sid } => write!(f, "session {sid} of user {uid}"),
            Binding::Tree { uid, ancestor } => {
                write!(f, "the processes of user {uid} below process {ancestor}")
            }
        }
    }
}

/// The Unix session of process (or thread) `pid`.
fn session_of(pid: u32) -> Option<u32> {
    let pid = rustix::process::Pid::from_raw(i32::try_from(pid).ok()?)?;
    rustix::process::getsid(Some(pid))
        .ok()
        .map(|s| s.as_raw_nonzero().get() as u32)
}

/// A pidfd of session `sid`'s leader, checked to lead that session after it was opened (so
/// the pidfd names the leader, not a process that took the number later).
fn session_leader(sid: u32) -> std::io::Result<OwnedFd> {
    let gone = |why: String| {
        std::io::Error::other(format!(
            "session {sid} has no leader any more ({why}; a session without its leader can be \
             taken over by any process that gets its number): mount from a session whose \
             leader runs, or use --bind user"
        ))
    };
    let pid = i32::try_from(sid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
        .ok_or_else(|| gone("no such process ID".into()))?;
    let fd = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty())
        .map_err(|e| gone(format!("process {sid}: {e}")))?;
    match session_of(sid) {
        Some(s) if s == sid => Ok(fd),
        other => Err(gone(format!(
            "process {sid} is in session {}",
            other.map_or("-".into(), |s| s.to_string())
        ))),
    }
}

/// The parent of the process that thread `tid` belongs to (field 4 of /proc/TID/stat).
fn parent_of(tid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{tid}/stat")).ok()?;
    // After the command name (which may hold spaces and parentheses): state, ppid.
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Whether thread `tid` belongs to a strict descendant of process `ancestor`. A process
/// reparented to `ancestor` (a subreaper) counts; one reparented to init does not.
fn descends_from(tid: u32, ancestor: u32) -> bool {
    // Deeper than any process tree a command makes; a loop of bad reads ends here too.
    const DEPTH: usize = 4096;
    let Some(mut p) = parent_of(tid) else {
        return false;
    };
    for _ in 0..DEPTH {
        if p == ancestor {
            return true;
        }
        if p <= 1 {
            return false;
        }
        match parent_of(p) {
            Some(next) => p = next,
            None => return false,
        }
    }
    false
}

/// Whether `pid` is a kernel thread (PF_KTHREAD in /proc/PID/stat's flags).
fn is_kernel_thread(pid: u32) -> bool {
    const PF_KTHREAD: u64 = 0x0020_0000;
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // Fields after the command name (which may hold spaces and parentheses): state, ppid,
    // pgrp, session, tty_nr, tpgid, flags.
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().nth(6))
        .and_then(|f| f.parse::<u64>().ok())
        .is_some_and(|flags| flags & PF_KTHREAD != 0)
}

/// Who may send a kind of request.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Sender {
    /// Only a bound caller.
    Caller,
    /// A bound caller, or the kernel writing back what a bound caller cached.
    CallerOrWriteback,
}

/// A file system whose every request is checked against a [`Binding`] first (none: all
/// pass, as the kernel's own checks decide).
pub(crate) struct Bound<F> {
    inner: F,
    binding: Option<Binding>,
    /// A session binding's leader (pid = session ID), as a pidfd: a session ID is only a
    /// number, which a process of the same user can take once the session is gone (fork until
    /// a child gets that pid, then setsid). So the binding holds while this very process
    /// lives, and refuses everyone after it exits.
    leader: Option<OwnedFd>,
    /// Callers (uid, session) whose refusal was logged already: one line each.
    logged: Mutex<HashSet<(u32, Option<u32>)>>,
}

impl<F> Bound<F> {
    /// Fails for a session binding whose session has no living leader now: such a session
    /// can be taken over by a process that gets its number.
    pub(crate) fn new(inner: F, binding: Option<Binding>) -> std::io::Result<Self> {
        let leader = match binding {
            Some(Binding::Session { sid, .. }) => Some(session_leader(sid)?),
            _ => None,
        };
        Ok(Self {
            inner,
            binding,
            leader,
            logged: Mutex::new(HashSet::new()),
        })
    }

    /// Whether the bound session's leader has exited (never, without a session binding).
    fn session_ended(&self) -> bool {
        let Some(fd) = &self.leader else {
            return false;
        };
        let mut fds = [PollFd::new(fd, PollEventsOf::IN)];
        let zero = rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // A pidfd polls readable once its process has exited.
        match rustix::event::poll(&mut fds, Some(&zero)) {
            Ok(n) => n > 0,
            Err(_) => true,
        }
    }

    /// Ok if `req` may reach the file system.
    fn admit(&self, req: &Request, sender: Sender) -> Result<(), Errno> {
        let Some(b) = &self.binding else {
            return Ok(());
        };
        let (uid, pid) = (req.uid(), req.pid());
        if b.admits(uid, pid) && !self.session_ended() {
            return Ok(());
        }
        if sender == Sender::CallerOrWriteback && uid == 0 && (pid == 0 || is_kernel_thread(pid)) {
            return Ok(());
        }
        let sid = session_of(pid);
        let first = self
            .logged
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert((uid, sid));
        if first {
            let ended = if self.session_ended() {
                " (and that session has ended: unmount it)"
            } else {
                ""
            };
            tracing::warn!(
                "refused uid {uid} (pid {pid}, session {}): this mount serves {b} only{ended}",
                sid.map_or("-".to_string(), |s| s.to_string())
            );
        }
        Err(Errno::EACCES)
    }
}

/// Replies EACCES and returns if the binding refuses the request.
macro_rules! admit {
    ($self:ident, $req:ident, $reply:ident) => {
        admit!($self, $req, $reply, Sender::Caller)
    };
    ($self:ident, $req:ident, $reply:ident, $sender:expr) => {
        if let Err(e) = $self.admit($req, $sender) {
            return $reply.error(e);
        }
    };
}

impl<F: Filesystem> Filesystem for Bound<F> {
    fn init(&mut self, req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        self.inner.init(req, config)
    }

    fn destroy(&mut self) {
        self.inner.destroy()
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        admit!(self, req, reply);
        self.inner.lookup(req, parent, name, reply)
    }

    fn forget(&self, req: &Request, ino: INodeNo, nlookup: u64) {
        self.inner.forget(req, ino, nlookup)
    }

    fn getattr(&self, req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        admit!(self, req, reply);
        self.inner.getattr(req, ino, fh, reply)
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
        admit!(self, req, reply, Sender::CallerOrWriteback);
        self.inner.setattr(
            req, ino, mode, uid, gid, size, atime, mtime, ctime, fh, crtime, chgtime, bkuptime,
            flags, reply,
        )
    }

    fn readlink(&self, req: &Request, ino: INodeNo, reply: ReplyData) {
        admit!(self, req, reply);
        self.inner.readlink(req, ino, reply)
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
        admit!(self, req, reply);
        self.inner
            .mknod(req, parent, name, mode, umask, rdev, reply)
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
        admit!(self, req, reply);
        self.inner.mkdir(req, parent, name, mode, umask, reply)
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        admit!(self, req, reply);
        self.inner.unlink(req, parent, name, reply)
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        admit!(self, req, reply);
        self.inner.rmdir(req, parent, name, reply)
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        admit!(self, req, reply);
        self.inner.symlink(req, parent, link_name, target, reply)
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
        admit!(self, req, reply);
        self.inner
            .rename(req, parent, name, newparent, newname, flags, reply)
    }

    fn link(
        &self,
        req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        admit!(self, req, reply);
        self.inner.link(req, ino, newparent, newname, reply)
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        admit!(self, req, reply);
        self.inner.open(req, ino, flags, reply)
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
        admit!(self, req, reply);
        self.inner
            .read(req, ino, fh, offset, size, flags, lock_owner, reply)
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
        admit!(self, req, reply, Sender::CallerOrWriteback);
        self.inner.write(
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
        admit!(self, req, reply);
        self.inner.flush(req, ino, fh, lock_owner, reply)
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
        self.inner
            .release(req, ino, fh, flags, lock_owner, flush, reply)
    }

    fn fsync(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        admit!(self, req, reply, Sender::CallerOrWriteback);
        self.inner.fsync(req, ino, fh, datasync, reply)
    }

    fn opendir(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        admit!(self, req, reply);
        self.inner.opendir(req, ino, flags, reply)
    }

    fn readdir(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        reply: ReplyDirectory,
    ) {
        admit!(self, req, reply);
        self.inner.readdir(req, ino, fh, offset, reply)
    }

    fn readdirplus(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        reply: ReplyDirectoryPlus,
    ) {
        admit!(self, req, reply);
        self.inner.readdirplus(req, ino, fh, offset, reply)
    }

    fn releasedir(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.inner.releasedir(req, ino, fh, flags, reply)
    }

    fn fsyncdir(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        admit!(self, req, reply);
        self.inner.fsyncdir(req, ino, fh, datasync, reply)
    }

    fn statfs(&self, req: &Request, ino: INodeNo, reply: ReplyStatfs) {
        admit!(self, req, reply);
        self.inner.statfs(req, ino, reply)
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
        admit!(self, req, reply);
        self.inner.setxattr(
            req,
            ino,
            name,
            value,
            flags,
            position,
            setxattr_flags,
            reply,
        )
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        admit!(self, req, reply);
        self.inner.getxattr(req, ino, name, size, reply)
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        admit!(self, req, reply);
        self.inner.listxattr(req, ino, size, reply)
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        admit!(self, req, reply);
        self.inner.removexattr(req, ino, name, reply)
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        admit!(self, req, reply);
        self.inner.access(req, ino, mask, reply)
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
        admit!(self, req, reply);
        self.inner
            .create(req, parent, name, mode, umask, flags, reply)
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
        admit!(self, req, reply);
        self.inner
            .getlk(req, ino, fh, lock_owner, start, end, typ, pid, reply)
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
        admit!(self, req, reply);
        self.inner
            .setlk(req, ino, fh, lock_owner, start, end, typ, pid, sleep, reply)
    }

    fn bmap(&self, req: &Request, ino: INodeNo, blocksize: u32, idx: u64, reply: ReplyBmap) {
        admit!(self, req, reply);
        self.inner.bmap(req, ino, blocksize, idx, reply)
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
        admit!(self, req, reply);
        self.inner
            .ioctl(req, ino, fh, flags, cmd, in_data, out_size, reply)
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
        admit!(self, req, reply);
        self.inner.poll(req, ino, fh, ph, events, flags, reply)
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
        admit!(self, req, reply);
        self.inner
            .fallocate(req, ino, fh, offset, length, mode, reply)
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
        admit!(self, req, reply);
        self.inner.lseek(req, ino, fh, offset, whence, reply)
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
        admit!(self, req, reply);
        self.inner.copy_file_range(
            req, ino_in, fh_in, offset_in, ino_out, fh_out, offset_out, len, flags, reply,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_and_session() {
        let me = rustix::process::getpid().as_raw_nonzero().get() as u32;
        let Binding::Session { uid, sid } = Binding::this_session().unwrap() else {
            unreachable!()
        };
        let b = Binding::Session { uid, sid };
        assert!(b.admits(uid, me));
        assert!(!b.admits(uid.wrapping_add(1), me));
        assert!(!b.admits(uid, 0));
        assert!(!Binding::Session { uid, sid: sid + 1 }.admits(uid, me));
        assert!(Binding::User { uid }.admits(uid, 0));
        assert!(!Binding::User { uid }.admits(uid + 1, me));
    }

    #[test]
    fn kernel_threads() {
        // kthreadd is pid 2 in the initial pid namespace; this process is not a kernel thread.
        let me = rustix::process::getpid().as_raw_nonzero().get() as u32;
        assert!(!is_kernel_thread(me));
        if std::fs::read_to_string("/proc/2/comm").is_ok_and(|c| c.trim() == "kthreadd") {
            assert!(is_kernel_thread(2));
        }
        assert!(!is_kernel_thread(u32::MAX));
    }
}
