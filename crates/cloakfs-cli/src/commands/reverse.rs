//! `cloakfs reverse`: mount the read-only, deterministic encrypted view of a plaintext
//! directory (for backups to untrusted storage; docs/FORMAT.md section 17).

use crate::args::UnlockArgs;
use crate::daemon;
use crate::failure::{code, Failure, Result};
use clap::Args;
use cloakfs_core::format::config::VolumeConfig;
use cloakfs_core::io::reverse::ReverseView;
use cloakfs_fuse::MountOptions;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Name of the reverse config inside the plaintext directory (never shown in the view).
pub const REVERSE_CONFIG: &str = ".cloakfs.reverse.conf";

/// Where `init --reverse` puts the config of the view of `plaindir` by default.
pub fn default_config(plaindir: &Path) -> PathBuf {
    plaindir.join(REVERSE_CONFIG)
}

#[derive(Debug, Args)]
pub struct ReverseArgs {
    #[command(flatten)]
    pub unlock: UnlockArgs,
    /// The reverse config, if not PLAINDIR/.cloakfs.reverse.conf.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Stay in the foreground (log to standard error) instead of daemonizing.
    #[arg(short, long)]
    pub foreground: bool,
    /// Let other users (and root) read the view (`allow_other`; needs user_allow_other in
    /// /etc/fuse.conf unless run as root).
    #[arg(long)]
    pub allow_other: bool,
    /// Seconds the kernel may cache attributes and names [default: 0: every request sees the
    /// plaintext tree as it is then, so a backup never misses a change].
    #[arg(long, value_name = "SECS")]
    pub cache_timeout: Option<f64>,
    /// Append the daemon's log to FILE (default: syslog when daemonized).
    #[arg(long, value_name = "FILE")]
    pub log_file: Option<PathBuf>,
    /// The plaintext directory.
    pub plaindir: PathBuf,
    /// Where the encrypted view appears.
    pub view: PathBuf,
}

pub fn run(args: ReverseArgs) -> Result<()> {
    let plaindir = canonical_dir(&args.plaindir, "plaintext directory", code::VOLUME)?;
    let view_dir = canonical_dir(&args.view, "view mount point", code::MOUNT)?;
    if view_dir.starts_with(&plaindir) {
        return Err(Failure::usage(
            "the view may not lie inside the plaintext directory (it would show itself)",
        ));
    }
    let config_file = args
        .config
        .clone()
        .unwrap_or_else(|| default_config(&plaindir));
    let config_file = std::fs::canonicalize(&config_file).map_err(|e| {
        Failure::new(
            code::VOLUME,
            format!(
                "reverse config {}: {e} (make one with cloakfs init --reverse)",
                config_file.display()
            ),
        )
    })?;
    // Read once: these bytes are both unlocked and shown, so the view's config is the one
    // whose MAC was checked.
    // Its time through the same descriptor: the view's own files carry it.
    let read = |f: &Path| {
        let mut file = std::fs::File::open(f)?;
        let mut text = Vec::new();
        std::io::Read::read_to_end(&mut file, &mut text)?;
        Ok::<_, std::io::Error>((text, file.metadata()?.modified()?))
    };
    let (text, config_time) = read(&config_file)
        .map_err(|e| Failure::new(code::VOLUME, format!("{}: {e}", config_file.display())))?;
    let config = VolumeConfig::parse(
        std::str::from_utf8(&text)
            .map_err(|_| Failure::new(code::VOLUME, "damaged volume config: not UTF-8 text"))?,
    )?;
    if config.params.content != cloakfs_core::format::content::ContentSuite::Aes256GcmSiv {
        return Err(Failure::new(
            code::VOLUME,
            format!(
                "{} is not a reverse config (content cipher {}, not aes-256-gcm-siv): make one \
                 with cloakfs init --reverse",
                config_file.display(),
                config.params.content.name()
            ),
        ));
    }
    let hidden = config_file
        .strip_prefix(&plaindir)
        .ok()
        .map(|p| p.as_os_str().as_bytes().to_vec());
    let u = crate::unlock::open_config(&args.unlock, &config, &config_file, |_| true)?;
    let volume = crate::unlock::into_volume(config, u)?;
    let view = ReverseView::new(volume)?;

    let mut mo = MountOptions::new(&plaindir);
    mo.fsname = format!("cloakfs-reverse:{}", plaindir.display());
    mo.allow_other = args.allow_other;
    // The plaintext tree changes behind the view's back (no request of the view's changes
    // it), so whatever the kernel cached may be stale: by default it caches nothing.
    mo.cache_timeout = Duration::from_secs_f64(args.cache_timeout.unwrap_or(0.0));
    let mounted =
        cloakfs_fuse::mount_reverse(view, &plaindir, text, config_time, hidden, &view_dir, &mo)
            .map_err(|e| Failure::mount(format!("cannot mount on {}: {e}", view_dir.display())))?;
    daemon::serve_mounted(
        args.log_file.as_deref(),
        args.foreground,
        "Reverse view mounted and ready.",
    )?;
    crate::signals::unmount_on_signal(view_dir.clone());
    tracing::info!("serving the reverse view on {}", view_dir.display());
    mounted
        .run()
        .map_err(|e| Failure::mount(format!("file system session ended with an error: {e}")))
}

fn canonical_dir(p: &Path, what: &str, code: u8) -> Result<PathBuf> {
    let abs = std::fs::canonicalize(p)
        .map_err(|e| Failure::new(code, format!("{what} {}: {e}", p.display())))?;
    if !abs.is_dir() {
        return Err(Failure::usage(format!(
            "{what} {} is not a directory",
            p.display()
        )));
    }
    Ok(abs)
}
