//! cloakfs multi-user daemon (NCryptfs sections 3-4, CFS section 2): one FUSE tree of
//! attaches, each guarded by authorizations and active sessions with timeouts and
//! revocation, and the control protocol every user command speaks.
//!
//! Modules: [`protocol`] (the wire contract), [`client`], [`auth`] (challenge-response),
//! [`perms`], [`naming`], [`registry`] (all access-control state and decisions, pure),
//! [`gate`] (the FUSE gate), [`daemon`] (control operations), [`server`] (the socket),
//! [`timer`], [`watch`] (process exits), [`callback`], [`peer`] (credentials), [`tree`].
//!
//! Permissions: read/write/exec guard file access; detach, add-authz, list-authz (also
//! `sessions`), del-authz and revoke guard management and must be held by an *active*
//! session matching the caller; bypass makes the backing files be used with the owner's
//! credentials. `auth` and `attach` are carried for delegation only: `auth NAME` needs
//! nothing but an unexpired authorization matching the caller, and `attach` would mean
//! "may resupply the key of this name" (not used yet).

pub mod auth;
pub mod callback;
pub mod client;
pub mod daemon;
pub mod gate;
// Public only for the fuzz targets (fuzz/): not part of the daemon's API.
#[doc(hidden)]
pub mod lines;
pub mod naming;
pub mod peer;
pub mod perms;
pub mod protocol;
pub mod registry;
pub mod server;
pub mod shared;
pub mod timer;
pub mod tree;
pub mod watch;

use cloakfs_fuse::tree::mount_tree;
use cloakfs_fuse::MountOptions;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// How to run the daemon.
#[derive(Debug, Clone)]
pub struct DaemonOptions {
    /// Where the tree of attaches is mounted (e.g. /crypt).
    pub root: PathBuf,
    /// The control socket (e.g. /run/cloakfs/control.sock).
    pub socket: PathBuf,
    /// Longest time a request sleeps under a sleep-new / sleep-all timeout.
    pub max_wait: Duration,
    /// FUSE worker threads.
    pub threads: usize,
    /// How long the kernel caches names and attributes inside attaches.
    pub cache_timeout: Duration,
}

/// Threads the tree serves with (it uses at least 16, since gate calls may sleep).
fn tree_threads(threads: usize) -> usize {
    threads.max(16)
}

/// Sleeping requests allowed at once: all worker threads but four, so others still get
/// served.
pub fn max_waiters(threads: usize) -> usize {
    tree_threads(threads).saturating_sub(4)
}

/// The wait limit, kept below the kernel's FUSE request timeout when one is set.
pub fn clamp_max_wait(max_wait: Duration) -> Duration {
    let kernel = std::fs::read_to_string("/proc/sys/fs/fuse/default_request_timeout")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .filter(|&s| s > 1);
    match kernel {
        Some(k) => max_wait.min(Duration::from_secs(k - 1)),
        None => max_wait,
    }
}

/// Runs the daemon: binds the control socket (refusing if another daemon answers), mounts
/// the tree at `opts.root`, starts the control server, the timeout thread and the process
/// watcher, calls `ready` once everything serves, and returns when the tree is unmounted
/// (every attach's keys are wiped and the socket removed on the way out).
pub fn run(opts: DaemonOptions, ready: impl FnOnce()) -> io::Result<()> {
    let shared = Arc::new(shared::Shared::new());
    let gate = Arc::new(gate::DaemonGate::new(
        shared.clone(),
        clamp_max_wait(opts.max_wait),
        max_waiters(opts.threads),
    ));
    let listener = server::bind(&opts.socket)?;
    let remove_socket = || {
        let _ = std::fs::remove_file(&opts.socket);
    };
    let mut mo = MountOptions::new(std::path::Path::new("cloakfs"));
    mo.allow_other = true;
    mo.threads = tree_threads(opts.threads);
    mo.cache_timeout = opts.cache_timeout;
    let (mounted, handle) = match mount_tree(&opts.root, gate, &mo) {
        Ok(m) => m,
        Err(e) => {
            remove_socket();
            return Err(io::Error::new(
                e.kind(),
                format!("mounting the tree at {}: {e}", opts.root.display()),
            ));
        }
    };
    let started = (|| {
        let d = Arc::new(daemon::Daemon::new(
            shared.clone(),
            handle.clone(),
            opts.root.clone(),
        )?);
        let timer = timer::start(shared.clone(), handle.clone())?;
        let server = server::Server::start(d.clone(), listener, opts.socket.clone())?;
        Ok::<_, io::Error>((d, timer, server))
    })();
    let (d, timer, server) = match started {
        Ok(x) => x,
        Err(e) => {
            remove_socket();
            // Dropping the unserved mount unmounts it.
            drop(mounted);
            return Err(e);
        }
    };
    tracing::info!(root = %opts.root.display(), socket = %opts.socket.display(), "cloakfs daemon serving");
    ready();
    let r = mounted.run();
    tracing::info!("tree unmounted: shutting down");
    server.stop();
    timer::stop(&shared, timer);
    d.detach_all();
    remove_socket();
    r
}
