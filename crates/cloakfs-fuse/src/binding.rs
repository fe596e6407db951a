//! Key binding (Cryptfs, section 3): a mount that serves its plaintext only to the user who
//! mounted it, only to the processes of one Unix session of that user, or (`cloakfs run`)
//! only to the descendants of one process.
//!
//! [`BindingGate`] is the gate (see `gate`) in front of the file system: it checks the caller
//! that the kernel names in each request's header (uid and pid) before the request reaches
//! the file system, so a refused request gets EACCES before anything is looked up or
//! decrypted. The kernel already keeps other users out of a mount without `allow_other`; the
//! binding also holds with `allow_other` and `allow_root`, for root too, and a session
//! binding keeps out the user's own processes in other sessions.
//!
//! Requests the kernel sends on its own behalf are not a caller's: forgetting nodes and
//! releasing handles (never refused: they reveal nothing), and writing back cached pages and
//! their times (uid 0 with pid 0, or from a kernel thread), whose data a bound caller wrote.

use crate::gate::{Op, RequestGate};
use fuser::{Errno, Filesystem, Request};
use rustix::event::{PollFd, PollFlags as PollEventsOf};
use rustix::fd::OwnedFd;
use std::collections::HashSet;
use std::sync::Mutex;

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

/// The gate of a mount with a [`Binding`] (none: every request passes, as the kernel's own
/// checks decide), in front of the file system `handlers`.
pub(crate) struct BindingGate<F> {
    handlers: F,
    binding: Option<Binding>,
    /// A session binding's leader (pid = session ID), as a pidfd: a session ID is only a
    /// number, which a process of the same user can take once the session is gone (fork until
    /// a child gets that pid, then setsid). So the binding holds while this very process
    /// lives, and refuses everyone after it exits.
    leader: Option<OwnedFd>,
    /// Callers (uid, session) whose refusal was logged already: one line each.
    logged: Mutex<HashSet<(u32, Option<u32>)>>,
}

impl<F> BindingGate<F> {
    /// Fails for a session binding whose session has no living leader now: such a session
    /// can be taken over by a process that gets its number.
    pub(crate) fn new(handlers: F, binding: Option<Binding>) -> std::io::Result<Self> {
        let leader = match binding {
            Some(Binding::Session { sid, .. }) => Some(session_leader(sid)?),
            _ => None,
        };
        Ok(Self {
            handlers,
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

    /// Ok if a request of `sender`'s kind from `req`'s caller may reach the file system.
    fn check(&self, req: &Request, sender: Sender) -> Result<(), Errno> {
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

impl<F: Filesystem> RequestGate for BindingGate<F> {
    type Handlers = F;
    type Pass<'a> = &'a F;

    fn whole_mount(&mut self) -> &mut F {
        &mut self.handlers
    }

    /// Every request is checked, but forgetting nodes and releasing handles: the kernel
    /// sends those on its own behalf (at a close, an unmount, under memory pressure) and they
    /// reveal nothing. Setting attributes, writing and syncing may also come from the
    /// kernel writing back what a bound caller cached.
    fn admit<'a>(&'a self, req: &Request, op: Op<'_>) -> Result<&'a F, Errno> {
        let sender = match op {
            Op::Forget { .. } | Op::Release { .. } | Op::Releasedir { .. } => {
                return Ok(&self.handlers)
            }
            Op::Setattr { .. } | Op::Write { .. } | Op::Fsync { .. } => Sender::CallerOrWriteback,
            _ => Sender::Caller,
        };
        self.check(req, sender)?;
        Ok(&self.handlers)
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
