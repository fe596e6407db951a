//! A shared file's exclusive hold kept across a burst of changes (`--shared-storage`).
//!
//! Every change to a shared file's contents runs under the exclusive lock on its coordination
//! byte ([`crate::io::shared`]). Taking that lock, reading the size and header again under it,
//! and flushing the change to the store before letting go are several round trips to the
//! store per change; an application writing 4 KiB blocks one by one pays them on every block.
//! A [`Lease`] keeps the lock after a change instead, so that the next changes of this mount
//! skip all of it: while the lock is held no other client changes the file, so what this
//! mount knows of it stays true. It is let go, after flushing to the store, when
//!
//! - the file has seen no change for [`LEASE_IDLE`], or it has been held for [`LEASE_MAX`];
//!   then, if another client is waiting for it (it holds a shared lock on the
//!   [`WAITING_BYTE`] while it waits), this one does not take it again for [`LEASE_YIELD`],
//!   longer than the waiting client's pause between tries, so that the waiting client gets
//!   it: otherwise a client writing without pause would take it back at once, every time;
//! - the application closes, fsyncs, or takes or drops an fcntl or flock lock (so a lock
//!   handed to another client carries this client's changes with it, as NFS clients flush
//!   before they unlock);
//! - the file is closed.
//!
//! A flush that fails when the lease is let go by the timer is kept and returned by the
//! next [`Lease::settle`] (the next fsync or close), as a failed writeback is.

use crate::io::shared::{ofd_conflict, ofd_lock, wait_for_lock, COORDINATION_BYTE, WAITING_BYTE};
use std::fs::File;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant};

/// How long a lease outlives the last change made under it.
pub const LEASE_IDLE: Duration = Duration::from_millis(5);
/// How long a lease is kept at most while changes keep coming.
pub const LEASE_MAX: Duration = Duration::from_millis(100);
/// How long a lease let go after [`LEASE_MAX`] is not taken again while another client waits
/// for it: longer than the longest pause between a waiting client's tries (32 ms, see
/// [`wait_for_lock`]).
pub const LEASE_YIELD: Duration = Duration::from_millis(40);

/// The exclusive hold of one shared file, kept or not (see the module documentation).
pub struct Lease {
    file: Arc<File>,
    state: Mutex<LeaseState>,
}

/// Whether the lock is held, since when and until when, and a flush failure not yet told.
#[derive(Default)]
pub struct LeaseState {
    held: Option<(Instant, Instant)>,
    failed: Option<std::io::Error>,
    /// When the timer let the lease go after [`LEASE_MAX`], changes still coming.
    kept_long: Option<Instant>,
}

impl LeaseState {
    /// When the lease is let go unless another change comes (`None`: not held).
    fn deadline(&self) -> Option<Instant> {
        self.held
            .map(|(since, last)| (last + LEASE_IDLE).min(since + LEASE_MAX))
    }
}

/// The lease held for one change: the change runs under it, and the timer cannot let the
/// lease go until it is dropped.
pub struct LeaseGuard<'a> {
    state: MutexGuard<'a, LeaseState>,
    fresh: bool,
}

impl LeaseGuard<'_> {
    /// Whether the lock was just taken, so that what was cached of the file (size, header)
    /// must be read again: another client may have changed it while this one did not hold it.
    pub fn fresh(&self) -> bool {
        self.fresh
    }
}

impl Drop for LeaseGuard<'_> {
    fn drop(&mut self) {
        if let Some((_, last)) = &mut self.state.held {
            *last = Instant::now();
        }
    }
}

impl Lease {
    /// The lease of `file` (not held), known to the timer.
    pub fn new(file: Arc<File>) -> Arc<Self> {
        let lease = Arc::new(Self {
            file,
            state: Mutex::new(LeaseState::default()),
        });
        timer().add(&lease);
        lease
    }

    fn state(&self) -> MutexGuard<'_, LeaseState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Holds the file for a change: the lease as it is if held (and not held for
    /// [`LEASE_MAX`] yet), else the lock taken anew (waiting for other clients' holds, and
    /// first making way for a waiting client after a long hold) and the store client's cached
    /// pages of the file dropped, since they may predate another client's change.
    pub fn take(&self) -> std::io::Result<LeaseGuard<'_>> {
        let mut state = self.state();
        let now = Instant::now();
        if let Some((since, _)) = state.held {
            if now < since + LEASE_MAX {
                return Ok(LeaseGuard {
                    state,
                    fresh: false,
                });
            }
            if let Err(e) = release(&self.file, &mut state) {
                tracing::warn!("flushing a shared file to the store: {e}");
                state.failed.get_or_insert(e);
            }
            state.kept_long = Some(now);
        }
        if let Some(at) = state.kept_long.take() {
            if others_waiting(&self.file) {
                std::thread::sleep((at + LEASE_YIELD).saturating_duration_since(Instant::now()));
            }
        }
        lock_coordination(&self.file)?;
        crate::io::shared::drop_page_cache(&self.file);
        let now = Instant::now();
        state.held = Some((now, now));
        timer().wake();
        Ok(LeaseGuard { state, fresh: true })
    }

    /// Whether the lease is held now (then no other client changes the file).
    pub fn is_held(&self) -> bool {
        self.state().held.is_some()
    }

    /// Lets the lease go, after flushing this client's changes to the store; returns that
    /// flush's failure, or an earlier one of the timer's not yet told.
    pub fn settle(&self) -> std::io::Result<()> {
        let mut state = self.state();
        let r = release(&self.file, &mut state);
        match state.failed.take() {
            Some(e) => Err(e),
            None => r,
        }
    }

    /// The timer's turn: lets the lease go if its time is up; returns when to look again
    /// (`None`: not held). A lease in use by a change (or being taken) is looked at again
    /// later, never waited for: that change may be waiting for another client, whose own
    /// timer may be waiting for this one's lease to go.
    fn expire(&self, now: Instant) -> Option<Instant> {
        let mut state = match self.state.try_lock() {
            Ok(s) => s,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return Some(now + LEASE_IDLE),
        };
        let due = state.deadline()?;
        if due > now {
            return Some(due);
        }
        if state
            .held
            .is_some_and(|(since, _)| since + LEASE_MAX <= now)
        {
            state.kept_long = Some(now);
        }
        if let Err(e) = release(&self.file, &mut state) {
            tracing::warn!("flushing a shared file to the store: {e}");
            state.failed.get_or_insert(e);
        }
        None
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let state = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = release(&self.file, state) {
            tracing::warn!("flushing a closed shared file to the store: {e}");
        }
    }
}

/// Takes the coordination lock of `file`, holding a shared lock on the waiting byte while it
/// waits (where a lock there cannot be had, it waits unseen).
fn lock_coordination(file: &File) -> std::io::Result<()> {
    match ofd_lock(file, libc::F_WRLCK, COORDINATION_BYTE, 1, false) {
        Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EACCES)) => {}
        r => return r,
    }
    let seen = ofd_lock(file, libc::F_RDLCK, WAITING_BYTE, 1, false).is_ok();
    let r = wait_for_lock(file, libc::F_WRLCK, COORDINATION_BYTE, 1);
    if seen {
        if let Err(e) = ofd_lock(file, libc::F_UNLCK, WAITING_BYTE, 1, false) {
            tracing::warn!("releasing a shared file's waiting byte: {e}");
        }
    }
    r
}

/// Whether another client waits for the coordination lock of `file`.
fn others_waiting(file: &File) -> bool {
    matches!(
        ofd_conflict(file, libc::F_WRLCK, WAITING_BYTE, 1),
        Ok(Some(_))
    )
}

/// Flushes and unlocks `file` if `state` holds its lease.
fn release(file: &File, state: &mut LeaseState) -> std::io::Result<()> {
    if state.held.take().is_none() {
        return Ok(());
    }
    // A client's writes may wait in its store client (GlusterFS's write-behind, NFS's cache)
    // past the unlock, where the next client's read-modify-write would miss them.
    let synced = file.sync_data();
    let unlocked = ofd_lock(file, libc::F_UNLCK, COORDINATION_BYTE, 1, false);
    synced.and(unlocked)
}

/// The one thread that lets leases go when their time is up.
struct Timer {
    leases: Mutex<TimerState>,
    wake: Condvar,
}

#[derive(Default)]
struct TimerState {
    leases: Vec<Weak<Lease>>,
    /// The length of `leases` after it was last pruned of closed files.
    pruned_len: usize,
    /// A lease was taken since the thread last looked.
    taken: bool,
}

fn timer() -> &'static Timer {
    static TIMER: OnceLock<&'static Timer> = OnceLock::new();
    TIMER.get_or_init(|| {
        let t: &'static Timer = Box::leak(Box::new(Timer {
            leases: Mutex::new(TimerState::default()),
            wake: Condvar::new(),
        }));
        std::thread::Builder::new()
            .name("cloakfs-lease".into())
            .spawn(move || t.run())
            .expect("starting the lease timer thread");
        t
    })
}

impl Timer {
    fn lock(&self) -> MutexGuard<'_, TimerState> {
        self.leases.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn add(&self, lease: &Arc<Lease>) {
        let mut s = self.lock();
        // The thread prunes only when it wakes, which files only read never make it do.
        if s.leases.len() >= 2 * s.pruned_len.max(64) {
            s.leases.retain(|l| l.strong_count() > 0);
            s.pruned_len = s.leases.len();
        }
        s.leases.push(Arc::downgrade(lease));
    }

    fn wake(&self) {
        self.lock().taken = true;
        self.wake.notify_one();
    }

    fn run(&self) {
        loop {
            let leases = {
                let mut s = self.lock();
                s.leases.retain(|l| l.strong_count() > 0);
                s.taken = false;
                s.leases.clone()
            };
            let now = Instant::now();
            let next = leases
                .iter()
                .filter_map(Weak::upgrade)
                .filter_map(|l| l.expire(now))
                .min();
            let mut s = self.lock();
            while !s.taken {
                match next {
                    Some(at) => {
                        let left = at.saturating_duration_since(Instant::now());
                        if left.is_zero() {
                            break;
                        }
                        let (g, timeout) = self
                            .wake
                            .wait_timeout(s, left)
                            .unwrap_or_else(|e| e.into_inner());
                        s = g;
                        if timeout.timed_out() {
                            break;
                        }
                    }
                    None => s = self.wake.wait(s).unwrap_or_else(|e| e.into_inner()),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two_descriptions() -> (tempfile::NamedTempFile, Arc<File>, File) {
        let (t, a, b) = crate::io::shared::tests::two_descriptions();
        (t, Arc::new(a), b)
    }

    fn locked_by_other(b: &File) -> bool {
        match ofd_lock(b, libc::F_WRLCK, COORDINATION_BYTE, 1, false) {
            Ok(()) => {
                ofd_lock(b, libc::F_UNLCK, COORDINATION_BYTE, 1, false).unwrap();
                false
            }
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(libc::EAGAIN));
                true
            }
        }
    }

    #[test]
    fn a_lease_outlives_its_change_and_settling_lets_it_go() {
        let (_t, a, b) = two_descriptions();
        let lease = Lease::new(a);
        // While a change holds the lease, the timer cannot let it go.
        let change = lease.take().unwrap();
        assert!(change.fresh());
        assert!(locked_by_other(&b));
        drop(change);
        // Within the idle time the next change finds the lease held (the timer thread may
        // have let it go meanwhile on a slow machine: then it is taken again, fresh).
        let again = lease.take().unwrap();
        assert!(locked_by_other(&b));
        drop(again);
        lease.settle().unwrap();
        assert!(!lease.is_held());
        assert!(!locked_by_other(&b));
        assert!(lease.take().unwrap().fresh());
        drop(lease);
        assert!(!locked_by_other(&b), "a dropped lease lets the lock go");
    }

    #[test]
    fn the_timer_lets_an_idle_lease_go() {
        let (_t, a, b) = two_descriptions();
        let lease = Lease::new(a);
        drop(lease.take().unwrap());
        // The other description's blocking lock request is granted once the timer has let
        // the lease go: no sleep, no bound on how long that takes.
        ofd_lock(&b, libc::F_WRLCK, COORDINATION_BYTE, 1, true).unwrap();
        assert!(!lease.is_held());
        lease.settle().unwrap();
    }

    #[test]
    fn a_lease_kept_long_makes_way_for_a_waiting_client() {
        let (_t, a, b) = two_descriptions();
        let lease = Lease::new(a);
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            // A writer that never pauses: each change takes the lease and drops it at once.
            let writer = s.spawn(|| {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    drop(lease.take().unwrap());
                }
            });
            let change = lease.take().unwrap();
            drop(change);
            // The other client gets the lock (it waits, marked on the waiting byte) although
            // the writer never stops: the writer gives the lease up after LEASE_MAX and makes
            // way. Without that, this wait has no end.
            lock_coordination(&b).unwrap();
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            ofd_lock(&b, libc::F_UNLCK, COORDINATION_BYTE, 1, false).unwrap();
            writer.join().unwrap();
        });
        lease.settle().unwrap();
    }
}
