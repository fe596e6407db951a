//! Who a caller is (SO_PEERCRED, /proc, the user database) and acting as them on the file
//! system (per-thread fsuid/fsgid/groups).

use crate::registry::Ids;
use rustix::fd::{AsFd, AsRawFd};
use std::ffi::CStr;
use std::io;

/// A control-socket peer, as the kernel reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer {
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
}

/// The peer of a connected Unix socket (SO_PEERCRED: fixed at connect time). A peer whose
/// pid is not visible here (another pid namespace: pid 0) is refused.
pub fn peer_cred(sock: impl AsFd) -> io::Result<Peer> {
    let mut c = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `c` and `len` are valid out-parameters of the sizes given; the descriptor is
    // borrowed for the call.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_fd().as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut c as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    let pid = u32::try_from(c.pid)
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::PermissionDenied,
                "the peer's process is not visible to the daemon (another pid namespace)",
            )
        })?;
    Ok(Peer {
        uid: c.uid,
        gid: c.gid,
        pid,
    })
}

/// The Unix session id of `pid` (None if unknown or outside our pid namespace).
pub fn session_of(pid: u32) -> Option<u32> {
    let pid = i32::try_from(pid).ok().filter(|p| *p > 0)?;
    // SAFETY: getsid has no memory arguments.
    let sid = unsafe { libc::getsid(pid) };
    u32::try_from(sid).ok().filter(|s| *s > 0)
}

/// One `Name:` line of /proc/<pid>/status, split into numbers.
fn status_numbers(pid: u32, field: &str) -> Option<Vec<u32>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = text.lines().find(|l| l.starts_with(field))?;
    Some(
        line[field.len()..]
            .split_whitespace()
            .filter_map(|n| n.parse().ok())
            .collect(),
    )
}

/// The supplementary groups of process (or thread) `pid`.
pub fn groups_of(pid: u32) -> Option<Vec<u32>> {
    status_numbers(pid, "Groups:")
}

/// The thread group (process) id of thread `pid`.
pub fn tgid_of(pid: u32) -> Option<u32> {
    status_numbers(pid, "Tgid:")?.first().copied()
}

/// A caller whose session, process and groups are looked up on first need, once.
pub struct ProcIds {
    uid: u32,
    gid: u32,
    pid: u32,
    sid: Option<Option<u32>>,
    tgid: Option<Option<u32>>,
    groups: Option<Vec<u32>>,
}

impl ProcIds {
    pub fn new(uid: u32, gid: u32, pid: u32) -> Self {
        Self {
            uid,
            gid,
            pid,
            sid: None,
            tgid: None,
            groups: None,
        }
    }
}

impl From<Peer> for ProcIds {
    fn from(p: Peer) -> Self {
        ProcIds::new(p.uid, p.gid, p.pid)
    }
}

impl Ids for ProcIds {
    fn uid(&self) -> u32 {
        self.uid
    }
    fn gid(&self) -> u32 {
        self.gid
    }
    fn pid(&self) -> u32 {
        self.pid
    }
    fn tgid(&mut self) -> Option<u32> {
        let pid = self.pid;
        *self.tgid.get_or_insert_with(|| tgid_of(pid))
    }
    fn sid(&mut self) -> Option<u32> {
        let pid = self.pid;
        *self.sid.get_or_insert_with(|| session_of(pid))
    }
    fn in_group(&mut self, gid: u32) -> bool {
        let pid = self.pid;
        self.groups
            .get_or_insert_with(|| groups_of(pid).unwrap_or_default())
            .contains(&gid)
    }
}

/// What the user database says about a uid.
#[derive(Debug, Clone)]
pub struct UserInfo {
    pub name: String,
    pub gid: u32,
    pub groups: Vec<u32>,
    pub home: String,
}

/// getpwuid_r and getgrouplist for `uid`.
pub fn user_info(uid: u32) -> io::Result<UserInfo> {
    let mut buf = vec![0u8; 16 * 1024];
    // SAFETY: zeroed `passwd` is a valid out-parameter (plain C struct of pointers/ints).
    let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
    let mut result: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the call and `buf` outlives every use of `pw`.
    let rc = unsafe {
        libc::getpwuid_r(
            uid,
            &mut pw,
            buf.as_mut_ptr().cast(),
            buf.len(),
            &mut result,
        )
    };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    if result.is_null() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("no user with uid {uid}"),
        ));
    }
    // SAFETY: on success pw_name and pw_dir point to NUL-terminated strings inside `buf`.
    let (name, home) = unsafe {
        (
            CStr::from_ptr(pw.pw_name).to_owned(),
            CStr::from_ptr(pw.pw_dir).to_string_lossy().into_owned(),
        )
    };
    let gid = pw.pw_gid;
    let mut n: libc::c_int = 64;
    let mut groups: Vec<libc::gid_t> = vec![0; n as usize];
    loop {
        let mut count = n;
        // SAFETY: `groups` has room for `count` entries; `name` is NUL-terminated.
        let rc = unsafe { libc::getgrouplist(name.as_ptr(), gid, groups.as_mut_ptr(), &mut count) };
        if rc >= 0 {
            groups.truncate(count.max(0) as usize);
            break;
        }
        if count <= n || count > 65536 {
            groups.clear();
            break;
        }
        n = count;
        groups.resize(n as usize, 0);
    }
    Ok(UserInfo {
        name: name.to_string_lossy().into_owned(),
        gid,
        groups,
        home,
    })
}

/// The effective uid of the daemon.
pub fn euid() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// Runs `f` on a fresh thread whose file-system identity is (`uid`, `gid`, `groups`), so
/// every path lookup and permission check in `f` is made as that user (root's file
/// capabilities are dropped with the fsuid), switched by the FUSE tree's own per-thread
/// [`cloakfs_fuse::CredGuard`]. Only that thread changes. When the daemon already runs
/// as `uid` (tests, an unprivileged daemon), `f` runs with the daemon's own identity.
pub fn as_user<T: Send>(
    uid: u32,
    gid: u32,
    groups: &[u32],
    f: impl FnOnce() -> io::Result<T> + Send,
) -> io::Result<T> {
    let me = euid();
    if me == uid && me != 0 {
        return f();
    }
    if me != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            "the daemon must run as root to act for other users",
        ));
    }
    let creds = cloakfs_fuse::Creds {
        uid,
        gid,
        groups: groups.to_vec(),
    };
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                let _as_user = cloakfs_fuse::CredGuard::switch(&creds)?;
                f()
            })
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("credential thread panicked")))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

    #[test]
    fn own_credentials() {
        let (a, _b) = UnixStream::pair().unwrap();
        let p = peer_cred(&a).unwrap();
        assert_eq!(p.uid, euid());
        assert_eq!(p.pid, std::process::id());
        let mut ids = ProcIds::from(p);
        assert_eq!(ids.sid(), session_of(std::process::id()));
        assert_eq!(ids.tgid(), Some(std::process::id()));
        let info = user_info(euid()).unwrap();
        assert!(!info.name.is_empty());
        assert!(info.groups.contains(&info.gid));
    }

    #[test]
    fn acting_as_another_user_when_root() {
        if euid() != 0 {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let private = dir.path().join("private");
        std::fs::create_dir(&private).unwrap();
        rustix::fs::chmod(&private, rustix::fs::Mode::from_raw_mode(0o700)).unwrap();
        let r = as_user(65534, 65534, &[], || {
            std::fs::read_dir(&private).map(|_| ())
        });
        assert_eq!(r.unwrap_err().kind(), io::ErrorKind::PermissionDenied);
        // The daemon's own threads are unaffected.
        assert!(std::fs::read_dir(&private).is_ok());
        as_user(0, 0, &[], || std::fs::read_dir(&private).map(|_| ())).unwrap();
    }
}
