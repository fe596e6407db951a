//! The control socket: a Unix stream socket everyone may connect to (mode 0666), one thread
//! per connection (capped), one JSON request per line. Bad input gets an error answer and
//! never stops the daemon.

use crate::daemon::{Conn, Daemon};
use crate::lines::{Line, LineReader};
use crate::peer::peer_cred;
use crate::protocol::{Request, Response, MAX_MESSAGE};
use crate::tree::Tree;
use std::io::{self, Write};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// Most connections served at once.
pub const MAX_CONNECTIONS: usize = 64;
/// A connection idle this long is closed.
const IDLE: Duration = Duration::from_secs(300);

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

fn accept_loop<T: Tree>(daemon: Arc<Daemon<T>>, listener: &UnixListener, stop: &AtomicBool) {
    let active = Arc::new(AtomicUsize::new(0));
    loop {
        let accepted = listener.accept();
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let mut stream = match accepted {
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
        if active.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
            active.fetch_sub(1, Ordering::SeqCst);
            let _ = send(
                &mut stream,
                &Response::Error {
                    message: "the cloakfs daemon is busy: too many connections".into(),
                },
            );
            continue;
        }
        let (d, a) = (daemon.clone(), active.clone());
        let spawned = std::thread::Builder::new()
            .name("cloakfs-conn".into())
            .spawn(move || {
                if let Err(e) = connection(&d, stream) {
                    tracing::debug!("control connection: {e}");
                }
                a.fetch_sub(1, Ordering::SeqCst);
            });
        if let Err(e) = spawned {
            active.fetch_sub(1, Ordering::SeqCst);
            tracing::warn!("control socket: cannot start a connection thread: {e}");
        }
    }
}

fn send(stream: &mut UnixStream, resp: &Response) -> io::Result<()> {
    let mut text = serde_json::to_string(resp).map_err(io::Error::other)?;
    text.push('\n');
    stream.write_all(text.as_bytes())
}

/// Serves one connection until the peer closes it (or sends something unreadable).
pub fn connection<T: Tree>(daemon: &Daemon<T>, stream: UnixStream) -> io::Result<()> {
    let peer = peer_cred(&stream)?;
    stream.set_read_timeout(Some(IDLE))?;
    let mut out = stream.try_clone()?;
    let mut lines = LineReader::new(stream, MAX_MESSAGE);
    let mut conn = Conn::new(peer);
    loop {
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
        let Ok(text) = std::str::from_utf8(&msg) else {
            let _ = send(
                &mut out,
                &Response::Error {
                    message: "message is not UTF-8".into(),
                },
            );
            return Ok(());
        };
        let resp = match serde_json::from_str::<Request>(text) {
            // The handler wipes the secrets the request carries.
            Ok(req) => daemon.handle(&mut conn, req),
            Err(e) => {
                // Not logged with the parser's message: it may quote the input.
                tracing::debug!(uid = peer.uid, "malformed control request");
                Response::Error {
                    message: format!("malformed request: {e}"),
                }
            }
        };
        send(&mut out, &resp)?;
    }
}
