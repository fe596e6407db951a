//! Running the `cloakfs` command as the user who logs in, with secrets on pipes (never in
//! its arguments or environment), so every rule of the command applies to PAM mounts too: the
//! user's own record of known volumes (key pinning), the same unlock path, the same mount.

use crate::account::Account;
use std::ffi::OsStr;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};

/// How a run of `cloakfs` ended.
#[derive(Debug)]
pub struct Outcome {
    /// Exit status (None: ended by a signal).
    pub code: Option<i32>,
    /// Its last line on standard error (cloakfs's one-line error, when it failed).
    pub last_error: String,
}

impl Outcome {
    pub fn ok(&self) -> bool {
        self.code == Some(0)
    }
}

/// Runs `cloakfs ARGS` as `account` with `stdin_secret` on standard input and `fd3_secret` on
/// descriptor 3 (each followed by a newline), and waits for it.
pub fn run_as(
    cloakfs: &Path,
    account: &Account,
    args: &[&OsStr],
    stdin_secret: Option<&[u8]>,
    fd3_secret: Option<&[u8]>,
) -> io::Result<Outcome> {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    if euid != 0 && euid != account.uid {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("cannot act as {} without root", account.name),
        ));
    }
    let _sigchld = DefaultSigchld::new();
    let fd3 = match fd3_secret {
        Some(_) => Some(pipe()?),
        None => None,
    };
    let mut cmd = Command::new(cloakfs);
    cmd.args(args)
        .env_clear()
        .env("HOME", &account.home)
        .env("USER", &account.name)
        .env("LOGNAME", &account.name)
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .current_dir("/")
        .stdin(if stdin_secret.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let switch = euid == 0 && account.uid != 0;
    if let (true, Some((read, _))) = (switch, &fd3) {
        // cloakfs opens it again as /dev/fd/3, which checks the pipe's owner and mode
        // (0600, the creator's): make it the user's.
        // SAFETY: fchown on a descriptor this function owns.
        if unsafe { libc::fchown(read.as_raw_fd(), account.uid, account.gid) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    let (uid, gid, gids) = (account.uid, account.gid, account.gids.clone());
    let fd3_read = fd3.as_ref().map(|(r, _)| r.as_raw_fd());
    // SAFETY: between fork and exec only async-signal-safe system calls (dup2, fcntl,
    // setgroups, setgid, setuid, getuid, close_range) on values prepared before the fork.
    unsafe {
        cmd.pre_exec(move || {
            if let Some(fd) = fd3_read {
                // dup2 onto itself keeps close-on-exec: clear it by hand then.
                let r = if fd == 3 {
                    libc::fcntl(3, libc::F_SETFD, 0)
                } else {
                    libc::dup2(fd, 3)
                };
                if r < 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            if switch {
                if libc::setgroups(gids.len(), gids.as_ptr()) != 0
                    || libc::setgid(gid) != 0
                    || libc::setuid(uid) != 0
                {
                    return Err(io::Error::last_os_error());
                }
                if libc::getuid() != uid || libc::geteuid() != uid {
                    return Err(io::Error::other("the user switch did not hold"));
                }
            }
            // Whatever the login program holds open (its connection, its monitor's socket)
            // stays out of cloakfs and of the daemon it leaves behind.
            let first: libc::c_uint = if fd3_read.is_some() { 4 } else { 3 };
            libc::syscall(
                libc::SYS_close_range,
                first,
                libc::c_uint::MAX,
                libc::CLOSE_RANGE_CLOEXEC,
            );
            Ok(())
        })
    };
    let mut child = cmd.spawn()?;
    if let (Some(secret), Some(mut stdin)) = (stdin_secret, child.stdin.take()) {
        let _ = stdin
            .write_all(secret)
            .and_then(|()| stdin.write_all(b"\n"));
    }
    if let (Some(secret), Some((read, write))) = (fd3_secret, fd3) {
        drop(read);
        let mut w = std::fs::File::from(write);
        let _ = w.write_all(secret).and_then(|()| w.write_all(b"\n"));
    }
    let out = child.wait_with_output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    Ok(Outcome {
        code: out.status.code(),
        last_error: stderr
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("")
            .trim()
            .to_string(),
    })
}

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0i32; 2];
    // SAFETY: `fds` is a valid array of two ints for pipe2 to fill.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pipe2 succeeded: both descriptors are open and owned here.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// SIGCHLD at its default while the module waits for its child, so that a handler of the
/// login program cannot reap it first; restored afterwards (as pam_mount does).
struct DefaultSigchld(libc::sigaction);

impl DefaultSigchld {
    fn new() -> Self {
        // SAFETY: a zeroed sigaction is valid; sigaction reads `new` and fills `old`.
        unsafe {
            let mut new: libc::sigaction = std::mem::zeroed();
            new.sa_sigaction = libc::SIG_DFL;
            let mut old: libc::sigaction = std::mem::zeroed();
            libc::sigaction(libc::SIGCHLD, &new, &mut old);
            Self(old)
        }
    }
}

impl Drop for DefaultSigchld {
    fn drop(&mut self) {
        // SAFETY: restores the disposition saved in `new`.
        unsafe { libc::sigaction(libc::SIGCHLD, &self.0, std::ptr::null_mut()) };
    }
}
