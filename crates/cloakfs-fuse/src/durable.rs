//! New directory IDs made durable off the request path.
//!
//! A directory's entries are named under its ID (`cloakfs.dirid`, docs/FORMAT.md 9.2), so an
//! ID lost in a power cut makes every name in the directory unreadable. A new directory's ID
//! file and the directory itself used to be fsynced before MKDIR replied: two cache flushes of
//! the backing disk, which made a MKDIR of an untar take 0.69 ms on average on the bench disk,
//! against 0.17 ms without them.
//!
//! [`Syncer`] moves those fsyncs to a thread of their own, and keeps the guarantee that matters:
//! nothing that already existed comes to depend on an ID that is not yet durable. Every
//! request that could make it so (a rename or link, which may move old entries into a new
//! directory) and every request whose caller asks for durability (fsync, fsyncdir) first
//! waits for the syncs queued before it ([`Syncer::drain`]); so does a directory's removal,
//! which must not find its ID file still open here (`emptied_then`). What a power cut can
//! still take is a directory created a moment (one fsync) before it, with the entries created
//! in it meanwhile: new objects that no one had asked to be durable. gocryptfs's
//! [#1033](https://github.com/rfjakob/gocryptfs/issues/1033) (an empty `gocryptfs.diriv`
//! after an fsync of the parent and a power cut) cannot happen here: that fsync drains.
//!
//! A sync that fails (EIO, ENOSPC from the backing store) is not forgotten once reported: the
//! job stays, and every drain writes its ID again and retries it, failing with the error until
//! a retry succeeds. Retrying the fsync alone would prove nothing: after a failed writeback
//! the backing file system may mark the pages clean, and a second fsync then returns 0 for
//! data that never reached the disk.

use crate::sys::{errno, Res};
use rustix::fd::OwnedFd;
use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

/// Syncs that may wait at once; a MKDIR beyond them waits for a free place, so the queue's
/// descriptors (two per directory) stay few.
const QUEUE_LEN: usize = 32;

/// What makes one new directory durable: its ID file (open for writing) holding `id`, and the
/// directory itself, fsynced in that order.
pub(crate) struct Job {
    pub(crate) id_file: OwnedFd,
    pub(crate) id: [u8; 16],
    pub(crate) dir: OwnedFd,
}

impl Job {
    /// Fsyncs the ID file and the directory; `rewrite` first writes the ID again (a retry).
    fn run(&self, rewrite: bool) -> rustix::io::Result<()> {
        if rewrite {
            let n = rustix::io::pwrite(&self.id_file, &self.id, 0)?;
            if n != self.id.len() {
                return Err(rustix::io::Errno::IO);
            }
        }
        rustix::fs::fsync(&self.id_file)?;
        rustix::fs::fsync(&self.dir)
    }
}

/// How far the sync thread has come.
#[derive(Default)]
struct Progress {
    queued: u64,
    done: u64,
    /// Jobs whose sync failed, with the error, until a retry succeeds.
    failed: Vec<(Job, rustix::io::Errno)>,
}

struct Shared {
    progress: Mutex<Progress>,
    advanced: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Progress> {
        self.progress.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `job` and counts it done; a failed one is kept for [`Syncer::drain`] to retry.
    /// A synced job's descriptors are closed before it counts as done, so that a drain
    /// returns with no descriptor of the directory left open (see `emptied_then`).
    fn finish(&self, job: Job) {
        let failed = match job.run(false) {
            Ok(()) => {
                drop(job);
                None
            }
            Err(e) => Some((job, e)),
        };
        let mut p = self.lock();
        p.done += 1;
        if let Some((job, e)) = failed {
            tracing::error!("syncing a new directory's ID to the backing disk: {e}");
            p.failed.push((job, e));
        }
        self.advanced.notify_all();
    }
}

/// The sync thread, started by the first push: the file system is built before the daemon
/// forks into the background (which would leave the thread behind) and before it blocks the
/// signals that end a mount (which a thread started earlier would take, and die of).
enum Worker {
    Idle,
    Running(SyncSender<Job>, JoinHandle<()>),
    Stopped,
}

/// A thread that fsyncs queued descriptors in order, and the means to wait for it.
pub(crate) struct Syncer {
    shared: Arc<Shared>,
    worker: Mutex<Worker>,
}

impl Syncer {
    pub(crate) fn new() -> Self {
        Self {
            shared: Arc::new(Shared {
                progress: Mutex::new(Progress::default()),
                advanced: Condvar::new(),
            }),
            worker: Mutex::new(Worker::Idle),
        }
    }

    fn spawn(&self) -> std::io::Result<Worker> {
        let (tx, rx) = sync_channel::<Job>(QUEUE_LEN);
        let shared = self.shared.clone();
        let thread = std::thread::Builder::new()
            .name("cloakfs-sync".into())
            .spawn(move || {
                for job in rx {
                    shared.finish(job);
                }
            })?;
        Ok(Worker::Running(tx, thread))
    }

    /// Queues `job`; runs it here if the thread has stopped or could not start. Either way a
    /// failure is reported by every drain until a retry succeeds: the caller has already put
    /// the directory in place.
    pub(crate) fn push(&self, job: Job) {
        let sender = {
            let mut w = self.worker.lock().unwrap_or_else(|e| e.into_inner());
            if matches!(*w, Worker::Idle) {
                // A thread that cannot start now (no memory, thread limit) is not retried:
                // one warning, and every later sync in the caller, as after `stop`.
                *w = self.spawn().unwrap_or_else(|e| {
                    tracing::warn!("cannot start the sync thread ({e}): syncing inline");
                    Worker::Stopped
                });
            }
            match &*w {
                Worker::Running(tx, _) => Some(tx.clone()),
                Worker::Idle | Worker::Stopped => None,
            }
        };
        self.shared.lock().queued += 1;
        let unsent = match sender {
            // The thread only ends when the queue closes: if it is gone, sync here.
            Some(tx) => match tx.send(job) {
                Ok(()) => return,
                Err(unsent) => unsent.0,
            },
            None => job,
        };
        self.shared.finish(unsent);
    }

    /// Waits until everything queued before this call is synced, then retries every job that
    /// failed (writing its ID again). Fails with the first error of a job that still fails.
    pub(crate) fn drain(&self) -> Res<()> {
        let mut p = self.shared.lock();
        let target = p.queued;
        while p.done < target {
            p = self
                .shared
                .advanced
                .wait(p)
                .unwrap_or_else(|e| e.into_inner());
        }
        if p.failed.is_empty() {
            return Ok(());
        }
        // Retried here, under the lock: drains that come meanwhile wait for the outcome
        // instead of reporting success for a directory that is still not durable.
        let mut first = None;
        let failed = std::mem::take(&mut p.failed);
        for (job, _) in failed {
            match job.run(true) {
                Ok(()) => tracing::info!("a new directory's ID is durable after a retry"),
                Err(e) => {
                    first.get_or_insert(e);
                    p.failed.push((job, e));
                }
            }
        }
        match first {
            Some(e) => Err(errno(e)),
            None => Ok(()),
        }
    }

    /// Syncs what is queued and stops the thread. Later pushes sync in the caller.
    pub(crate) fn stop(&self) {
        let w = std::mem::replace(
            &mut *self.worker.lock().unwrap_or_else(|e| e.into_inner()),
            Worker::Stopped,
        );
        if let Worker::Running(tx, thread) = w {
            drop(tx);
            let _ = thread.join();
        }
    }
}

impl Drop for Syncer {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn job(dir: &tempfile::TempDir, name: &str) -> Job {
        let path = dir.path().join(name);
        let mut f = std::fs::File::create(&path).unwrap();
        f.write_all(&[7; 16]).unwrap();
        Job {
            id_file: OwnedFd::from(f),
            id: [7; 16],
            dir: OwnedFd::from(std::fs::File::open(dir.path()).unwrap()),
        }
    }

    /// A job whose syncs fail (fsync of a pipe: EINVAL, a stand-in for a disk error).
    fn failing_job(dir: &tempfile::TempDir) -> Job {
        let (_r, w) = std::io::pipe().unwrap();
        Job {
            id_file: w.into(),
            id: [1; 16],
            dir: OwnedFd::from(std::fs::File::open(dir.path()).unwrap()),
        }
    }

    #[test]
    fn drain_returns_once_the_queued_syncs_are_done() {
        let dir = tempfile::tempdir().unwrap();
        let s = Syncer::new();
        for i in 0..3 * QUEUE_LEN {
            s.push(job(&dir, &format!("f{i}")));
        }
        s.drain().unwrap();
        let p = s.shared.lock();
        assert_eq!(
            (p.queued, p.done),
            (3 * QUEUE_LEN as u64, 3 * QUEUE_LEN as u64)
        );
    }

    #[test]
    fn a_failed_sync_is_reported_by_every_drain_until_a_retry_succeeds() {
        let dir = tempfile::tempdir().unwrap();
        let s = Syncer::new();
        s.push(failing_job(&dir));
        s.push(job(&dir, "b"));
        assert!(s.drain().is_err());
        assert!(s.drain().is_err(), "still not durable: still an error");
        assert_eq!(s.shared.lock().failed.len(), 1);
        // What a successful retry leaves: nothing to report.
        s.shared.lock().failed.clear();
        assert_eq!(s.drain(), Ok(()));
    }

    #[test]
    fn a_retry_writes_the_id_again() {
        let dir = tempfile::tempdir().unwrap();
        let j = job(&dir, "id");
        std::fs::write(dir.path().join("id"), b"").unwrap();
        j.run(true).unwrap();
        assert_eq!(std::fs::read(dir.path().join("id")).unwrap(), [7; 16]);
    }

    #[test]
    fn after_stop_pushes_sync_in_the_caller() {
        let dir = tempfile::tempdir().unwrap();
        let s = Syncer::new();
        s.push(job(&dir, "a"));
        s.stop();
        assert_eq!(s.shared.lock().done, 1, "stop syncs what was queued");
        s.push(failing_job(&dir));
        assert_eq!(s.shared.lock().done, 2, "synced in the caller");
        assert!(s.drain().is_err());
    }
}
