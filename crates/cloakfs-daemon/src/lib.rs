//! cloakfs multi-user daemon (NCryptfs sections 3-4, CFS section 2): one FUSE tree of
//! attaches, each guarded by authorizations and active sessions with timeouts and
//! revocation, and the control protocol every user command speaks.
//!
//! Modules: [`protocol`] (the wire contract), [`client`], [`auth`] (challenge-response),
//! [`perms`], [`naming`], [`registry`] (all access-control state and decisions, pure),
//! [`gate`] (the FUSE gate), [`daemon`] (control operations), [`server`] (the socket),
//! [`limits`] (quotas and timeouts), [`throttle`] (guessing), [`timer`], [`watch`] (process
//! exits), [`callback`], [`peer`] (credentials), [`tree`].
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
pub mod limits;
// Public only for the fuzz targets (fuzz/): not part of the daemon's API.
#[doc(hidden)]
pub mod lines;
pub mod naming;
pub mod peer;
pub mod perms;
pub mod protocol;
pub mod refusals;
pub mod registry;
pub mod server;
pub mod shared;
pub mod throttle;
pub mod timer;
pub mod tree;
pub mod watch;

use crate::tree::Tree;
use cloakfs_fuse::tree::mount_tree;
use cloakfs_fuse::MountOptions;
use limits::Limits;
use std::io;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};
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
    /// Quotas and control-socket timeouts.
    pub limits: Limits,
    /// Once asked to stop, how long files still open in the tree keep it served before
    /// its FUSE connection is aborted.
    pub stop_timeout: Duration,
}

/// Default [`DaemonOptions::stop_timeout`].
pub const DEFAULT_STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// Asks a running daemon to stop, from any thread (a signal handler's): the tree is
/// unmounted lazily, and if files open in it still keep it served after the stop timeout,
/// its FUSE connection is aborted, so the daemon always ends.
#[derive(Clone, Default)]
pub struct Stop(Arc<(Mutex<StopState>, Condvar)>);

#[derive(Default)]
struct StopState {
    requested: bool,
    finished: bool,
}

impl Stop {
    pub fn new() -> Self {
        Self::default()
    }

    /// Asks the daemon to stop (again is fine).
    pub fn request(&self) {
        self.update(|s| s.requested = true);
    }

    fn finish(&self) {
        self.update(|s| s.finished = true);
    }

    fn update(&self, f: impl FnOnce(&mut StopState)) {
        let (m, c) = &*self.0;
        f(&mut m.lock().unwrap_or_else(|e| e.into_inner()));
        c.notify_all();
    }

    /// Waits until `cond` holds or `timeout` passes (None: no limit); says whether it holds.
    fn wait(&self, timeout: Option<Duration>, cond: impl Fn(&StopState) -> bool) -> bool {
        let (m, c) = &*self.0;
        let deadline = timeout.map(|t| std::time::Instant::now() + t);
        let mut s = m.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if cond(&s) {
                return true;
            }
            let left = match deadline {
                Some(d) => d.saturating_duration_since(std::time::Instant::now()),
                None => Duration::from_secs(3600),
            };
            if left.is_zero() {
                return false;
            }
            s = c.wait_timeout(s, left).unwrap_or_else(|e| e.into_inner()).0;
        }
    }
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
/// watcher, calls `ready` once everything serves, and returns when the tree is unmounted or
/// `stop` is requested (every attach's keys are wiped and the socket removed on the way
/// out).
pub fn run(opts: DaemonOptions, stop: Stop, ready: impl FnOnce()) -> io::Result<()> {
    let shared = Arc::new(shared::Shared::with_limits(opts.limits));
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
    let stopper = {
        let (stop, shared, tree, d) = (stop.clone(), shared.clone(), handle.clone(), d.clone());
        let (timeout, socket) = (opts.stop_timeout, opts.socket.clone());
        std::thread::Builder::new()
            .name("cloakfs-stop".into())
            .spawn(move || stop_when_asked(&stop, &shared, &tree, &d, timeout, &socket))?
    };
    ready();
    let r = mounted.run();
    stop.finish();
    let _ = stopper.join();
    tracing::info!("tree unmounted: shutting down");
    server.stop();
    timer::stop(&shared, timer);
    d.detach_all();
    remove_socket();
    r
}

/// Waits for `stop`, then ends the tree: unmounts it lazily and wakes every sleeping
/// request. If something still holds the tree after `timeout`, its FUSE connection is
/// aborted through the fuse control file system, and the serving loop ends; where that is
/// not mounted (or the loop still serves after another `timeout`), every key is wiped and
/// the process exits, which closes the FUSE device and so aborts the connection too.
fn stop_when_asked<T: Tree>(
    stop: &Stop,
    shared: &shared::Shared,
    tree: &T,
    daemon: &daemon::Daemon<T>,
    timeout: Duration,
    socket: &std::path::Path,
) {
    stop.wait(None, |s| s.requested || s.finished);
    if !stop.wait(Some(Duration::ZERO), |s| s.requested && !s.finished) {
        return;
    }
    tracing::info!("asked to stop: unmounting the tree");
    shared.lock().stopped = true;
    shared.notify();
    tree.unmount();
    if stop.wait(Some(timeout), |s| s.finished) {
        return;
    }
    tracing::warn!(
        "the tree is still in use {} s after the unmount: aborting its FUSE connection",
        timeout.as_secs()
    );
    match tree.abort() {
        Ok(()) => {
            if stop.wait(Some(timeout), |s| s.finished) {
                return;
            }
            tracing::error!("the tree still serves after its connection was aborted");
        }
        Err(e) => tracing::info!("no fuse control file system ({e}): ending the process"),
    }
    daemon.detach_all();
    let _ = std::fs::remove_file(socket);
    tracing::info!("every key wiped: exiting");
    std::process::exit(0);
}
