//! `cloakfs daemon`: the multi-user daemon (run as root, in the foreground or under
//! systemd): one FUSE tree of attaches plus the control socket every user command talks to.

use crate::control::parse_duration;
use crate::failure::{Failure, Result};
use clap::Args;
use cloakfs_daemon::limits::Limits;
use cloakfs_daemon::protocol::{DEFAULT_ROOT, DEFAULT_SOCKET};
use cloakfs_daemon::{DaemonOptions, Stop};
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
    /// Control connections all users share (beyond them, 32 more are kept for root and the
    /// owners of attaches, one each).
    #[arg(long, default_value_t = Limits::default().connections, value_name = "N")]
    pub max_connections: usize,
    /// Control connections one user may hold at once.
    #[arg(long, default_value_t = Limits::default().connections_per_uid, value_name = "N")]
    pub max_connections_per_user: usize,
    /// A control request must arrive whole within this time of its first byte.
    #[arg(long, default_value = "10s", value_name = "DUR", value_parser = parse_duration)]
    pub request_timeout: Duration,
    /// A control connection with no request under way is closed after this long (it
    /// covers typing a passphrase for `cloakfs auth`).
    #[arg(long, default_value = "120s", value_name = "DUR", value_parser = parse_duration)]
    pub idle_timeout: Duration,
    /// On SIGTERM, SIGINT or SIGHUP, files still open in the tree keep it served this long;
    /// then its FUSE connection is aborted (their next access fails) and the daemon ends.
    #[arg(long, default_value = "5s", value_name = "DUR", value_parser = parse_duration)]
    pub stop_timeout: Duration,
    /// Append the log to FILE instead of standard error.
    #[arg(long, value_name = "FILE")]
    pub log_file: Option<PathBuf>,
}

pub fn run(args: DaemonArgs) -> Result<()> {
    let positive = |d: Duration, what: &str| {
        if d.is_zero() {
            Err(Failure::usage(format!("{what} must be longer than zero")))
        } else {
            Ok(d)
        }
    };
    let limits = Limits {
        connections: args.max_connections.max(1),
        connections_per_uid: args.max_connections_per_user.max(1),
        request_timeout: positive(args.request_timeout, "--request-timeout")?,
        idle_timeout: positive(args.idle_timeout, "--idle-timeout")?,
        ..Limits::default()
    };
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
    crate::daemon::log_to_file(args.log_file.as_deref())?;
    std::fs::create_dir_all(&args.root)
        .map_err(|e| Failure::mount(format!("tree root {}: {e}", args.root.display())))?;
    let root = std::fs::canonicalize(&args.root)?;
    let opts = DaemonOptions {
        root: root.clone(),
        socket: args.socket.clone(),
        max_wait: args.max_wait,
        threads: args.threads.max(4),
        cache_timeout: Duration::from_secs_f64(args.cache_timeout.max(0.0)),
        limits,
        stop_timeout: args.stop_timeout,
    };
    let stop = Stop::new();
    let on_signal = stop.clone();
    crate::signals::on_signal(move |sig| {
        tracing::info!("signal {sig}: stopping the daemon");
        on_signal.request();
    });
    let socket = args.socket.clone();
    cloakfs_daemon::run(opts, stop, move || {
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
