//! `cloakfs daemon`: the multi-user daemon (run as root, in the foreground or under
//! systemd): one FUSE tree of attaches plus the control socket every user command talks to.

use crate::control::parse_duration;
use crate::failure::{Failure, Result};
use clap::Args;
use cloakfs_daemon::protocol::{DEFAULT_ROOT, DEFAULT_SOCKET};
use cloakfs_daemon::DaemonOptions;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Debug, Args)]
pub struct DaemonArgs {
    /// Where the tree of attaches appears.
    #[arg(long, default_value = DEFAULT_ROOT, value_name = "DIR")]
    pub root: PathBuf,
    /// The control socket.
    #[arg(long, default_value = DEFAULT_SOCKET, value_name = "PATH")]
    pub socket: PathBuf,
    /// Longest time a request sleeps waiting for re-authentication before it fails.
    #[arg(long, default_value = "30s", value_name = "DUR", value_parser = parse_duration)]
    pub max_wait: Duration,
    /// Worker threads serving the file system.
    #[arg(long, default_value_t = 16, value_name = "N")]
    pub threads: usize,
    /// Seconds the kernel may cache attributes and names inside an attach. The default, 0,
    /// sends every path walk to the daemon, so the lower file system checks each directory
    /// search as the caller; more is faster but lets a cached path skip those checks.
    #[arg(long, default_value_t = 0.0, value_name = "SECS")]
    pub cache_timeout: f64,
    /// Append the log to FILE instead of standard error.
    #[arg(long, value_name = "FILE")]
    pub log_file: Option<PathBuf>,
}

pub fn run(args: DaemonArgs) -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(Failure::usage(
            "cloakfs daemon must run as root (it serves every user's attaches)",
        ));
    }
    if !Path::new("/dev/fuse").exists() {
        return Err(Failure::mount(
            "/dev/fuse is missing: load the fuse kernel module (modprobe fuse)",
        ));
    }
    if let Some(path) = &args.log_file {
        let f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| Failure::other(format!("log file {}: {e}", path.display())))?;
        crate::logging::redirect(Some(f));
    }
    std::fs::create_dir_all(&args.root)
        .map_err(|e| Failure::mount(format!("tree root {}: {e}", args.root.display())))?;
    let root = std::fs::canonicalize(&args.root)?;
    let opts = DaemonOptions {
        root: root.clone(),
        socket: args.socket.clone(),
        max_wait: args.max_wait,
        threads: args.threads.max(4),
        cache_timeout: Duration::from_secs_f64(args.cache_timeout.max(0.0)),
    };
    crate::signals::unmount_on_signal(root.clone());
    let socket = args.socket.clone();
    cloakfs_daemon::run(opts, move || {
        println!(
            "cloakfs daemon ready: attaches under {}, control socket {}.",
            root.display(),
            socket.display()
        );
        notify_systemd();
    })
    .map_err(|e| Failure::mount(format!("cloakfs daemon: {e}")))
}

/// Tells systemd (Type=notify) that the daemon serves.
fn notify_systemd() {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let sock = match std::os::unix::net::UnixDatagram::unbound() {
        Ok(s) => s,
        Err(_) => return,
    };
    let bytes = std::os::unix::ffi::OsStrExt::as_bytes(path.as_os_str());
    let sent = if let Some(abstract_name) = bytes.strip_prefix(b"@") {
        <std::os::unix::net::SocketAddr as std::os::linux::net::SocketAddrExt>::from_abstract_name(
            abstract_name,
        )
        .and_then(|addr| sock.send_to_addr(b"READY=1", &addr))
    } else {
        sock.send_to(b"READY=1", Path::new(&path))
    };
    if let Err(e) = sent {
        tracing::warn!("cannot notify systemd: {e}");
    }
}
