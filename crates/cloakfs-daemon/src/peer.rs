//! Who a caller is (SO_PEERCRED, SO_PEERPIDFD, /proc, the user database) and acting as them
//! on the file system (per-thread fsuid/fsgid/groups).
//!
//! A control connection's identity is read once, when the daemon accepts it, while a pidfd
//! proves the process read about is the one that connected: a pid number only changes hands
//! after its process has exited, and [`Process::exited`] sees that exit. The connection
//! keeps the pidfd, so a request sent on it after its process has exited is refused, and
//! nothing about it is ever looked up again by pid.

use crate::registry::Ids;
use rustix::event::{poll, PollFd, PollFlags};
use rustix::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use rustix::process::{pidfd_open, Pid, PidfdFlags};
use std::ffi::CStr;
use std::io;

/// `SO_PEERPIDFD` (Linux 6.5): a pidfd of the process that connected a Unix socket. Not in
/// the libc crate's Linux constants yet; 77 on every architecture but SPARC (0x56).
#[cfg(not(target_arch = "sparc64"))]
const SO_PEERPIDFD: libc::c_int = 77;
#[cfg(target_arch = "sparc64")]
const SO_PEERPIDFD: libc::c_int = 0x56;

/// A control-socket peer: who connected, as it was when it connected. Never looked up again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    /// Effective uid and gid at connect time (SO_PEERCRED).
    pub uid: u32,
    pub gid: u32,
    /// The connecting process (its thread group id).
    pub pid: u32,
    /// Its Unix session (None when the session leader is outside the daemon's pid namespace).
    pub sid: Option<u32>,
    /// Its supplementary groups.
    pub groups: Vec<u32>,
    /// When it started, in clock ticks after boot (/proc/PID/stat): with the pid, names the
    /// process for good.
    pub start_time: u64,
}

impl Peer {
    /// The identity of the peer of an accepted connection, and a handle on its process.
    /// Refuses a peer outside the daemon's pid namespace and one whose process has exited.
    /// `accepted` is [`boot_ticks`] taken right after accept(2).
    pub fn of_socket(sock: impl AsFd, accepted: u64) -> io::Result<(Peer, Process)> {
        let sock = sock.as_fd();
        let (uid, gid, pid) = peer_cred(sock)?;
        let (process, from_kernel) = match peer_pidfd(sock)? {
            Some(fd) => (Process { pid, fd }, true),
            // Before Linux 6.5: a pidfd of whatever has the pid now, checked below by start
            // time.
            None => (Process::open(pid)?, false),
        };
        let info = process.info()?;
        // Without the kernel's pidfd, a process started after the connection was accepted
        // cannot be the one that connected (its pid was reused).
        if !from_kernel && info.start_time > accepted {
            return Err(exited());
        }
        Ok((
            Peer {
                uid,
                gid,
                pid,
                sid: info.sid,
                groups: info.groups,
                start_time: info.start_time,
            },
            process,
        ))
    }
}

/// The connection's identity answers every question from what was fixed at connect time.
impl Ids for Peer {
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
        Some(self.pid)
    }
    fn sid(&mut self) -> Option<u32> {
        self.sid
    }
    fn in_group(&mut self, gid: u32) -> bool {
        self.groups.contains(&gid)
    }
}

fn exited() -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        "the process that opened this connection has exited",
    )
}

/// SO_PEERCRED: (uid, gid, pid), fixed at connect time. A pid not visible here (another pid
/// namespace: pid 0) is refused.
fn peer_cred(sock: BorrowedFd<'_>) -> io::Result<(u32, u32, u32)> {
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
            sock.as_raw_fd(),
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
    Ok((c.uid, c.gid, pid))
}

/// SO_PEERPIDFD: a pidfd of the process that connected (None where the kernel lacks it).
fn peer_pidfd(sock: BorrowedFd<'_>) -> io::Result<Option<OwnedFd>> {
    let mut fd: libc::c_int = -1;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `fd` and `len` are valid out-parameters of the sizes given; the descriptor is
    // borrowed for the call.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_PEERPIDFD,
            (&mut fd as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENOPROTOOPT) | Some(libc::EINVAL) => Ok(None),
            // Kernels before 6.16 give no pidfd for a peer already reaped.
            Some(libc::ESRCH) => Err(exited()),
            _ => Err(e),
        };
    }
    if fd < 0 {
        return Ok(None);
    }
    // SAFETY: getsockopt returned a new descriptor that nothing else owns.
    Ok(Some(unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// Clock ticks since boot (CLOCK_BOOTTIME), the unit of process start times.
pub fn boot_ticks() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
    let hz = rustix::param::clock_ticks_per_second();
    (t.tv_sec.max(0) as u64)
        .saturating_mul(hz)
        .saturating_add(t.tv_nsec.max(0) as u64 * hz / 1_000_000_000)
}

/// What /proc says about a process, read while its pidfd shows it alive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcInfo {
    /// Effective uid and gid.
    pub uid: u32,
    pub gid: u32,
    pub sid: Option<u32>,
    pub groups: Vec<u32>,
    pub start_time: u64,
}

/// A process held by a pidfd.
#[derive(Debug)]
pub struct Process {
    pid: u32,
    fd: OwnedFd,
}

impl Process {
    /// A pidfd of whatever process has `pid` now (`NotFound` if none).
    pub fn open(pid: u32) -> io::Result<Process> {
        let p = i32::try_from(pid)
            .ok()
            .and_then(Pid::from_raw)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "invalid pid"))?;
        let fd = pidfd_open(p, PidfdFlags::empty()).map_err(|e| {
            if e == rustix::io::Errno::SRCH {
                io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("no process {pid} is running"),
                )
            } else {
                io::Error::from(e)
            }
        })?;
        Ok(Process { pid, fd })
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The process has exited (a pidfd polls readable from then on).
    pub fn exited(&self) -> bool {
        let mut fds = [PollFd::new(&self.fd, PollFlags::IN)];
        let zero = rustix::time::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        match poll(&mut fds, Some(&zero)) {
            Ok(n) => n > 0,
            Err(_) => true,
        }
    }

    /// Its uids, session, groups and start time. The values are read by pid, then the
    /// pidfd is asked whether the process still lives: if it does, the pid was its own all
    /// along and the values are its own.
    pub fn info(&self) -> io::Result<ProcInfo> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid));
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid));
        if self.exited() {
            return Err(exited());
        }
        let status = status?;
        let (sid, start_time) = parse_stat(&stat?).ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidData, "unreadable /proc/PID/stat")
        })?;
        let field = |name: &str| status_numbers(&status, name).unwrap_or_default();
        let (uids, gids) = (field("Uid:"), field("Gid:"));
        let (Some(&uid), Some(&gid)) = (uids.get(1), gids.get(1)) else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "unreadable /proc/PID/status",
            ));
        };
        Ok(ProcInfo {
            uid,
            gid,
            sid,
            groups: field("Groups:"),
            start_time,
        })
    }

    /// The pidfd, given up (for the process watcher).
    pub fn into_fd(self) -> OwnedFd {
        self.fd
    }
}

/// (session, start time) from the text of /proc/PID/stat (fields 6 and 22; the name in
/// field 2 may hold spaces and parentheses, so fields are counted after its last `)`).
fn parse_stat(stat: &str) -> Option<(Option<u32>, u64)> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3.
    let sid: u32 = f.get(6 - 3)?.parse().ok()?;
    let start: u64 = f.get(22 - 3)?.parse().ok()?;
    Some(((sid > 0).then_some(sid), start))
}

/// The Unix session id of `pid` (None if unknown or outside our pid namespace).
pub fn session_of(pid: u32) -> Option<u32> {
    let pid = i32::try_from(pid).ok().filter(|p| *p > 0)?;
    // SAFETY: getsid has no memory arguments.
    let sid = unsafe { libc::getsid(pid) };
    u32::try_from(sid).ok().filter(|s| *s > 0)
}

/// One `Name:` line of a /proc/<pid>/status text, split into numbers.
fn status_numbers(text: &str, field: &str) -> Option<Vec<u32>> {
    let line = text.lines().find(|l| l.starts_with(field))?;
    Some(
        line[field.len()..]
            .split_whitespace()
            .filter_map(|n| n.parse().ok())
            .collect(),
    )
}

fn proc_status_numbers(pid: u32, field: &str) -> Option<Vec<u32>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status_numbers(&text, field)
}

/// The supplementary groups of process (or thread) `pid`.
pub fn groups_of(pid: u32) -> Option<Vec<u32>> {
    proc_status_numbers(pid, "Groups:")
}

/// The thread group (process) id of thread `pid`.
pub fn tgid_of(pid: u32) -> Option<u32> {
    proc_status_numbers(pid, "Tgid:")?.first().copied()
}

/// The sender of a FUSE request, whose session, process and groups are looked up on first
/// need, once. The sender is blocked in the system call being answered, so its pid is its
/// own while the request is decided.
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
        let (p, process) = Peer::of_socket(&a, boot_ticks()).unwrap();
        assert_eq!(p.uid, euid());
        assert_eq!(p.pid, std::process::id());
        assert_eq!(process.pid(), std::process::id());
        assert!(!process.exited());
        let mut p2 = p.clone();
        assert_eq!(p2.sid(), session_of(std::process::id()));
        assert_eq!(p2.tgid(), Some(std::process::id()));
        assert!(p.start_time > 0 && p.start_time <= boot_ticks());
        let mut ids = ProcIds::new(p.uid, p.gid, p.pid);
        assert_eq!(ids.sid(), session_of(std::process::id()));
        assert_eq!(ids.tgid(), Some(std::process::id()));
        let info = user_info(euid()).unwrap();
        assert!(!info.name.is_empty());
        assert!(info.groups.contains(&info.gid));
    }

    #[test]
    fn an_exited_process_is_seen_through_its_pidfd() {
        let mut child = std::process::Command::new("/bin/sh")
            .args(["-c", "read x"])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let p = Process::open(child.id()).unwrap();
        let info = p.info().unwrap();
        assert_eq!(info.uid, euid());
        assert!(info.start_time > 0);
        assert!(!p.exited());
        drop(child.stdin.take());
        child.wait().unwrap();
        assert!(p.exited());
        assert_eq!(p.info().unwrap_err().kind(), io::ErrorKind::NotFound);
        // Reaped: nothing has its pid (unless reused, which this test cannot rule out).
        if let Err(e) = Process::open(child.id()) {
            assert_eq!(e.kind(), io::ErrorKind::NotFound);
        }
    }

    #[test]
    fn stat_fields() {
        let line = "42 (a) b) c) S 1 42 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 \
                    1000 10 18446744073709551615";
        assert_eq!(parse_stat(line), Some((Some(4242), 987654)));
        assert_eq!(parse_stat("7 (x) S 1 7 0 0"), None);
        let zero = "1 (init) S 0 1 0 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 5 1000 10 1";
        assert_eq!(parse_stat(zero), Some((None, 5)));
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
