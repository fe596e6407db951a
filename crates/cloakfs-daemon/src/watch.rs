//! Process exits, through pidfds: sessions and authorizations bound to a process (or to the
//! leader of a Unix session) end with it, so a recycled pid inherits nothing. Only processes
//! the registry still names are watched ([`Watcher::retain`]), so what one user can make
//! the daemon hold is bounded by their quotas.

use crate::peer::Process;
use rustix::fd::{AsRawFd, OwnedFd};
use std::collections::{BTreeSet, HashMap};
use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

struct Inner {
    fds: Mutex<HashMap<u32, OwnedFd>>,
    /// Pidfds no longer watched, closed by the watching thread once its poll has returned
    /// (closing one under a running poll could let a new descriptor take its number).
    retired: Mutex<Vec<OwnedFd>>,
    stop: std::sync::atomic::AtomicBool,
    wake: Mutex<UnixStream>,
}

/// Watches processes on one thread (poll(2) on their pidfds) and reports each exit once.
pub struct Watcher {
    inner: Arc<Inner>,
    thread: Option<JoinHandle<()>>,
}

impl Watcher {
    /// Starts the watching thread; `on_exit(pid)` runs on it for every watched process that
    /// exits.
    pub fn start(on_exit: impl Fn(u32) + Send + 'static) -> io::Result<Watcher> {
        let (wake_rx, wake_tx) = UnixStream::pair()?;
        wake_rx.set_nonblocking(true)?;
        wake_tx.set_nonblocking(true)?;
        let inner = Arc::new(Inner {
            fds: Mutex::new(HashMap::new()),
            retired: Mutex::new(Vec::new()),
            stop: false.into(),
            wake: Mutex::new(wake_tx),
        });
        let i2 = inner.clone();
        let thread = std::thread::Builder::new()
            .name("cloakfs-watch".into())
            .spawn(move || run(&i2, wake_rx, on_exit))?;
        Ok(Watcher {
            inner,
            thread: Some(thread),
        })
    }

    /// Watches `pid` (again is fine). Fails if no such process is running.
    pub fn watch(&self, pid: u32) -> io::Result<()> {
        if lock(&self.inner.fds).contains_key(&pid) {
            return Ok(());
        }
        self.watch_process(Process::open(pid)?);
        Ok(())
    }

    /// Watches a process already held by a pidfd (a process already watched under its pid
    /// keeps its first pidfd: if that one has exited, the exit is reported for the pid).
    pub fn watch_process(&self, p: Process) {
        let pid = p.pid();
        let mut fds = lock(&self.inner.fds);
        if fds.contains_key(&pid) {
            return;
        }
        fds.insert(pid, p.into_fd());
        drop(fds);
        self.wake();
    }

    /// Stops watching every process but those in `keep`.
    pub fn retain(&self, keep: &BTreeSet<u32>) {
        let mut fds = lock(&self.inner.fds);
        let gone: Vec<u32> = fds.keys().filter(|p| !keep.contains(p)).copied().collect();
        if gone.is_empty() {
            return;
        }
        let mut retired = lock(&self.inner.retired);
        for p in gone {
            retired.extend(fds.remove(&p));
        }
        drop((retired, fds));
        self.wake();
    }

    /// Number of processes watched.
    pub fn len(&self) -> usize {
        lock(&self.inner.fds).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn wake(&self) {
        let _ = lock(&self.inner.wake).write(&[1]);
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.inner
            .stop
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.wake();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn run(inner: &Inner, mut wake_rx: UnixStream, on_exit: impl Fn(u32)) {
    loop {
        if inner.stop.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        let watched: Vec<(u32, i32)> = lock(&inner.fds)
            .iter()
            .map(|(p, fd)| (*p, fd.as_raw_fd()))
            .collect();
        let mut pfds: Vec<libc::pollfd> = std::iter::once(wake_rx.as_raw_fd())
            .chain(watched.iter().map(|(_, fd)| *fd))
            .map(|fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        // SAFETY: `pfds` is a valid array of its length. Every descriptor stays open during
        // the call: pidfds are closed only by this thread (below), the wake socket is ours.
        let n = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, -1) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            tracing::error!("process watcher: poll: {e}");
            return;
        }
        if pfds[0].revents != 0 {
            let mut buf = [0u8; 64];
            while matches!(wake_rx.read(&mut buf), Ok(n) if n > 0) {}
        }
        for (i, (pid, fd)) in watched.iter().enumerate() {
            if pfds[i + 1].revents == 0 {
                continue;
            }
            let mut fds = lock(&inner.fds);
            // Unless it was retired meanwhile (and perhaps watched anew).
            if fds.get(pid).is_some_and(|f| f.as_raw_fd() == *fd) {
                fds.remove(pid);
                drop(fds);
                on_exit(*pid);
            }
        }
        // Only now: no descriptor number polled above can have been given out again.
        lock(&inner.retired).clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;
    use std::sync::mpsc;
    use std::time::Duration;

    #[test]
    fn reports_exits() {
        let (tx, rx) = mpsc::channel();
        let tx = Mutex::new(tx);
        let w = Watcher::start(move |pid| {
            let _ = lock(&tx).send(pid);
        })
        .unwrap();
        let mut child = Command::new("/bin/sh")
            .args(["-c", "read x"])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let pid = child.id();
        w.watch(pid).unwrap();
        w.watch(pid).unwrap();
        w.watch(std::process::id()).unwrap();
        assert_eq!(w.len(), 2);
        drop(child.stdin.take());
        child.wait().unwrap();
        assert_eq!(rx.recv_timeout(Duration::from_secs(30)).unwrap(), pid);
        assert_eq!(w.len(), 1);
        // A process that is gone cannot be watched.
        assert_eq!(w.watch(pid).unwrap_err().kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn retain_lets_go_of_the_rest() {
        let w = Watcher::start(|_| {}).unwrap();
        let mut child = Command::new("/bin/sh")
            .args(["-c", "read x"])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        w.watch(child.id()).unwrap();
        w.watch(std::process::id()).unwrap();
        assert_eq!(w.len(), 2);
        w.retain(&BTreeSet::from([std::process::id()]));
        assert_eq!(w.len(), 1);
        w.retain(&BTreeSet::new());
        assert!(w.is_empty());
        drop(child.stdin.take());
        child.wait().unwrap();
    }
}
