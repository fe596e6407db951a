//! `cloakfs mount` (and the `cloakfs CIPHERDIR MOUNTPOINT -o ...` form that mount.fuse3 runs).

use crate::args::{BindTo, UnlockArgs};
use crate::daemon;
use crate::failure::{code, Failure, Result};
use crate::mount_options::{self, ParsedOptions};
use clap::Args;
use cloakfs_core::format::config::FileKeys;
use cloakfs_core::format::config::VolumeConfig;
use cloakfs_core::known_volumes::Place;
use cloakfs_core::tools::mounts;
use cloakfs_fuse::MountOptions;
use std::path::{Path, PathBuf};
use std::time::Duration;

const NOTES: &str = "\
mount(8) and /etc/fstab: mount.fuse3 runs `cloakfs CIPHERDIR MOUNTPOINT -o OPTIONS`, which \
cloakfs takes as `cloakfs mount` (the Debian package also installs /sbin/mount.fuse.cloakfs). \
For example `mount -t fuse.cloakfs /srv/vault.enc /srv/vault -o passfile=/etc/cloakfs/vault.pass`, \
or in /etc/fstab: `/srv/vault.enc /srv/vault fuse.cloakfs passfile=/etc/cloakfs/vault.pass,nofail,noexec 0 0`.

-o takes: ro, rw, allow_other, allow_root, default_permissions, nonempty, fsname=NAME, \
passfile=FILE, extpass=CMD, keyfile=FILE, identity=FILE, threads=N, cache_timeout=SECS, \
log_file=FILE, foreground, writeback_cache, bind=user|session, no_io_uring, no_busy_poll, \
shared_storage, no_shared_storage, the kernel's nosuid, nodev, noexec, atime options, sync, \
dirsync and lazytime, and ignores what belongs to mount(8) (defaults, auto, noauto, user, users, \
_netdev, nofail, x-systemd.*).

Key binding (--bind): with user, every request of another uid, root included and even with \
allow_other, gets EACCES; with session, so does every request from a process outside the Unix \
session that mounted. The check runs on each request before anything is decrypted. For a view \
that only one process tree sees, use cloakfs-run(1).";

#[derive(Debug, Args)]
#[command(after_long_help = NOTES)]
pub struct MountArgs {
    #[command(flatten)]
    pub unlock: UnlockArgs,
    /// Stay in the foreground (log to standard error) instead of daemonizing.
    #[arg(short, long)]
    pub foreground: bool,
    /// Mount options, comma separated (ro, allow_other, noexec, passfile=F, ...); repeatable.
    #[arg(short = 'o', value_name = "OPTIONS", action = clap::ArgAction::Append)]
    pub options: Vec<String>,
    /// Worker threads serving the file system.
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
    /// Seconds the kernel may cache attributes and names [default: 30]. Changes made to the
    /// cipher directory by anything but this mount show up after at most this long: use 1
    /// if another machine or a sync client writes to it while it is mounted.
    #[arg(long, value_name = "SECS")]
    pub cache_timeout: Option<f64>,
    /// Serve only the user who mounts, or only their processes in this Unix session: every
    /// other request gets EACCES before anything is decrypted (also `-o bind=user|session`).
    #[arg(long, value_name = "WHOM")]
    pub bind: Option<BindTo>,
    /// Serve FUSE requests through /dev/fuse even where the kernel offers FUSE over io_uring
    /// (`-o no_io_uring`).
    #[arg(long)]
    pub no_io_uring: bool,
    /// Over io_uring, let a serving thread sleep as soon as it replied instead of watching
    /// for the next request for up to 30 microseconds (`-o no_busy_poll`): a little less CPU
    /// time, a wake-up more per request for applications that make one after another.
    #[arg(long)]
    pub no_busy_poll: bool,
    /// Other machines mount the same cipher directory from a shared store (GlusterFS, NFS,
    /// sshfs): close-to-open consistency, block rewrites and application locks coordinated
    /// through the store, cache timeout 1 s unless given. On automatically where the cipher
    /// directory lies on a network file system (docs/SHARED-STORAGE.md).
    #[arg(long)]
    pub shared_storage: bool,
    /// Serve every plaintext entry of an adopted tree, also those its manifest does not list
    /// (that appeared after the adoption), and those of a tree whose conversion finished
    /// (`cloakfs encrypt` then encrypts them); without it, only listed ones are served.
    #[arg(long)]
    pub accept_plaintext: bool,
    /// This mount is the only one of the cipher directory, even on a network file system:
    /// no shared-storage mode (also `-o no_shared_storage`).
    #[arg(long)]
    pub no_shared_storage: bool,
    /// Append the daemon's log to FILE (default: syslog when daemonized).
    #[arg(long, value_name = "FILE")]
    pub log_file: Option<PathBuf>,
    /// The volume's cipher directory.
    pub cipherdir: PathBuf,
    /// Where the plaintext view appears.
    pub mountpoint: PathBuf,
}

pub fn run(args: MountArgs) -> Result<()> {
    let mut o = mount_options::parse(&args.options)?;
    let (on, off) = (
        args.shared_storage || o.shared_storage,
        args.no_shared_storage || o.no_shared_storage,
    );
    if on && off {
        return Err(Failure::usage(
            "--shared-storage and --no-shared-storage contradict each other",
        ));
    }
    let (cipherdir, mountpoint) = check_before_unlock(&args.cipherdir, &args.mountpoint, &mut o)?;
    let unlock = with_option_secrets(&args.unlock, &o);
    if unlock.identity.is_empty()
        && !unlock.gpg
        && VolumeConfig::load(&cipherdir).is_ok_and(|c| c.params.file_keys == FileKeys::Wrapped)
    {
        return Err(Failure::usage(
            "this is a sharing volume: mount it with --identity (your age identity or ssh \
             private key) or --gpg, as the member who opens and owns files",
        ));
    }
    let volume = crate::unlock::unlock_at(
        &unlock,
        &Place::resolved(&args.cipherdir, cipherdir.clone()),
    )?;
    crate::commands::share::note_root_defaults(&volume, &cipherdir);

    let mut mo = fuse_options(&cipherdir, &o, args.threads, args.cache_timeout);
    // Before daemonizing: the daemon leads a session of its own.
    mo.binding = args.bind.or(o.bind).map(BindTo::binding).transpose()?;
    // What the kernel caches it answers to anyone it lets in, unchecked: a bound mount that
    // others can reach (another session of the user; other users with allow_other or
    // allow_root) caches nothing unless asked, so a refused caller learns no name, size or
    // time the bound one saw. Without allow_*, the kernel keeps other users out itself.
    let reachable_by_refused = match mo.binding {
        Some(cloakfs_fuse::Binding::Session { .. } | cloakfs_fuse::Binding::Tree { .. }) => true,
        Some(cloakfs_fuse::Binding::User { .. }) => mo.allow_other || mo.allow_root,
        None => false,
    };
    if reachable_by_refused && args.cache_timeout.or(o.cache_timeout).is_none() {
        mo.cache_timeout = Duration::ZERO;
    }
    if args.no_io_uring {
        mo.io_uring = false;
    }
    if args.no_busy_poll {
        mo.busy_poll = false;
    }
    mo.accept_plaintext = args.accept_plaintext;
    let detected = network_file_system(&cipherdir).filter(|_| !off);
    if on || detected.is_some() {
        // On standard error before the mount backgrounds: the log shows warnings only.
        match &detected {
            Some(fstype) => eprintln!(
                "cloakfs: shared-storage mode: the cipher directory is on {fstype} \
                 (--no-shared-storage turns it off)"
            ),
            None => eprintln!("cloakfs: shared-storage mode (--shared-storage)"),
        }
        // SFTP has no locks: cloakfs's own lock does not keep other clients out there.
        mo.sharing = if detected
            .as_deref()
            .is_some_and(|t| UNLOCKED_FS.contains(&t))
        {
            cloakfs_fuse::Sharing::Unlocked
        } else {
            cloakfs_fuse::Sharing::Shared
        };
        if args.cache_timeout.or(o.cache_timeout).is_none() {
            mo.cache_timeout = SHARED_CACHE_TIMEOUT;
        }
    }
    let mounted = cloakfs_fuse::mount(volume, &cipherdir, &mountpoint, &mo)
        .map_err(|e| Failure::mount(format!("cannot mount on {}: {e}", mountpoint.display())))?;

    let log_file = args.log_file.clone().or(o.log_file.clone());
    daemon::serve_mounted(
        log_file.as_deref(),
        args.foreground || o.foreground,
        "Filesystem mounted and ready.",
    )?;
    crate::signals::unmount_on_signal(mountpoint.clone());
    tracing::info!(
        "serving {} on {}",
        cipherdir.display(),
        mountpoint.display()
    );
    mounted
        .run()
        .map_err(|e| Failure::mount(format!("file system session ended with an error: {e}")))?;
    sync_dir(&cipherdir);
    Ok(())
}

/// Everything about a mount that can be checked before asking for a secret: both
/// directories (returned absolute), the volume's config, no unfinished rekey, an empty mount
/// point outside the cipher directory, FUSE present.
pub(crate) fn check_before_unlock(
    cipherdir: &Path,
    mountpoint: &Path,
    o: &mut ParsedOptions,
) -> Result<(PathBuf, PathBuf)> {
    let cipherdir = absolute_dir(cipherdir, "cipher directory")?;
    let mountpoint = absolute_dir(mountpoint, "mount point")?;
    let config = VolumeConfig::load(&cipherdir)?;
    if !o.read_only {
        if let Some(why) = not_writable(&cipherdir) {
            eprintln!(
                "cloakfs: the cipher directory {} is read-only ({why}): mounting read-only",
                cipherdir.display()
            );
            o.read_only = true;
        }
    }
    cloakfs_core::tools::rekey::check_not_rekeying(&cipherdir)?;
    if !o.read_only {
        cloakfs_core::io::header::check_dir(config.params.content, &cipherdir)?;
    }
    if mountpoint.starts_with(&cipherdir) {
        return Err(Failure::usage(
            "the mount point may not lie inside the cipher directory",
        ));
    }
    // An automount point (systemd's x-systemd.automount) is an autofs mount until the real
    // one is made over it.
    if let Some(m) = mounts::current()
        .ok()
        .and_then(|all| mounts::at(&all, &mountpoint).cloned())
        .filter(|m| m.fstype != "autofs")
    {
        let what = if m.fstype == mounts::CLOAKFS_TYPE {
            format!("the cloakfs volume {}", m.source.display())
        } else {
            format!("{} ({})", m.source.display(), m.fstype)
        };
        return Err(Failure::mount(format!(
            "{} is already mounted: {what} is mounted there (unmount it first)",
            mountpoint.display()
        )));
    }
    if !o.nonempty && dir_has_entries(&mountpoint)? {
        return Err(Failure::mount(format!(
            "mount point {} is not empty (use -o nonempty to mount over it anyway)",
            mountpoint.display()
        )));
    }
    check_fuse_available()?;
    Ok((cipherdir, mountpoint))
}

/// The unlock options, completed by the secrets named in `-o` (passfile=, keyfile=, ...).
pub(crate) fn with_option_secrets(unlock: &UnlockArgs, o: &ParsedOptions) -> UnlockArgs {
    let mut unlock = unlock.clone();
    unlock.passfile = unlock.passfile.or(o.passfile.clone());
    unlock.extpass = unlock.extpass.or(o.extpass.clone());
    unlock.keyfile = unlock.keyfile.or(o.keyfile.clone());
    unlock.identity.extend(o.identity.iter().cloned());
    unlock
}

/// The FUSE mount options that `-o` and the command-line flags ask for (binding aside).
pub(crate) fn fuse_options(
    cipherdir: &Path,
    o: &ParsedOptions,
    threads: Option<usize>,
    cache_timeout: Option<f64>,
) -> MountOptions {
    let mut mo = MountOptions::new(cipherdir);
    mo.read_only = o.read_only;
    mo.allow_other = o.allow_other;
    mo.allow_root = o.allow_root;
    mo.default_permissions = o.default_permissions;
    mo.kernel_options = o.kernel.clone();
    mo.writeback_cache = o.writeback_cache;
    mo.io_uring = !o.no_io_uring;
    mo.busy_poll = !o.no_busy_poll;
    if let Some(n) = o.fsname.clone() {
        mo.fsname = n;
    }
    if let Some(t) = threads.or(o.threads) {
        mo.threads = t;
    }
    if let Some(t) = cache_timeout.or(o.cache_timeout) {
        mo.cache_timeout = Duration::from_secs_f64(t);
    }
    mo
}

/// The cache timeout of a shared-storage mount unless one is given: how late other clients'
/// attribute and name changes may show, as NFS's default minimum.
const SHARED_CACHE_TIMEOUT: Duration = Duration::from_secs(1);

/// File system types (as /proc/self/mountinfo names them) that other machines mount too.
const NETWORK_FS: &[&str] = &[
    "nfs",
    "nfs4",
    "cifs",
    "smb3",
    "ceph",
    "fuse.ceph",
    "glusterfs",
    "fuse.glusterfs",
    "fuse.sshfs",
    "lustre",
    "gfs2",
    "ocfs2",
    "9p",
];

/// Network file system types whose clients do not pass locks on to each other.
const UNLOCKED_FS: &[&str] = &["fuse.sshfs"];

/// The type of the network file system `dir` (canonical) lies on, if it does.
fn network_file_system(dir: &Path) -> Option<String> {
    let all = mounts::current().ok()?;
    mounts::holding(&all, dir)
        .map(|m| m.fstype.clone())
        .filter(|t| NETWORK_FS.contains(&t.as_str()))
}

fn absolute_dir(p: &Path, what: &str) -> Result<PathBuf> {
    let abs = std::fs::canonicalize(p).map_err(|e| {
        let code = if what == "mount point" {
            code::MOUNT
        } else {
            code::VOLUME
        };
        Failure::new(code, format!("{what} {}: {e}", p.display()))
    })?;
    if !abs.is_dir() {
        return Err(Failure::usage(format!(
            "{what} {} is not a directory",
            p.display()
        )));
    }
    Ok(abs)
}

fn dir_has_entries(p: &Path) -> Result<bool> {
    Ok(std::fs::read_dir(p)
        .map_err(|e| Failure::mount(format!("mount point {}: {e}", p.display())))?
        .next()
        .is_some())
}

/// Clear errors for the two usual reasons FUSE cannot work here.
fn check_fuse_available() -> Result<()> {
    if !Path::new("/dev/fuse").exists() {
        return Err(Failure::mount(
            "/dev/fuse is missing: load the fuse kernel module (modprobe fuse)",
        ));
    }
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !root && find_in_path("fusermount3").is_none() {
        return Err(Failure::mount(
            "fusermount3 not found: install the fuse3 package (needed to mount without root)",
        ));
    }
    Ok(())
}

fn find_in_path(prog: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into());
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/bin"), PathBuf::from("/bin")])
        .map(|d| d.join(prog))
        .find(|p| {
            use std::os::unix::fs::PermissionsExt;
            p.metadata()
                .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
                .unwrap_or(false)
        })
}

/// Why this process cannot write into `dir`, if it cannot: then every write through a
/// read-write mount would fail, so the mount is made read-only instead.
fn not_writable(dir: &Path) -> Option<&'static str> {
    use rustix::fs::{Access, StatVfsMountFlags};
    if rustix::fs::statvfs(dir).is_ok_and(|v| v.f_flag.contains(StatVfsMountFlags::RDONLY)) {
        return Some("on a read-only file system");
    }
    match rustix::fs::access(dir, Access::WRITE_OK) {
        Err(rustix::io::Errno::ACCESS) | Err(rustix::io::Errno::PERM) => {
            Some("no write permission")
        }
        Err(rustix::io::Errno::ROFS) => Some("on a read-only file system"),
        _ => None,
    }
}

/// Makes what the daemon wrote durable before it exits (best effort).
pub(crate) fn sync_dir(dir: &Path) {
    if let Ok(f) = std::fs::File::open(dir) {
        use std::os::fd::AsRawFd;
        // SAFETY: syncfs on a valid open descriptor.
        unsafe { libc::syncfs(f.as_raw_fd()) };
    }
}
