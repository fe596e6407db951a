//! `cloakfs run CIPHERDIR MOUNTPOINT -- COMMAND [ARGS]`: the plaintext view for one process
//! tree. The view is mounted in a private mount namespace (inside a user namespace of the
//! caller when not root) that only COMMAND and its children share; no other process sees it.
//! The mount also serves only COMMAND's descendants (`Binding::Tree`), so a process of the
//! same user outside the tree that reaches in through `/proc/PID/root` or `nsenter` is
//! refused; it ends when the last process in the namespace has gone.

use crate::args::UnlockArgs;
use crate::commands::mount::{check_before_unlock, fuse_options, sync_dir, with_option_secrets};
use crate::failure::{Failure, Result};
use crate::mount_options;
use clap::Args;
use cloakfs_core::known_volumes::Place;
use cloakfs_fuse::Binding;
use std::ffi::{CString, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

#[derive(Debug, Args)]
#[command(after_long_help = "\
The view exists only in a mount namespace of its own, which COMMAND and every process it \
starts share: other processes, root's included, see the empty mount point, and the view \
serves only COMMAND and its descendants (a process outside them that reaches in through \
/proc/PID/root or nsenter gets EACCES). Run by a user other than root, cloakfs enters a user \
namespace first (unprivileged user namespaces must be enabled, as they are on Debian); \
inside it, files of other users show as nobody. When COMMAND exits the view is unmounted; a \
process COMMAND left behind (also one that left its session) that still uses it keeps it \
until that process exits or closes it, and `cloakfs run` waits for that. The exit status is \
COMMAND's (128+N when a signal N ended it; 127 when it could not be started). SIGTERM and \
SIGHUP are passed on to COMMAND; SIGINT and SIGQUIT reach it from the terminal.")]
pub struct RunArgs {
    #[command(flatten)]
    pub unlock: UnlockArgs,
    /// Mount options, comma separated (ro, cache_timeout=SECS, passfile=F, ...); repeatable.
    #[arg(short = 'o', value_name = "OPTIONS", action = clap::ArgAction::Append)]
    pub options: Vec<String>,
    /// The volume's cipher directory.
    pub cipherdir: PathBuf,
    /// Where COMMAND sees the plaintext view.
    pub mountpoint: PathBuf,
    /// The program to run, and its arguments (after `--`).
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<OsString>,
}

/// Returns COMMAND's exit status.
///
/// How: the view is mounted the usual way (fusermount3 without root, so no access to
/// /dev/fuse is needed) at a fresh 0700 directory; a child process enters a mount namespace
/// of its own (inside a user namespace when not root), which starts as a copy holding that
/// mount, binds the view onto MOUNTPOINT there, and becomes COMMAND. Then the mount is
/// detached from the caller's namespace, so only COMMAND's namespace holds the view; the
/// kernel unmounts it (writing back every cached page) when the last process in there exits,
/// and serving ends.
pub fn run(args: RunArgs) -> Result<u8> {
    let mut o = mount_options::parse(&args.options)?;
    let (cipherdir, mountpoint) = check_before_unlock(&args.cipherdir, &args.mountpoint, &mut o)?;
    if o.bind.is_some() {
        return Err(Failure::usage(
            "cloakfs run binds its view to COMMAND and its descendants; -o bind does not apply",
        ));
    }
    let mut mo = fuse_options(&cipherdir, &o, None, None);
    // What COMMAND leaves behind is reparented to this process, so stays below it.
    rustix::process::set_child_subreaper(Some(rustix::process::getpid()))
        .map_err(|e| Failure::other(format!("cannot become a child subreaper: {e}")))?;
    mo.binding = Some(Binding::Tree {
        uid: rustix::process::getuid().as_raw(),
        ancestor: rustix::process::getpid().as_raw_nonzero().get() as u32,
    });
    // What the kernel caches it answers to anyone who reaches the view, unchecked (see
    // `mount`): nothing is cached unless asked.
    if o.cache_timeout.is_none() {
        mo.cache_timeout = std::time::Duration::ZERO;
    }
    let volume = crate::unlock::unlock_at(
        &with_option_secrets(&args.unlock, &o),
        &Place::resolved(&args.cipherdir, cipherdir.clone()),
    )?;
    let staging = StagingDir::new()?;
    let mounted = cloakfs_fuse::mount(volume, &cipherdir, &staging.view, &mo).map_err(|e| {
        Failure::mount(format!(
            "cannot mount the view for {}: {e}",
            mountpoint.display()
        ))
    })?;
    // Resolved again in the namespace, so a COMMAND started inside the mount point starts in
    // the view.
    let cwd = std::env::current_dir().ok();
    let command = Command::prepare(&args.command, cwd.as_deref(), &staging.view, &mountpoint)?;
    let child = command.fork()?;
    let signals = block_signals();
    let server = std::thread::Builder::new()
        .name("cloakfs-serve".into())
        .spawn(move || mounted.run())
        .map_err(|e| Failure::other(format!("cannot start serving: {e}")))?;
    let holding = child.start();
    // Only COMMAND's namespace keeps the view now (or nobody, if the child failed).
    staging.detach();
    let reaped = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    forward_signals(signals, child.pid, reaped.clone());
    let status = child.wait();
    reaped.store(true, std::sync::atomic::Ordering::SeqCst);
    match server.join() {
        Ok(Ok(())) => {}
        Ok(Err(e)) => eprintln!("cloakfs: serving the view ended with an error: {e}"),
        Err(_) => eprintln!("cloakfs: serving the view failed"),
    }
    sync_dir(&cipherdir);
    drop(staging);
    if !holding {
        // The child said why (one line) and exited 127.
        return Ok(127);
    }
    Ok(status)
}

/// The fresh 0700 directory where the view is mounted before the child takes it: in
/// $XDG_RUNTIME_DIR, else in /tmp.
struct StagingDir {
    dir: PathBuf,
    view: PathBuf,
}

impl StagingDir {
    fn new() -> Result<Self> {
        use std::os::unix::fs::DirBuilderExt;
        let base = std::env::var_os("XDG_RUNTIME_DIR")
            .map(PathBuf::from)
            .filter(|p| p.is_dir())
            .unwrap_or_else(|| PathBuf::from("/tmp"));
        let pid = std::process::id();
        for n in 0..100 {
            let dir = base.join(format!("cloakfs-run.{pid}.{n}"));
            match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
                Ok(()) => {
                    let view = dir.join("view");
                    std::fs::DirBuilder::new()
                        .mode(0o700)
                        .create(&view)
                        .map_err(|e| Failure::other(format!("{}: {e}", view.display())))?;
                    return Ok(Self { dir, view });
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(Failure::other(format!("{}: {e}", dir.display()))),
            }
        }
        Err(Failure::other(format!(
            "cannot make a staging directory in {}",
            base.display()
        )))
    }

    /// Detaches the view from this (the caller's) mount namespace.
    fn detach(&self) {
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        let done = root
            && CString::new(self.view.as_os_str().as_bytes()).is_ok_and(|p| {
                // SAFETY: umount2 on a valid C string.
                unsafe { libc::umount2(p.as_ptr(), libc::MNT_DETACH) == 0 }
            });
        if !done {
            let _ = std::process::Command::new("fusermount3")
                .args(["-u", "-z", "--"])
                .arg(&self.view)
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .status();
        }
    }
}

impl Drop for StagingDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.view);
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// COMMAND, made ready for the child: C strings built before forking.
struct Command {
    program: CString,
    argv: Vec<CString>,
    cwd: Option<CString>,
    staged: CString,
    target: CString,
    uid: u32,
    gid: u32,
    root: bool,
}

/// The forked child, waiting for the go-ahead.
struct Child {
    pid: u32,
    go: std::fs::File,
    ready: std::fs::File,
}

fn c_string(bytes: &[u8], what: &str) -> Result<CString> {
    CString::new(bytes).map_err(|_| Failure::usage(format!("{what} contains a NUL byte")))
}

impl Command {
    fn prepare(
        command: &[OsString],
        cwd: Option<&Path>,
        staged: &Path,
        target: &Path,
    ) -> Result<Self> {
        let argv = command
            .iter()
            .map(|a| c_string(a.as_bytes(), "COMMAND"))
            .collect::<Result<Vec<_>>>()?;
        // SAFETY: getuid, getgid and geteuid have no preconditions.
        let (uid, gid, root) = unsafe { (libc::getuid(), libc::getgid(), libc::geteuid() == 0) };
        Ok(Self {
            program: argv[0].clone(),
            argv,
            cwd: cwd.and_then(|d| CString::new(d.as_os_str().as_bytes()).ok()),
            staged: c_string(staged.as_os_str().as_bytes(), "the staging path")?,
            target: c_string(target.as_os_str().as_bytes(), "MOUNTPOINT")?,
            uid,
            gid,
            root,
        })
    }

    /// Forks the child, which waits for [`Child::start`]. The process must be
    /// single-threaded here (a condition of a new user namespace, and of doing more than
    /// async-signal-safe calls in the child).
    fn fork(self) -> Result<Child> {
        let threads = std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("Threads:").map(|n| n.trim().to_string()))
            });
        if threads.as_deref() != Some("1") {
            return Err(Failure::other(format!(
                "internal: cloakfs run must fork single-threaded (threads: {threads:?})"
            )));
        }
        let (go_read, go_write) = pipe()?;
        let (ready_read, ready_write) = pipe()?;
        // SAFETY: the process is single-threaded (checked above), so the child may run
        // ordinary code until it execs or exits.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(std::io::Error::last_os_error().into());
        }
        if pid == 0 {
            drop(go_write);
            drop(ready_read);
            let code = self.in_child(go_read, ready_write);
            // SAFETY: leaves the child at once, without running the parent's destructors.
            unsafe { libc::_exit(code) };
        }
        drop(go_read);
        drop(ready_write);
        Ok(Child {
            pid: pid as u32,
            go: go_write,
            ready: ready_read,
        })
    }

    /// The child: waits for the go-ahead, takes the view into a namespace of its own, tells
    /// the parent, and becomes COMMAND. Returns only on failure (an exit status).
    fn in_child(self, mut go: std::fs::File, mut ready: std::fs::File) -> i32 {
        use std::io::{Read, Write};
        let mut byte = [0u8; 1];
        if go.read(&mut byte).unwrap_or(0) != 1 {
            return 127;
        }
        if let Err(e) = self.enter_namespace() {
            eprintln!("cloakfs: {e}");
            return 127;
        }
        let _ = ready.write_all(b"1");
        drop(ready);
        if let Some(d) = &self.cwd {
            // SAFETY: chdir on a valid C string; failing leaves the old directory.
            unsafe { libc::chdir(d.as_ptr()) };
        }
        let mut argv: Vec<*const libc::c_char> = self.argv.iter().map(|a| a.as_ptr()).collect();
        argv.push(std::ptr::null());
        // SAFETY: execvp with a valid C string and a NULL-terminated array of valid C
        // strings, all alive until the call (which returns only on failure).
        unsafe { libc::execvp(self.program.as_ptr(), argv.as_ptr()) };
        eprintln!(
            "cloakfs: cannot run {}: {}",
            self.program.to_string_lossy(),
            std::io::Error::last_os_error()
        );
        127
    }

    /// Enters a new mount namespace (in a new user namespace when not root) whose mounts
    /// propagate nowhere, and binds the staged view onto the mount point there.
    fn enter_namespace(&self) -> Result<()> {
        let flags = if self.root {
            libc::CLONE_NEWNS
        } else {
            libc::CLONE_NEWUSER | libc::CLONE_NEWNS
        };
        // SAFETY: unshare only changes this process's namespaces.
        if unsafe { libc::unshare(flags) } != 0 {
            let e = std::io::Error::last_os_error();
            let hint = if self.root {
                ""
            } else {
                " (are unprivileged user namespaces enabled? sysctl user.max_user_namespaces)"
            };
            return Err(Failure::mount(format!(
                "cannot make a private mount namespace: {e}{hint}"
            )));
        }
        if !self.root {
            let write = |file: &str, text: String| {
                std::fs::write(format!("/proc/self/{file}"), text)
                    .map_err(|e| Failure::mount(format!("user namespace {file}: {e}")))
            };
            // The process is hardened (not dumpable), and a non-dumpable process's maps belong
            // to root: only for these writes is it dumpable, so that the user may write them.
            // It execs COMMAND next, which drops its copy of the parent's memory.
            set_dumpable(true);
            let written = write("setgroups", "deny".into())
                .and_then(|()| write("uid_map", format!("{0} {0} 1", self.uid)))
                .and_then(|()| write("gid_map", format!("{0} {0} 1", self.gid)));
            set_dumpable(false);
            written?;
        }
        let mount = |src: *const libc::c_char, dst: &CString, flags, what: &str| {
            // SAFETY: mount(2) with valid C strings or null where mount(2) allows null
            // (propagation changes and binds take no type or data).
            let r = unsafe {
                libc::mount(src, dst.as_ptr(), std::ptr::null(), flags, std::ptr::null())
            };
            if r == 0 {
                Ok(())
            } else {
                Err(Failure::mount(format!(
                    "{what}: {}",
                    std::io::Error::last_os_error()
                )))
            }
        };
        mount(
            std::ptr::null(),
            &CString::from(c"/"),
            libc::MS_REC | libc::MS_PRIVATE,
            "cannot make the mount namespace private",
        )?;
        mount(
            self.staged.as_ptr(),
            &self.target,
            libc::MS_BIND,
            "cannot bind the view onto the mount point",
        )?;
        // Best effort: a copy the namespace inherited locked cannot be unmounted, and the
        // staging directory is 0700 anyway.
        // SAFETY: umount2 on a valid C string.
        unsafe { libc::umount2(self.staged.as_ptr(), libc::MNT_DETACH) };
        Ok(())
    }
}

impl Child {
    /// Lets the child go on; returns whether it holds the view (else it exits 127).
    fn start(&self) -> bool {
        use std::io::{Read, Write};
        let _ = (&self.go).write_all(b"1");
        let mut byte = [0u8; 1];
        (&self.ready).read(&mut byte).unwrap_or(0) == 1
    }

    /// Waits for COMMAND; its exit status (128+N for signal N).
    fn wait(&self) -> u8 {
        let mut status = 0;
        loop {
            // SAFETY: waitpid on our own child with a valid status pointer.
            let r = unsafe { libc::waitpid(self.pid as i32, &mut status, 0) };
            if r == self.pid as i32 {
                break;
            }
            if r < 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
                return 1;
            }
        }
        if libc::WIFEXITED(status) {
            libc::WEXITSTATUS(status) as u8
        } else if libc::WIFSIGNALED(status) {
            128u8.saturating_add(libc::WTERMSIG(status) as u8)
        } else {
            1
        }
    }
}

fn pipe() -> Result<(std::fs::File, std::fs::File)> {
    use std::os::fd::FromRawFd;
    let mut fds = [0i32; 2];
    // SAFETY: `fds` is a valid array of two ints for pipe2 to fill.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    // SAFETY: pipe2 succeeded: both descriptors are open and owned here.
    Ok(unsafe {
        (
            std::fs::File::from_raw_fd(fds[0]),
            std::fs::File::from_raw_fd(fds[1]),
        )
    })
}

const FORWARDED: [i32; 2] = [libc::SIGTERM, libc::SIGHUP];
const IGNORED: [i32; 2] = [libc::SIGINT, libc::SIGQUIT];

/// Blocks the signals that `forward_signals` handles, in this thread and the threads it
/// starts later; returns the set.
fn block_signals() -> libc::sigset_t {
    // SAFETY: sigset operations on a zeroed local sigset_t, then pthread_sigmask on it.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in FORWARDED.iter().chain(&IGNORED) {
            libc::sigaddset(&mut set, *s);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

/// Starts a thread that passes SIGTERM and SIGHUP on to `child` and drops SIGINT and
/// SIGQUIT (the terminal sends those to COMMAND itself).
fn forward_signals(
    set: libc::sigset_t,
    child: u32,
    reaped: std::sync::Arc<std::sync::atomic::AtomicBool>,
) {
    let _ = std::thread::Builder::new()
        .name("cloakfs-signals".into())
        .spawn(move || loop {
            let mut sig = 0;
            // SAFETY: sigwait on a valid set with a valid out pointer.
            if unsafe { libc::sigwait(&set, &mut sig) } != 0 {
                return;
            }
            if FORWARDED.contains(&sig) && !reaped.load(std::sync::atomic::Ordering::SeqCst) {
                // SAFETY: kill on COMMAND's pid, not yet reaped (so not reused).
                unsafe { libc::kill(child as i32, sig) };
            }
        });
}

fn set_dumpable(on: bool) {
    use rustix::process::{set_dumpable_behavior, DumpableBehavior};
    // Setting one's own dumpable flag to 0 or 1 cannot fail.
    let _ = set_dumpable_behavior(if on {
        DumpableBehavior::Dumpable
    } else {
        DumpableBehavior::NotDumpable
    });
}
