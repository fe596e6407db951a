//! The control socket: a Unix stream socket everyone may connect to (mode 0666), one thread
//! per connection, one JSON request per line. Bad input gets an error answer and never stops
//! the daemon.
//!
//! Nobody can crowd others out: each uid holds at most [`Limits::connections_per_uid`]
//! connections, and beyond the [`Limits::connections`] all users share, room is kept for
//! root and for the owners of attaches. A request must arrive whole within
//! [`Limits::request_timeout`] of its first byte, however slowly it trickles in, and a
//! connection with no request under way is closed after [`Limits::idle_timeout`].

use crate::daemon::{Conn, Daemon, PEER_EXITED};
use crate::limits::Limits;
use crate::lines::{Line, LineReader};
use crate::peer::{boot_ticks, Peer};
use crate::protocol::{parse_request, Response, MAX_MESSAGE};
use crate::tree::Tree;
use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Binds the control socket at `path`: creates its directory (mode 0755) if needed, removes
/// a stale socket nobody answers on, refuses to start if another daemon answers.
pub fn bind(path: &Path) -> io::Result<UnixListener> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        if !dir.exists() {
            std::fs::create_dir_all(dir)?;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
        }
    }
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            if UnixStream::connect(path).is_ok() {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!("another cloakfs daemon answers on {}", path.display()),
                ));
            }
            std::fs::remove_file(path)?;
        }
        Ok(_) => {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{} exists and is not a socket", path.display()),
            ))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let listener = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))?;
    Ok(listener)
}

/// A running control server.
pub struct Server {
    stop: Arc<AtomicBool>,
    listener: Arc<UnixListener>,
    thread: Option<JoinHandle<()>>,
    path: PathBuf,
}

impl Server {
    /// Serves `listener` (bound at `path`) on a new thread.
    pub fn start<T: Tree>(
        daemon: Arc<Daemon<T>>,
        listener: UnixListener,
        path: PathBuf,
    ) -> io::Result<Server> {
        let stop = Arc::new(AtomicBool::new(false));
        let listener = Arc::new(listener);
        let (s2, l2) = (stop.clone(), listener.clone());
        let thread = std::thread::Builder::new()
            .name("cloakfs-control".into())
            .spawn(move || accept_loop(daemon, &l2, &s2))?;
        Ok(Server {
            stop,
            listener,
            thread: Some(thread),
            path,
        })
    }

    /// Stops accepting, and removes the socket.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accept(2) of the listening socket (it then fails with EINVAL).
        let _ = rustix::net::shutdown(&*self.listener, rustix::net::Shutdown::Both);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.thread.is_some() {
            self.shutdown();
        }
    }
}

/// Connections open right now, in all and per uid.
#[derive(Default)]
struct Counts {
    total: usize,
    reserved: usize,
    per_uid: HashMap<u32, usize>,
    /// Reserved connections per uid.
    reserved_per_uid: HashMap<u32, usize>,
}

/// Reserved connections one owner may hold: enough for one command after another (a
/// connection is counted until the daemon has seen it close).
const RESERVED_PER_UID: usize = 2;

/// Which pool a connection was admitted from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pool {
    Shared,
    Reserved,
}

/// Admits a connection of `uid`, or says why not. `owner` is asked only when the shared
/// pool is full: is `uid` root or the owner of an attach?
fn admit(
    counts: &mut Counts,
    limits: &Limits,
    uid: u32,
    owner: impl FnOnce() -> bool,
) -> Result<Pool, String> {
    let mine = counts.per_uid.get(&uid).copied().unwrap_or(0);
    if mine >= limits.connections_per_uid {
        return Err(format!(
            "you have {} connections to the cloakfs daemon open, the most allowed: close one",
            limits.connections_per_uid
        ));
    }
    let pool = if counts.total < limits.connections {
        Pool::Shared
    } else if counts.reserved < limits.reserved_for_owners
        && counts.reserved_per_uid.get(&uid).copied().unwrap_or(0) < RESERVED_PER_UID
        && owner()
    {
        Pool::Reserved
    } else {
        return Err("the cloakfs daemon is busy: too many connections".into());
    };
    *counts.per_uid.entry(uid).or_insert(0) += 1;
    match pool {
        Pool::Shared => counts.total += 1,
        Pool::Reserved => {
            counts.reserved += 1;
            *counts.reserved_per_uid.entry(uid).or_insert(0) += 1;
        }
    }
    Ok(pool)
}

fn release(counts: &mut Counts, uid: u32, pool: Pool) {
    if let Some(n) = counts.per_uid.get_mut(&uid) {
        *n -= 1;
        if *n == 0 {
            counts.per_uid.remove(&uid);
        }
    }
    match pool {
        Pool::Shared => counts.total -= 1,
        Pool::Reserved => {
            counts.reserved -= 1;
            if let Some(n) = counts.reserved_per_uid.get_mut(&uid) {
                *n -= 1;
                if *n == 0 {
                    counts.reserved_per_uid.remove(&uid);
                }
            }
        }
    }
}

fn lock(m: &Mutex<Counts>) -> std::sync::MutexGuard<'_, Counts> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn accept_loop<T: Tree>(daemon: Arc<Daemon<T>>, listener: &UnixListener, stop: &AtomicBool) {
    let counts = Arc::new(Mutex::new(Counts::default()));
    let limits = *daemon.limits();
    loop {
        let accepted = listener.accept();
        let accepted_at = boot_ticks();
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let stream = match accepted {
            Ok((s, _)) => s,
            Err(e) => {
                if e.kind() != io::ErrorKind::Interrupted {
                    tracing::warn!("control socket: accept: {e}");
                    // Do not spin on a persistent error (e.g. out of descriptors).
                    std::thread::sleep(Duration::from_millis(100));
                }
                continue;
            }
        };
        // Cheap and fixed at connect time: enough to count the connection by its user.
        let Some(uid) = peer_uid(&stream) else {
            continue;
        };
        let admitted = admit(&mut lock(&counts), &limits, uid, || {
            uid == 0 || daemon.shared().lock().owns_attach(uid)
        });
        let pool = match admitted {
            Ok(p) => p,
            Err(message) => {
                tracing::debug!(uid, "control connection refused: {message}");
                refuse(stream, &message);
                continue;
            }
        };
        let (d, c) = (daemon.clone(), counts.clone());
        let spawned = std::thread::Builder::new()
            .name("cloakfs-conn".into())
            .spawn(move || {
                if let Err(e) = connection(&d, stream, accepted_at) {
                    tracing::debug!(uid, "control connection: {e}");
                }
                release(&mut lock(&c), uid, pool);
            });
        if let Err(e) = spawned {
            release(&mut lock(&counts), uid, pool);
            tracing::warn!("control socket: cannot start a connection thread: {e}");
        }
    }
}

/// The uid of a connected peer (SO_PEERCRED).
fn peer_uid(stream: &UnixStream) -> Option<u32> {
    rustix::net::sockopt::socket_peercred(stream)
        .ok()
        .map(|c| c.uid.as_raw())
}

/// Tells a refused peer why, without ever waiting for it.
fn refuse(stream: UnixStream, message: &str) {
    let mut stream = stream;
    if stream.set_nonblocking(true).is_ok() {
        let _ = send(
            &mut stream,
            &Response::Error {
                message: message.into(),
            },
        );
    }
}

fn send(stream: &mut UnixStream, resp: &Response) -> io::Result<()> {
    let mut text = serde_json::to_string(resp).map_err(io::Error::other)?;
    text.push('\n');
    stream.write_all(text.as_bytes())
}

/// Reads with a deadline that any byte cannot push back: [`Deadline::idle`] between
/// requests, then, from the first byte of a request, the request timeout.
struct Deadline {
    stream: UnixStream,
    until: Instant,
    started: bool,
    request_timeout: Duration,
}

impl Deadline {
    /// Waits for a request: at most `idle`, or the request timeout if one is under way
    /// already (`pending` bytes of it are buffered).
    fn idle(&mut self, idle: Duration, pending: bool) {
        let now = Instant::now();
        self.started = pending;
        self.until = now + if pending { self.request_timeout } else { idle };
    }
}

impl Read for Deadline {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "request deadline passed",
            ));
        }
        self.stream.set_read_timeout(Some(left))?;
        let n = match self.stream.read(buf) {
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "request deadline passed",
                ))
            }
            r => r?,
        };
        if n > 0 && !self.started {
            self.started = true;
            self.until = self.until.min(Instant::now() + self.request_timeout);
        }
        Ok(n)
    }
}

/// Serves one connection until the peer closes it, sends something unreadable, runs out of
/// time, or its process exits. `accepted_at` is [`boot_ticks`] at accept time.
pub fn connection<T: Tree>(
    daemon: &Daemon<T>,
    stream: UnixStream,
    accepted_at: u64,
) -> io::Result<()> {
    let limits = *daemon.limits();
    let mut out = stream.try_clone()?;
    let (peer, process) = match Peer::of_socket(&stream, accepted_at) {
        Ok(p) => p,
        Err(e) => {
            let _ = send(
                &mut out,
                &Response::Error {
                    message: format!("connection refused: {e}"),
                },
            );
            return Err(e);
        }
    };
    out.set_write_timeout(Some(limits.request_timeout))?;
    let uid = peer.uid;
    let mut conn = Conn::new(peer, process);
    let mut lines = LineReader::new(
        Deadline {
            stream,
            until: Instant::now(),
            started: false,
            request_timeout: limits.request_timeout,
        },
        MAX_MESSAGE,
    );
    loop {
        let pending = lines.buffered() > 0;
        lines.get_mut().idle(limits.idle_timeout, pending);
        let msg = match lines.next_line()? {
            Line::Eof => return Ok(()),
            Line::TooLong => {
                let _ = send(
                    &mut out,
                    &Response::Error {
                        message: format!("message longer than {MAX_MESSAGE} bytes"),
                    },
                );
                return Ok(());
            }
            Line::Message(m) => m,
        };
        if conn.exited() {
            // Its pid may be someone else's by now: not one more answer.
            let _ = send(
                &mut out,
                &Response::Error {
                    message: PEER_EXITED.into(),
                },
            );
            tracing::info!(
                uid,
                "control request refused: the connecting process has exited"
            );
            return Ok(());
        }
        let resp = match parse_request(&msg) {
            // The handler wipes the secrets the request carries.
            Ok(req) => daemon.handle(&mut conn, req),
            Err(message) => {
                // Not logged with the parser's message: it may quote the input.
                tracing::debug!(uid, "malformed control request");
                let not_utf8 = std::str::from_utf8(&msg).is_err();
                let _ = send(&mut out, &Response::Error { message });
                if not_utf8 {
                    return Ok(());
                }
                continue;
            }
        };
        send(&mut out, &resp)?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_are_counted_per_uid_with_room_for_owners() {
        let limits = Limits {
            connections: 4,
            connections_per_uid: 2,
            reserved_for_owners: 2,
            ..Limits::default()
        };
        let mut c = Counts::default();
        let never = || false;
        assert!(admit(&mut c, &limits, 10, never).is_ok());
        assert!(admit(&mut c, &limits, 10, never).is_ok());
        // One user cannot take more than their share.
        assert!(admit(&mut c, &limits, 10, never)
            .unwrap_err()
            .contains("most allowed"));
        assert!(admit(&mut c, &limits, 11, never).is_ok());
        assert!(admit(&mut c, &limits, 12, never).is_ok());
        // Full: others are refused, owners get the reserve, two connections each.
        assert!(admit(&mut c, &limits, 13, never)
            .unwrap_err()
            .contains("busy"));
        assert!(admit(&mut c, &limits, 20, || true) == Ok(Pool::Reserved));
        assert!(admit(&mut c, &limits, 20, || true) == Ok(Pool::Reserved));
        assert!(admit(&mut c, &limits, 20, || true).is_err());
        let limits = Limits {
            reserved_for_owners: 3,
            ..limits
        };
        assert!(admit(&mut c, &limits, 21, || true) == Ok(Pool::Reserved));
        assert!(admit(&mut c, &limits, 22, || true).is_err());
        release(&mut c, 20, Pool::Reserved);
        assert!(admit(&mut c, &limits, 22, || true) == Ok(Pool::Reserved));
        release(&mut c, 10, Pool::Shared);
        assert!(admit(&mut c, &limits, 13, never) == Ok(Pool::Shared));
        assert_eq!(c.per_uid.get(&10), Some(&1));
    }
}
