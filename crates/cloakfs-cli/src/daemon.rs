//! Daemonizing after the mount: the parent returns once the child is serving, as libfuse's
//! fuse_daemonize does. Must be called before any thread is started.

use crate::failure::{Failure, Result};
use crate::logging;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

/// Forks. Returns in the child (now a session leader with standard streams on /dev/null);
/// the parent waits for the child's go-ahead and exits with status 0, or 4 if it died first.
pub fn daemonize() -> Result<()> {
    let mut fds = [0i32; 2];
    // SAFETY: `fds` is a valid array of two ints for pipe2 to fill.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    // SAFETY: pipe2 succeeded, so both descriptors are open and now owned here.
    let (read_end, write_end) =
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: the process is still single-threaded (no FUSE or rayon thread has started), so
    // the child may continue running arbitrary code.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    if pid > 0 {
        drop(write_end);
        let mut ok = [0u8; 1];
        let got = File::from(read_end).read(&mut ok).unwrap_or(0);
        // The mount belongs to the child now: leave without running any destructor.
        let _ = std::io::stdout().flush();
        // SAFETY: _exit ends the process immediately, which is exactly the intent.
        unsafe {
            libc::_exit(if got == 1 {
                0
            } else {
                crate::failure::code::MOUNT as i32
            })
        };
    }
    drop(read_end);
    cloakfs_core::crypto::secret::relock_after_fork();
    // SAFETY: plain syscalls in the child; failures leave the defaults, which still work.
    unsafe {
        libc::setsid();
        let root = c"/";
        libc::chdir(root.as_ptr());
    }
    redirect_std_streams()?;
    File::from(write_end)
        .write_all(b"1")
        .map_err(|e| Failure::mount(format!("daemon handshake: {e}")))?;
    Ok(())
}

fn redirect_std_streams() -> Result<()> {
    let null = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")?;
    for fd in 0..=2 {
        // SAFETY: dup2 onto the standard descriptors from a valid open file.
        unsafe { libc::dup2(null.as_raw_fd(), fd) };
    }
    Ok(())
}

/// Makes sure descriptors 0, 1 and 2 are open (mount helpers may start us without them), so
/// that no file we open later lands on a standard stream.
pub fn ensure_std_streams() {
    for fd in 0..=2 {
        // SAFETY: F_GETFD on a small integer only queries whether it is open.
        if unsafe { libc::fcntl(fd, libc::F_GETFD) } == -1 {
            if let Ok(f) = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open("/dev/null")
            {
                let raw = f.as_raw_fd();
                if raw != fd {
                    // SAFETY: dup2 from a valid descriptor onto the closed standard one.
                    unsafe { libc::dup2(raw, fd) };
                } else {
                    std::mem::forget(f);
                }
            }
        }
    }
}

/// Sends the log to `log_file` (appended) when one is given.
pub fn log_to_file(log_file: Option<&Path>) -> Result<()> {
    if let Some(path) = log_file {
        let f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| Failure::other(format!("log file {}: {e}", path.display())))?;
        logging::redirect(Some(f));
    }
    Ok(())
}

/// Once a mount is in place: the log goes to `log_file` if given; in the foreground the
/// `ready` line is printed (requests wait in the kernel until the caller serves them),
/// otherwise the process daemonizes and, without a log file, logs to syslog.
pub fn serve_mounted(log_file: Option<&Path>, foreground: bool, ready: &str) -> Result<()> {
    log_to_file(log_file)?;
    if foreground {
        println!("{ready}");
    } else {
        daemonize()?;
        if log_file.is_none() {
            logging::redirect(None);
        }
    }
    Ok(())
}
