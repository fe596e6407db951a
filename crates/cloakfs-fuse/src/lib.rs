//! cloakfs FUSE front end: the plaintext view of a cipher directory, as a thin adapter from
//! FUSE requests to `cloakfs-core`. Nothing here knows how bytes are encrypted.
//!
//! - [`mount`] mounts (the mount syscall, or fusermount3 without root) and negotiates with the
//!   kernel, but starts no thread, so the caller may fork to daemonize afterwards;
//! - [`Mounted::run`] serves requests on `threads` worker threads until the file system is
//!   unmounted (`fusermount3 -u`, `umount`), then closes every backing file before it
//!   returns.
//!
//! Inside: `ops` holds the FUSE request handlers, a dispatcher; `gate` puts the one check in
//! front of them that a mount has (the key binding, `binding`; the multi-user tree's access
//! policy, `tree_ops`), so no request reaches them without the gate's yes. Every node the
//! kernel knows holds an `O_PATH` descriptor of its backing object and is reached through
//! `*at()` calls relative to it (`inode`); entries are named through the parent's directory
//! ID, with crash-safe directory creation (`dir`, `entry`) and snapshot listings (`readdir`);
//! regular files go through one shared `cloakfs_core::io::file::ContentFile` per node (`file`,
//! `fs`); `user.*` xattrs are encrypted (`xattr`); `attr` converts `stat`s and `sys` wraps the
//! remaining system calls.
//!
//! The reverse view ([`mount_reverse`], `reverse`) is a separate, read-only file system: a
//! plaintext directory shown as the cipher directory of a volume, encrypted deterministically.
//!
//! The multi-user tree ([`mount_tree`], `tree`) serves many cipher directories under one
//! mount, one `fs::CloakFs` each, routing every request by its node number and running it
//! with the caller's (or the attach owner's) file-system credentials (`creds`).

mod attr;
mod binding;
mod config_follow;
mod conflicts;
mod creds;
mod dir;
mod dir_id_copies;
mod dirids;
mod durable;
mod entry;
mod file;
mod fs;
mod gate;
mod inode;
mod ops;
mod plain;
mod prune;
mod readdir;
mod reverse;
mod shared;
mod sys;
pub mod tree;
mod tree_ops;
mod uring;
mod xattr;

pub use binding::Binding;
pub use cloakfs_core::io::shared::Sharing;
pub use creds::{CredGuard, Creds};
pub use tree::{
    mount_tree, Access, AttachId, AttachSpec, Caller, Gate, MountedTree, Need, TreeHandle, Verdict,
};

use cloakfs_core::format::layout::Layout;
use cloakfs_core::Volume;
use fuser::{MountOption, SessionACL};
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// `cloakfs encrypt`'s request to a mount of an adopted tree: `_IOW('C', 1, [u8; 256])` on
/// an open directory, whose argument is the name (NUL-padded) of a plaintext entry in it to
/// encrypt in place; returns an [`Encrypted`] value. An empty name on the mount's root
/// records that the tree has no plaintext entry left (see `plain::finish_conversion`):
/// returns 0, or fails with ENOTEMPTY while one is left.
pub const ENCRYPT_IOCTL: u32 = (1 << 30) | (256 << 16) | ((b'C' as u32) << 8) | 1;
/// Length of [`ENCRYPT_IOCTL`]'s argument.
pub const ENCRYPT_IOCTL_ARG: usize = 256;
pub use plain::Encrypted;

/// How long the kernel may cache names and attributes by default. Every change made through
/// the mount updates the kernel's caches at once, so the timeout only bounds how late changes
/// made to the cipher directory by anything else (another mount, a sync client) show up.
/// securefs uses 30 s too; gocryptfs 1 s, which costs a lookup per path component every
/// second (Postmark: 1.45x the time).
pub const DEFAULT_CACHE_TIMEOUT: Duration = Duration::from_secs(30);

/// How to mount.
#[derive(Debug, Clone)]
pub struct MountOptions {
    /// Read-only mount (`-o ro`).
    pub read_only: bool,
    /// Let other users access the mount (`-o allow_other`; needs user_allow_other or root).
    pub allow_other: bool,
    /// Let root access the mount (`-o allow_root`).
    pub allow_root: bool,
    /// Let the kernel check permissions from the reported modes (`-o default_permissions`).
    /// Implied where the kernel enforces POSIX ACLs (see `CloakFs::init`).
    pub default_permissions: bool,
    /// Other options passed to the kernel as they are (nosuid, nodev, noexec, noatime, ...).
    pub kernel_options: Vec<String>,
    /// `fsname` shown in /proc/mounts (normally the cipher directory).
    pub fsname: String,
    /// Worker threads serving FUSE requests.
    pub threads: usize,
    /// How long the kernel may cache attributes and directory entries.
    pub cache_timeout: Duration,
    /// Let the kernel acknowledge writes from its page cache (`-o writeback_cache`): fewer,
    /// larger requests, but an error the backing file system reports later (a full disk, an
    /// I/O error, a file grown past its largest size) then reaches the writer only at fsync
    /// and close, and the data of a write that failed is gone.
    pub writeback_cache: bool,
    /// Whom the mount serves (`--bind`); None: whoever the kernel lets in.
    pub binding: Option<Binding>,
    /// Serve requests through FUSE over io_uring when the kernel offers it (else, and when
    /// the rings cannot be set up, through reads and writes of /dev/fuse).
    pub io_uring: bool,
    /// Over io_uring, watch for the next request for a few microseconds after a reply before
    /// sleeping (one thread at a time, backing off when none comes): saves a wake-up per
    /// request to applications that make one request after another (`--no-busy-poll`).
    pub busy_poll: bool,
    /// Whether other machines mount the cipher directory too (`--shared-storage`).
    pub sharing: Sharing,
    /// Serve the plaintext entries of a converted adopted tree (`--accept-plaintext`), as
    /// before its conversion finished.
    pub accept_plaintext: bool,
}

impl MountOptions {
    /// Defaults for mounting `cipherdir`.
    pub fn new(cipherdir: &Path) -> Self {
        Self {
            read_only: false,
            allow_other: false,
            allow_root: false,
            default_permissions: false,
            kernel_options: Vec::new(),
            fsname: cipherdir.display().to_string(),
            threads: 8,
            cache_timeout: DEFAULT_CACHE_TIMEOUT,
            writeback_cache: false,
            binding: None,
            io_uring: true,
            busy_poll: true,
            sharing: Sharing::Alone,
            accept_plaintext: false,
        }
    }

    /// Whether users other than the mount's owner reach it: `-o allow_other` (also as a kernel
    /// option), or the kernel asked to check permissions (`-o default_permissions`).
    fn admits_others(&self) -> bool {
        self.default_permissions
            || self.session_acl() == SessionACL::All
            || self
                .kernel_options
                .iter()
                .any(|o| kernel_option(o) == KernelOption::Mount(MountOption::DefaultPermissions))
    }

    /// Who may use the mount besides its owner: `-o allow_other` or `allow_root`, also as
    /// kernel options.
    fn session_acl(&self) -> SessionACL {
        let mut acl = if self.allow_other {
            SessionACL::All
        } else if self.allow_root {
            SessionACL::RootAndOwner
        } else {
            SessionACL::Owner
        };
        for o in &self.kernel_options {
            match kernel_option(o) {
                KernelOption::AllowOther => acl = SessionACL::All,
                KernelOption::AllowRoot if acl == SessionACL::Owner => {
                    acl = SessionACL::RootAndOwner
                }
                _ => {}
            }
        }
        acl
    }

    /// The fuser session configuration for these options.
    fn session_config(&self) -> fuser::Config {
        let mut mount_options = vec![
            MountOption::FSName(self.fsname.clone()),
            // Understood both by the kernel (mount syscall) and by fusermount3: the mount
            // then shows as type fuse.cloakfs.
            MountOption::CUSTOM("subtype=cloakfs".into()),
        ];
        if self.read_only {
            mount_options.push(MountOption::RO);
        }
        if self.default_permissions {
            mount_options.push(MountOption::DefaultPermissions);
        }
        for o in &self.kernel_options {
            match kernel_option(o) {
                KernelOption::Mount(m) => {
                    if !mount_options.contains(&m) {
                        mount_options.push(m)
                    }
                }
                KernelOption::AllowOther | KernelOption::AllowRoot | KernelOption::Default => {}
                KernelOption::Unsupported => {
                    tracing::warn!("mount option {o} is not supported by the FUSE mount; ignored")
                }
            }
        }
        let mut config = fuser::Config::default();
        config.mount_options = mount_options;
        config.acl = self.session_acl();
        config.n_threads = Some(self.threads.max(1));
        // Each worker reads from its own clone of /dev/fuse, so requests are served in
        // parallel without contending on one descriptor.
        config.clone_fd = true;
        config
    }

    /// The session configuration of the multi-user tree: these options, but every user
    /// admitted, no default_permissions, and at least 16 workers.
    fn tree_session_config(&self) -> fuser::Config {
        let mut config = self.session_config();
        config
            .mount_options
            .retain(|o| *o != MountOption::DefaultPermissions);
        config.acl = SessionACL::All;
        config.n_threads = Some(self.threads.max(16));
        config
    }
}

/// What a `-o` option means to the FUSE mount.
#[derive(Debug, PartialEq)]
enum KernelOption {
    Mount(MountOption),
    AllowOther,
    AllowRoot,
    /// Already the default: nothing to pass.
    Default,
    /// A per-mount flag fuser has no way to set.
    Unsupported,
}

fn kernel_option(o: &str) -> KernelOption {
    use KernelOption as K;
    use MountOption as M;
    K::Mount(match o {
        "ro" => M::RO,
        "rw" => M::RW,
        "dev" => M::Dev,
        "nodev" => M::NoDev,
        "suid" => M::Suid,
        "nosuid" => M::NoSuid,
        "exec" => M::Exec,
        "noexec" => M::NoExec,
        "atime" => M::Atime,
        "noatime" => M::NoAtime,
        "sync" => M::Sync,
        "async" => M::Async,
        "dirsync" => M::DirSync,
        "default_permissions" => M::DefaultPermissions,
        "auto_unmount" => M::AutoUnmount,
        "allow_other" => return K::AllowOther,
        "allow_root" => return K::AllowRoot,
        "relatime" | "diratime" | "nolazytime" => return K::Default,
        "strictatime" | "norelatime" | "nodiratime" => return K::Unsupported,
        _ => match o.split_once('=') {
            Some(("fsname", v)) => M::FSName(v.into()),
            Some(("subtype", _)) => return K::Default,
            // lazytime, max_read=N, blksize=N, ...: the kernel takes them as they are.
            _ => M::CUSTOM(o.into()),
        },
    })
}

/// A mounted but not yet served file system. Created before daemonizing (so mount errors
/// reach the user), served after.
///
/// Dropping it without calling [`Mounted::run`] unmounts. A parent process that forked off
/// the daemon must leave with `_exit` (no destructors), or the mount goes with it.
pub struct Mounted {
    session: fuser::Session<gate::Gated<binding::BindingGate<fs::CloakFs>>>,
    transport: Transport,
    /// Where it is mounted.
    pub mountpoint: PathBuf,
}

impl std::fmt::Debug for Mounted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mounted")
            .field("mountpoint", &self.mountpoint)
            .finish_non_exhaustive()
    }
}

/// Mounts the plaintext view of `cipherdir` at `mountpoint`. Performs the mount syscall (or
/// runs fusermount3) and the FUSE handshake, but starts no thread, so the caller may fork
/// afterwards.
///
/// Process-wide effect: the soft RLIMIT_NOFILE is raised to the hard limit (every node the
/// kernel knows holds a descriptor). The process umask is left alone: worker threads create
/// objects with a umask of their own, the caller's (see `sys::with_umask`).
pub fn mount(
    volume: Volume,
    cipherdir: &Path,
    mountpoint: &Path,
    opts: &MountOptions,
) -> io::Result<Mounted> {
    sys::raise_nofile_limit();
    let volume_layout = volume.content().layout();
    let notifier = std::sync::Arc::new(std::sync::OnceLock::new());
    let mut fs = fs::CloakFs::new(
        volume,
        cipherdir,
        opts.cache_timeout,
        opts.read_only,
        notifier.clone(),
    )?
    .sharing(opts.sharing)
    .accept_plaintext(opts.accept_plaintext);
    fs.writeback_cache = opts.writeback_cache;
    fs.io_uring = opts.io_uring;
    fs.admits_others = opts.admits_others();
    let fs = gate::Gated::new(binding::BindingGate::new(fs, opts.binding)?);
    let session = new_session(fs, mountpoint, &opts.session_config())?;
    let _ = notifier.set(session.notifier());
    Ok(Mounted {
        session,
        transport: Transport::choose(opts, volume_layout),
        mountpoint: mountpoint.to_path_buf(),
    })
}

/// A mounted reverse view, not yet served (see [`mount_reverse`]).
pub struct MountedReverse {
    session: fuser::Session<reverse::ReverseFs>,
    /// Where it is mounted.
    pub mountpoint: PathBuf,
}

impl std::fmt::Debug for MountedReverse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MountedReverse")
            .field("mountpoint", &self.mountpoint)
            .finish_non_exhaustive()
    }
}

impl MountedReverse {
    /// Serves requests until the view is unmounted.
    pub fn run(self) -> io::Result<()> {
        serve(
            self.session,
            Transport::DevFuse("the reverse view does not use io_uring yet".into()),
            self.mountpoint,
        )
    }
}

/// Mounts the read-only reverse view of `plaindir` at `mountpoint`: every entry encrypted
/// on the fly by `view`, `config` (the volume config's bytes, last modified at
/// `config_time`) shown as the view's `cloakfs.conf`, and the plaintext entry at relative
/// path `hidden` (the reverse config, if it lies inside `plaindir`) left out.
/// `opts.read_only` is implied.
pub fn mount_reverse(
    view: cloakfs_core::io::reverse::ReverseView,
    plaindir: &Path,
    config: Vec<u8>,
    config_time: std::time::SystemTime,
    hidden: Option<Vec<u8>>,
    mountpoint: &Path,
    opts: &MountOptions,
) -> io::Result<MountedReverse> {
    let root = rustix::fs::open(
        plaindir,
        rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", plaindir.display())))?;
    let fs = reverse::ReverseFs::new(view, root, config, config_time, hidden, opts.cache_timeout);
    let mut opts = opts.clone();
    opts.read_only = true;
    // The kernel checks access from the modes the view reports (those of the plaintext).
    opts.default_permissions = true;
    let session = new_session(fs, mountpoint, &opts.session_config())?;
    Ok(MountedReverse {
        session,
        mountpoint: mountpoint.to_path_buf(),
    })
}

/// Mounts `fs` (the FUSE handshake included), with hints in mount errors, and raises the
/// mount's readahead and share of dirty pages.
fn new_session<FS: fuser::Filesystem>(
    fs: FS,
    mountpoint: &Path,
    config: &fuser::Config,
) -> io::Result<fuser::Session<FS>> {
    // Resolved now: once mounted, looking at the mount point waits for the server.
    let canonical = std::fs::canonicalize(mountpoint).ok();
    let session = fuser::Session::new(fs, mountpoint, config).map_err(|e| {
        let hint = match e.kind() {
            io::ErrorKind::NotFound if !Path::new("/dev/fuse").exists() => {
                " (/dev/fuse is missing: load the fuse module)"
            }
            io::ErrorKind::NotFound => " (is fusermount3 installed?)",
            io::ErrorKind::PermissionDenied if !dev_fuse_open_to_us() => {
                " (/dev/fuse is not open to this user: without udev's rule giving it mode \
                 0666, only root can mount FUSE file systems)"
            }
            io::ErrorKind::PermissionDenied => {
                " (allow_other needs user_allow_other in /etc/fuse.conf)"
            }
            _ => "",
        };
        io::Error::new(
            e.kind(),
            format!("mounting {}: {e}{hint}", mountpoint.display()),
        )
    })?;
    if let Some(p) = canonical {
        sys::raise_bdi_knobs(
            &p,
            &[
                ("read_ahead_kb", ops::READAHEAD_KIB),
                ("max_ratio", ops::DIRTY_SHARE_PERCENT),
            ],
        );
    }
    Ok(session)
}

/// Whether this process may open /dev/fuse (which fusermount3 opens as its caller).
fn dev_fuse_open_to_us() -> bool {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .is_ok()
}

impl Mounted {
    /// Serves requests until the file system is unmounted; returns after every pending write
    /// reached the cipher directory and every backing file is closed (call `syncfs` on the
    /// cipher directory afterwards for durability). Logs one info line when it ends normally,
    /// one error line otherwise.
    pub fn run(self) -> io::Result<()> {
        serve(self.session, self.transport, self.mountpoint)
    }

    /// A handle for sending cache invalidations to the kernel.
    pub fn notifier(&self) -> fuser::Notifier {
        self.session.notifier()
    }
}

/// How many requests this process has served through FUSE over io_uring, over all its
/// mounts: what shows that a mount uses the rings.
pub fn io_uring_requests_served() -> u64 {
    uring::SERVED.load(std::sync::atomic::Ordering::Relaxed)
}

/// How many times this process's io_uring serving threads watched for the next request
/// after a reply (busy polling, `MountOptions::busy_poll`), and how many of those saw it come.
pub fn io_uring_busy_polls() -> (u64, u64) {
    (
        uring::POLLS.load(std::sync::atomic::Ordering::Relaxed),
        uring::POLLS_CAUGHT.load(std::sync::atomic::Ordering::Relaxed),
    )
}

/// How requests reach the daemon, decided after the handshake.
#[derive(Debug)]
pub(crate) enum Transport {
    /// FUSE over io_uring, falling back to /dev/fuse if the rings cannot be set up.
    IoUring(uring::UringPlan),
    /// Reads and writes of /dev/fuse, and why not io_uring.
    DevFuse(String),
}

impl Transport {
    /// The transport for a mount whose handshake just ran on this thread.
    fn choose(opts: &MountOptions, layout: Layout) -> Self {
        match ops::take_uring_outcome() {
            ops::UringOutcome::TurnedOff => {
                Transport::DevFuse("io_uring turned off: --no-io-uring".into())
            }
            ops::UringOutcome::NotOffered => Transport::DevFuse(
                "the kernel does not offer FUSE over io_uring: \
                 /sys/module/fuse/parameters/enable_uring is off, or Linux is older than 6.14"
                    .into(),
            ),
            ops::UringOutcome::NotAllowed(why) => Transport::DevFuse(format!(
                "this process may not set up an io_uring: {why} (see kernel.io_uring_disabled)"
            )),
            ops::UringOutcome::Negotiated => {
                // The kernel wants room for max_write and for max_pages of a read.
                let max_pages = std::fs::read_to_string("/proc/sys/fs/fuse/max_pages_limit")
                    .ok()
                    .and_then(|s| s.trim().parse::<usize>().ok())
                    .unwrap_or(256)
                    .min(ops::MAX_WRITE as usize / 4096);
                let payload_size = (ops::MAX_WRITE as usize).max(max_pages * 4096);
                Transport::IoUring(uring::UringPlan {
                    threads: opts.threads,
                    payload_size,
                    // A read fills the sealed blocks around the range it returns.
                    read_slack: layout.read_room(payload_size) - payload_size,
                    poll: if opts.busy_poll {
                        uring::POLL_LIMIT
                    } else {
                        std::time::Duration::ZERO
                    },
                })
            }
        }
    }
}

/// Serves `session` until the file system at `mountpoint` is unmounted (see
/// [`Mounted::run`]).
fn serve<FS: fuser::Filesystem + 'static>(
    session: fuser::Session<FS>,
    transport: Transport,
    mountpoint: PathBuf,
) -> io::Result<()> {
    let shown = mountpoint.display().to_string();
    sys::reserve_descriptor_table();
    let mut background = match transport {
        Transport::DevFuse(why) => {
            tracing::info!("{shown}: FUSE requests through /dev/fuse ({why})");
            session.spawn()?
        }
        Transport::IoUring(plan) => {
            let mountpoint = mountpoint.clone();
            session.spawn_with(move |dispatcher| {
                let (threads, registered) = uring::start(dispatcher, &plan);
                match registered {
                    Ok((queues, per_queue)) => tracing::info!(
                        "{shown}: FUSE requests through io_uring ({queues} queues, {per_queue} \
                         ring entries each)"
                    ),
                    // The connection ended before the rings were up (an unmount right
                    // after the mount, as when `cloakfs run`'s command cannot start):
                    // nothing is left to serve or to detach.
                    Err(e)
                        if matches!(
                            e.raw_os_error(),
                            Some(libc::ENOTCONN) | Some(libc::ECONNABORTED)
                        ) =>
                    {
                        tracing::debug!(
                            "{shown}: unmounted before FUSE over io_uring was set up: {e}"
                        )
                    }
                    Err(e) => {
                        // The kernel was told to use the rings and holds every request until
                        // they are complete: nothing can be served. Detach the mount, which
                        // ends the session, rather than leave callers hanging.
                        tracing::error!(
                            "{shown}: FUSE over io_uring was negotiated but a ring entry could \
                             not be registered: {e}; unmounting (mount with --no-io-uring)"
                        );
                        sys::detach(&mountpoint);
                    }
                }
                threads
            })?
        }
    };
    // fuser unmounts again when its session handle goes, even after the unmount that
    // ended the session (its "still mounted?" check cannot tell): as root that fails
    // noisily, without root it runs `fusermount3 -u -z`, which could detach a new mount
    // at the same place. So the handle (mount record and one /dev/fuse descriptor, both
    // inert after the unmount) is leaked on purpose, and only its thread is joined.
    let worker = std::mem::replace(&mut background.guard, std::thread::spawn(|| Ok(())));
    std::mem::forget(background);
    let r = worker
        .join()
        .unwrap_or_else(|_| Err(io::Error::other("FUSE session thread panicked")));
    match &r {
        Ok(()) => tracing::info!("{}: unmounted", mountpoint.display()),
        Err(e) => {
            tracing::error!("{}: FUSE session failed: {e}", mountpoint.display());
            // The kernel may still hold a mount nobody serves: detach it.
            sys::detach(&mountpoint);
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_options_map() {
        assert_eq!(
            kernel_option("nosuid"),
            KernelOption::Mount(MountOption::NoSuid)
        );
        assert_eq!(kernel_option("allow_other"), KernelOption::AllowOther);
        assert_eq!(kernel_option("relatime"), KernelOption::Default);
        assert_eq!(kernel_option("nodiratime"), KernelOption::Unsupported);
        assert_eq!(
            kernel_option("max_read=4096"),
            KernelOption::Mount(MountOption::CUSTOM("max_read=4096".into()))
        );
        let mut o = MountOptions::new(Path::new("/c"));
        o.read_only = true;
        o.kernel_options = vec!["noexec".into(), "allow_root".into()];
        let c = o.session_config();
        assert!(c.mount_options.contains(&MountOption::RO));
        assert!(c.mount_options.contains(&MountOption::NoExec));
        assert_eq!(c.acl, SessionACL::RootAndOwner);
        assert!(c.clone_fd);
    }
}
