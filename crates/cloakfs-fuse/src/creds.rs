//! Per-thread file-system credentials for the multi-user tree.
//!
//! A request on an attach runs on its worker thread with the file-system uid, gid and
//! supplementary groups of the user it is done for, so that every permission check on the
//! backing objects is the kernel's own. Linux keeps these per thread; the raw system calls
//! change only the calling thread (glibc's `setgroups` would change every thread of the
//! process). While the fsuid is not 0 the kernel also drops the thread's file-system
//! capabilities (DAC override and friends), and gives them back when it returns to 0.

use rustix::process::Gid;
use std::io;
use std::marker::PhantomData;
use std::sync::OnceLock;

/// The identity a request runs as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Creds {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
}

impl Creds {
    /// The sender of a request: uid and gid from the request header, supplementary groups
    /// from `/proc/PID/status`. When the process is gone, or no longer has that uid and gid
    /// as its file-system ids, it gets no supplementary groups (only the primary group).
    pub(crate) fn of_caller(uid: u32, gid: u32, pid: u32) -> Self {
        let groups = if pid == 0 {
            None
        } else {
            std::fs::read_to_string(format!("/proc/{pid}/status"))
                .ok()
                .and_then(|s| groups_of_status(&s, uid, gid))
        };
        Self {
            uid,
            gid,
            groups: groups.unwrap_or_default(),
        }
    }
}

/// The `Groups:` of a `/proc/PID/status` text, if its file-system uid and gid (fourth field
/// of `Uid:` and `Gid:`) are `uid` and `gid`.
fn groups_of_status(status: &str, uid: u32, gid: u32) -> Option<Vec<u32>> {
    let fs_id = |rest: &str| rest.split_whitespace().nth(3)?.parse::<u32>().ok();
    let (mut uid_ok, mut gid_ok, mut groups) = (false, false, None);
    for line in status.lines() {
        if let Some(rest) = line.strip_prefix("Uid:") {
            uid_ok = fs_id(rest) == Some(uid);
        } else if let Some(rest) = line.strip_prefix("Gid:") {
            gid_ok = fs_id(rest) == Some(gid);
        } else if let Some(rest) = line.strip_prefix("Groups:") {
            groups = rest
                .split_whitespace()
                .map(|g| g.parse::<u32>().ok())
                .collect::<Option<Vec<_>>>();
        }
    }
    if uid_ok && gid_ok {
        groups
    } else {
        None
    }
}

/// The daemon's own file-system identity, restored after every request.
struct Original {
    uid: u32,
    gid: u32,
    groups: Vec<Gid>,
}

fn original() -> &'static Original {
    static ORIGINAL: OnceLock<Original> = OnceLock::new();
    // First called before any switch (and every switch is undone before its guard goes),
    // so any thread sees the daemon's own ids here.
    ORIGINAL.get_or_init(|| Original {
        uid: rustix::process::geteuid().as_raw(),
        gid: rustix::process::getegid().as_raw(),
        groups: rustix::process::getgroups().unwrap_or_default(),
    })
}

/// Records the daemon's identity now, before any worker thread switches.
pub(crate) fn init() {
    original();
}

#[cfg(any(target_arch = "x86", target_arch = "arm", target_arch = "sparc"))]
const SYS_SETFSUID: libc::c_long = libc::SYS_setfsuid32;
#[cfg(any(target_arch = "x86", target_arch = "arm", target_arch = "sparc"))]
const SYS_SETFSGID: libc::c_long = libc::SYS_setfsgid32;
#[cfg(not(any(target_arch = "x86", target_arch = "arm", target_arch = "sparc")))]
const SYS_SETFSUID: libc::c_long = libc::SYS_setfsuid;
#[cfg(not(any(target_arch = "x86", target_arch = "arm", target_arch = "sparc")))]
const SYS_SETFSGID: libc::c_long = libc::SYS_setfsgid;

/// Sets this thread's fsuid or fsgid (per `nr`) and verifies it: the call reports no error,
/// but asking with the invalid id -1 returns the current one.
fn set_fs_id(nr: libc::c_long, id: u32) -> io::Result<()> {
    // SAFETY: setfsuid/setfsgid take one integer and change only the calling thread's
    // credentials; no memory is passed.
    unsafe { libc::syscall(nr, libc::c_long::from(id)) };
    // SAFETY: as above; -1 is an invalid id, so nothing changes and the current id returns.
    let now = unsafe { libc::syscall(nr, -1 as libc::c_long) };
    if now as u32 == id {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(libc::EPERM))
    }
}

fn set_groups(groups: &[Gid]) -> io::Result<()> {
    rustix::thread::set_thread_groups(groups).map_err(io::Error::from)
}

/// This thread runs with switched file-system credentials while the guard lives;
/// dropping it (also while unwinding) restores the daemon's. Not `Send`: the credentials
/// belong to the thread.
#[must_use]
pub struct CredGuard {
    _thread: PhantomData<*const ()>,
}

impl CredGuard {
    /// Switches this thread's file-system identity to `c`.
    pub fn switch(c: &Creds) -> io::Result<Self> {
        let _ = original();
        let groups: Vec<Gid> = c.groups.iter().map(|&g| Gid::from_raw(g)).collect();
        // Groups first: setting them needs CAP_SETGID, which does not depend on the fsuid,
        // but this way no step runs with a half-switched identity that keeps capabilities.
        set_groups(&groups)?;
        let guard = CredGuard {
            _thread: PhantomData,
        };
        // From here on the guard undoes whatever was changed, also on failure.
        set_fs_id(SYS_SETFSGID, c.gid)?;
        set_fs_id(SYS_SETFSUID, c.uid)?;
        Ok(guard)
    }
}

impl Drop for CredGuard {
    fn drop(&mut self) {
        let o = original();
        let restored = set_fs_id(SYS_SETFSUID, o.uid)
            .and_then(|()| set_fs_id(SYS_SETFSGID, o.gid))
            .and_then(|()| set_groups(&o.groups));
        if let Err(e) = restored {
            // A worker left with another user's identity would serve the next request
            // with it: stopping is the only safe answer.
            tracing::error!("cannot restore the daemon's credentials on a worker thread: {e}");
            std::process::abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_groups() {
        let s = "Name:\tsh\nUid:\t1000\t1000\t1000\t1000\nGid:\t100\t100\t100\t100\n\
                 Groups:\t100 27 4 \n";
        assert_eq!(groups_of_status(s, 1000, 100), Some(vec![100, 27, 4]));
        assert_eq!(groups_of_status(s, 1001, 100), None);
        assert_eq!(groups_of_status(s, 1000, 101), None);
        let none = "Uid:\t0\t0\t0\t0\nGid:\t0\t0\t0\t0\nGroups:\t\n";
        assert_eq!(groups_of_status(none, 0, 0), Some(vec![]));
    }
}
