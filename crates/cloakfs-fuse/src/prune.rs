//! Keeps the number of nodes, each holding one descriptor, below the process's limit of open
//! descriptors.
//!
//! The kernel keeps every name it has looked up until memory runs short, and we keep one
//! `O_PATH` descriptor per node it knows, so walking a tree larger than `RLIMIT_NOFILE`
//! (Postmark's 20,000 files under a limit of 20,000) would otherwise fail with EMFILE. When
//! the nodes of the whole process pass a high mark, a thread asks the kernel to drop the
//! names (`FUSE_NOTIFY_INVAL_ENTRY`) of the least recently used nodes that no handle has
//! open and that no other known node lies in (a file, or a directory whose known entries are
//! gone); its FORGETs free the nodes, and names come back by the next lookup. A dropped
//! directory that is some process's working directory stays usable, but `getcwd` reports it
//! as gone until its name is looked up again: the price of pruning, paid only at the
//! descriptor limit (raised to `fs.nr_open` when we may).
//!
//! The invalidations cannot be sent from a worker thread: the kernel takes the parent
//! directory's lock for them, which it may be holding while it waits for that very worker.

use fuser::{INodeNo, Notifier};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

/// Descriptors kept for everything but nodes (open files and directories, /dev/fuse clones,
/// logs), as a share of the limit...
const RESERVE_SHARE: usize = 8;
/// ...and at least this many.
const MIN_RESERVE: usize = 64;
/// A prune frees this share of the high mark: every name it drops is one the kernel may ask
/// for again (Postmark's files are used at random), so little at a time, though enough that
/// a prune is not due at every lookup.
const PRUNE_SHARE: usize = 16;

/// Nodes alive in this process, over every table (the multi-user tree has one per attach;
/// they share one descriptor limit).
static LIVE: AtomicUsize = AtomicUsize::new(0);

/// Counts one node made (see [`node_freed`]).
pub(crate) fn node_made() -> usize {
    LIVE.fetch_add(1, Ordering::Relaxed) + 1
}

/// Counts one node freed.
pub(crate) fn node_freed() {
    LIVE.fetch_sub(1, Ordering::Relaxed);
}

/// A name the kernel holds for a node: (parent node, plaintext name).
pub(crate) type SeenAs = (u64, Box<[u8]>);

/// When to prune and how far, and the channel to the kernel.
pub(crate) struct Pruner {
    /// A prune starts when more nodes than this are alive...
    high: usize,
    /// ...and brings them down to about this many.
    low: usize,
    /// Set once the session exists (the file system is created before its session).
    notifier: Arc<OnceLock<Notifier>>,
    running: Arc<AtomicBool>,
    /// Table clock (nodes made) before which no new prune starts: when most nodes are in
    /// use, scanning again on every lookup would free nothing and cost a scan each time.
    next_at: AtomicU64,
}

impl Pruner {
    /// A pruner sized for the current soft limit of open descriptors.
    pub(crate) fn for_fd_limit(notifier: Arc<OnceLock<Notifier>>) -> Self {
        let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile)
            .current
            .map_or(usize::MAX, |n| usize::try_from(n).unwrap_or(usize::MAX));
        Self::with_limit(limit, notifier)
    }

    fn with_limit(limit: usize, notifier: Arc<OnceLock<Notifier>>) -> Self {
        let reserve = (limit / RESERVE_SHARE).max(MIN_RESERVE);
        let high = limit.saturating_sub(reserve).max(MIN_RESERVE);
        Self {
            high,
            low: high - high / PRUNE_SHARE,
            notifier,
            running: Arc::new(AtomicBool::new(false)),
            next_at: AtomicU64::new(0),
        }
    }

    /// Whether a directory listing with attributes may look up one more entry in the reply
    /// that has looked up `done` so far. Under pressure (more nodes alive than the high
    /// mark) replies stay small: the kernel holds the directory's lock for the whole reply,
    /// so names in it cannot be pruned until the reply is sent.
    pub(crate) fn listing_may_continue(&self, done: usize) -> bool {
        done < ((self.high - self.low) / 4).max(1) || LIVE.load(Ordering::Relaxed) <= self.high
    }

    /// How many of the least recently used nodes to drop now, if a prune is due: `live`
    /// nodes alive in the process, `clock` nodes made by the calling table so far.
    pub(crate) fn due(&self, live: usize, clock: u64) -> Option<usize> {
        if live <= self.high || clock < self.next_at.load(Ordering::Relaxed) {
            return None;
        }
        if self.notifier.get().is_none() || self.running.swap(true, Ordering::AcqRel) {
            return None;
        }
        self.next_at
            .store(clock + (self.high - self.low) as u64 / 2, Ordering::Relaxed);
        Some(live - self.low)
    }

    /// The session's notifier, once the session exists.
    pub(crate) fn notifier(&self) -> Option<&Notifier> {
        self.notifier.get()
    }

    /// Asks the kernel, from a thread of its own, to drop `names` (after [`Pruner::due`]
    /// said yes).
    pub(crate) fn send(&self, names: Vec<SeenAs>) {
        // No names: every idle candidate is in use, so no thread for nothing.
        let notifier = match self.notifier.get() {
            Some(n) if !names.is_empty() => n.clone(),
            _ => {
                self.running.store(false, Ordering::Release);
                return;
            }
        };
        let running = self.running.clone();
        tracing::debug!(
            "{} nodes alive (limit {}): dropping {} unused names",
            LIVE.load(Ordering::Relaxed),
            self.high,
            names.len()
        );
        let spawned = std::thread::Builder::new()
            .name("cloakfs-prune".into())
            .spawn(move || {
                for (parent, name) in names {
                    // ENOENT: renamed or already gone; nothing to do either way.
                    let _ = notifier.inval_entry(INodeNo(parent), OsStr::from_bytes(&name));
                }
                running.store(false, Ordering::Release);
            });
        if let Err(e) = spawned {
            tracing::warn!("cannot start the pruning thread: {e}");
            self.running.store(false, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_follow_the_limit() {
        let p = Pruner::with_limit(20_000, Arc::new(OnceLock::new()));
        assert_eq!((p.high, p.low), (17_500, 16_407));
        let p = Pruner::with_limit(256, Arc::new(OnceLock::new()));
        assert_eq!((p.high, p.low), (192, 180));
        let p = Pruner::with_limit(10, Arc::new(OnceLock::new()));
        assert_eq!(p.high, MIN_RESERVE);
    }

    #[test]
    fn nothing_is_due_below_the_mark_or_without_a_session() {
        let p = Pruner::with_limit(256, Arc::new(OnceLock::new()));
        assert_eq!(p.due(100, 1000), None);
        // Above the mark, but no session to send through yet.
        assert_eq!(p.due(300, 1000), None);
    }
}
