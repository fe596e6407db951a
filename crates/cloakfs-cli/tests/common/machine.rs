//! A private view of this machine for one test: its thread, and every process it starts,
//! work in a mount namespace of their own, in which
//! - /dev is a small tmpfs whose `fuse` node is open to every user (mode 0666, as udev makes
//!   it on Debian; on a machine without udev it is root's alone and only root could mount),
//!   whose `log` is a syslog socket the test reads, with terminals of its own (devpts);
//! - /run is empty (sshd wants its /run/sshd);
//! - /etc/fuse.conf may let users mount with allow_other.
//!
//! Nothing of it shows outside the namespace, which ends with the test's last process. Users
//! made by [`Machine::user`] are real (useradd) and removed again when dropped.

use std::io;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

pub struct Machine {
    /// A work directory every user may enter (mode 0755).
    pub dir: tempfile::TempDir,
    syslog: std::sync::Arc<Syslog>,
}

/// The /dev/log socket and what was read from it. A thread keeps reading, so that no
/// program ever blocks on a full socket (a datagram socket queues only 10 messages); reads
/// happen under the lock, so a message sent before [`Machine::syslog`] is never missed.
struct Syslog {
    socket: UnixDatagram,
    received: Mutex<Vec<(u32, String)>>,
    arrived: std::sync::Condvar,
    stop: std::sync::atomic::AtomicBool,
}

impl Syslog {
    /// Moves what the socket holds into `received` (the lock held).
    fn drain(&self, received: &mut Vec<(u32, String)>) {
        let mut buf = vec![0u8; 8192];
        while let Ok(n) = self.socket.recv(&mut buf) {
            let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
            // "<PRI>timestamp ident[pid]: text"
            let pri = msg
                .strip_prefix('<')
                .and_then(|m| m.split_once('>'))
                .and_then(|(p, _)| p.parse::<u32>().ok())
                .unwrap_or(u32::MAX);
            received.push((pri >> 3, msg));
        }
    }
}

fn check(r: libc::c_int, what: &str) {
    assert!(r == 0, "{what}: {}", io::Error::last_os_error());
}

fn mount(src: &str, dst: &str, fstype: &str, flags: libc::c_ulong, data: &str) {
    let c = |s: &str| std::ffi::CString::new(s).unwrap();
    let (s, d, t, o) = (c(src), c(dst), c(fstype), c(data));
    // SAFETY: mount(2) with valid C strings (type and data ignored where the flags say so).
    let r = unsafe { libc::mount(s.as_ptr(), d.as_ptr(), t.as_ptr(), flags, o.as_ptr().cast()) };
    check(r, &format!("mount {src} on {dst}"));
}

fn mknod(path: &str, major: u32, minor: u32) {
    let p = std::ffi::CString::new(path).unwrap();
    // SAFETY: mknod on a valid C string with a character-device mode.
    let r = unsafe {
        libc::mknod(
            p.as_ptr(),
            libc::S_IFCHR | 0o666,
            libc::makedev(major, minor),
        )
    };
    check(r, &format!("mknod {path}"));
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666)).unwrap();
}

impl Machine {
    /// Moves the calling thread into a private view of the machine (see the module).
    pub fn enter() -> Machine {
        let dir = tempfile::Builder::new()
            .prefix("cfsl-")
            .tempdir_in("/tmp")
            .unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        // SAFETY: unshare only changes this thread's namespaces.
        check(unsafe { libc::unshare(libc::CLONE_NEWNS) }, "unshare");
        mount("none", "/", "", libc::MS_REC | libc::MS_PRIVATE, "");
        mount("tmpfs", "/dev", "tmpfs", 0, "mode=0755,size=1m");
        for (name, major, minor) in [
            ("null", 1, 3),
            ("zero", 1, 5),
            ("full", 1, 7),
            ("random", 1, 8),
            ("urandom", 1, 9),
            ("tty", 5, 0),
            ("fuse", 10, 229),
        ] {
            mknod(&format!("/dev/{name}"), major, minor);
        }
        std::os::unix::fs::symlink("/proc/self/fd", "/dev/fd").unwrap();
        for (i, n) in ["stdin", "stdout", "stderr"].iter().enumerate() {
            std::os::unix::fs::symlink(format!("/proc/self/fd/{i}"), format!("/dev/{n}")).unwrap();
        }
        // Terminals (sshpass talks to ssh through one): a devpts instance of its own.
        std::fs::create_dir("/dev/pts").unwrap();
        mount(
            "devpts",
            "/dev/pts",
            "devpts",
            0,
            "newinstance,ptmxmode=0666,mode=0620",
        );
        std::os::unix::fs::symlink("pts/ptmx", "/dev/ptmx").unwrap();
        std::fs::create_dir("/dev/shm").unwrap();
        std::fs::set_permissions("/dev/shm", std::fs::Permissions::from_mode(0o1777)).unwrap();
        let socket = UnixDatagram::bind("/dev/log").unwrap();
        socket.set_nonblocking(true).unwrap();
        std::fs::set_permissions("/dev/log", std::fs::Permissions::from_mode(0o666)).unwrap();
        let syslog = std::sync::Arc::new(Syslog {
            socket,
            received: Mutex::new(Vec::new()),
            arrived: std::sync::Condvar::new(),
            stop: std::sync::atomic::AtomicBool::new(false),
        });
        let reader = syslog.clone();
        std::thread::spawn(move || {
            use std::os::fd::AsRawFd;
            while !reader.stop.load(std::sync::atomic::Ordering::SeqCst) {
                let mut p = libc::pollfd {
                    fd: reader.socket.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: poll on one valid pollfd.
                unsafe { libc::poll(&mut p, 1, 200) };
                let mut r = reader.received.lock().unwrap_or_else(|e| e.into_inner());
                reader.drain(&mut r);
                reader.arrived.notify_all();
            }
        });
        mount("tmpfs", "/run", "tmpfs", 0, "mode=0755,size=1m");
        std::fs::create_dir("/run/sshd").unwrap();
        Machine { dir, syslog }
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// Lets users mount with allow_other (user_allow_other in /etc/fuse.conf).
    pub fn allow_other_for_users(&self) {
        let conf = self.path("fuse.conf");
        std::fs::write(&conf, "user_allow_other\n").unwrap();
        std::fs::set_permissions(&conf, std::fs::Permissions::from_mode(0o644)).unwrap();
        mount(
            conf.to_str().unwrap(),
            "/etc/fuse.conf",
            "",
            libc::MS_BIND,
            "",
        );
    }

    /// The syslog messages received since the last call, as (facility, text).
    pub fn syslog(&self) -> Vec<(u32, String)> {
        let mut r = self
            .syslog
            .received
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        self.syslog.drain(&mut r);
        std::mem::take(&mut *r)
    }

    /// Waits (at most `secs` seconds) until a syslog message containing `needle` has come;
    /// whether it did. Nothing is taken from what [`Machine::syslog`] returns.
    pub fn wait_for_syslog(&self, needle: &str, secs: u64) -> bool {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
        let mut r = self
            .syslog
            .received
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        loop {
            self.syslog.drain(&mut r);
            if r.iter().any(|(_, m)| m.contains(needle)) {
                return true;
            }
            let now = std::time::Instant::now();
            if now >= deadline {
                return false;
            }
            r = self
                .syslog
                .arrived
                .wait_timeout(r, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// The syslog lines received since the last call that contain `needle`.
    pub fn syslog_with(&self, needle: &str) -> Vec<(u32, String)> {
        self.syslog()
            .into_iter()
            .filter(|(_, m)| m.contains(needle))
            .collect()
    }

    /// A new user `name` (cfsl- prefix) with a home directory here and password `password`.
    pub fn user(&self, name: &str, password: &str) -> TestUser {
        assert!(name.starts_with("cfsl"));
        static USERS: Mutex<()> = Mutex::new(());
        let _g = USERS.lock().unwrap_or_else(|e| e.into_inner());
        let home = self.path("home").join(name);
        std::fs::create_dir_all(home.parent().unwrap()).unwrap();
        std::fs::set_permissions(
            home.parent().unwrap(),
            std::fs::Permissions::from_mode(0o755),
        )
        .unwrap();
        // Left over by a run that was killed.
        let _ = Command::new("userdel").arg(name).output();
        let st = Command::new("useradd")
            .args([
                "--create-home",
                "--user-group",
                "--shell",
                "/bin/sh",
                "--home-dir",
            ])
            .arg(&home)
            .arg(name)
            .status()
            .unwrap();
        assert!(st.success(), "useradd {name}");
        let u = TestUser {
            name: name.to_string(),
            uid: id(name, "-u"),
            gid: id(name, "-g"),
            home,
        };
        u.set_password(password);
        u
    }
}

fn id(name: &str, flag: &str) -> u32 {
    let o = Command::new("id").args([flag, name]).output().unwrap();
    String::from_utf8_lossy(&o.stdout).trim().parse().unwrap()
}

impl Drop for Machine {
    fn drop(&mut self) {
        self.syslog
            .stop
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Whether something is mounted at `p`, in the calling thread's mount namespace.
pub fn mounted_here(p: &Path) -> bool {
    let p = p.to_str().unwrap();
    std::fs::read_to_string("/proc/thread-self/mountinfo")
        .unwrap()
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(p))
}

/// A real user, removed when dropped.
pub struct TestUser {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub home: PathBuf,
}

impl TestUser {
    /// Sets the login password (as root would, with chpasswd).
    pub fn set_password(&self, password: &str) {
        use std::io::Write;
        let mut c = Command::new("chpasswd")
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        writeln!(c.stdin.take().unwrap(), "{}:{password}", self.name).unwrap();
        assert!(c.wait().unwrap().success());
    }

    /// A command run as this user (real and effective ids, their groups), with HOME set.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("setpriv");
        c.arg(format!("--reuid={}", self.uid))
            .arg(format!("--regid={}", self.gid))
            .arg("--init-groups")
            .arg("env")
            .arg(format!("HOME={}", self.home.display()))
            .arg(format!("USER={}", self.name))
            .arg("PATH=/usr/bin:/bin:/usr/sbin:/sbin")
            .arg(program)
            .current_dir("/");
        c
    }

    /// `sh -c SCRIPT` as this user; (status, stdout and stderr together).
    pub fn sh(&self, script: &str) -> (i32, String) {
        let o = self
            .command("sh")
            .args(["-c", &format!("exec 2>&1; {script}")])
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        (
            o.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&o.stdout).into_owned(),
        )
    }
}

impl Drop for TestUser {
    fn drop(&mut self) {
        // Processes of this user the test left behind (a mount daemon after a failed
        // assertion) would keep userdel from working.
        for pid in processes_of(self.uid) {
            // SAFETY: kill on a pid of this test's own user.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        let _ = Command::new("userdel").arg(&self.name).output();
    }
}

/// Pids of the processes running as `uid`.
pub fn processes_of(uid: u32) -> Vec<i32> {
    use std::os::unix::fs::MetadataExt;
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| {
            let e = e.ok()?;
            let pid: i32 = e.file_name().to_str()?.parse().ok()?;
            (e.metadata().ok()?.uid() == uid).then_some(pid)
        })
        .collect()
}

/// Waits until process `pid` has exited (a pidfd becomes readable), at most `secs` seconds.
pub fn wait_exit(pid: i32, secs: i32) -> bool {
    // SAFETY: pidfd_open takes a pid and flags; the result is a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) } as i32;
    if fd < 0 {
        return true; // already gone
    }
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: poll on one valid pollfd, then close of the descriptor this function opened.
    let r = unsafe {
        let r = libc::poll(&mut p, 1, secs * 1000);
        libc::close(fd);
        r
    };
    r == 1
}
