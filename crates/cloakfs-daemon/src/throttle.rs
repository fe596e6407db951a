//! Guessing, slowed where it is aimed and where it comes from: failed challenge answers are
//! counted per authorization and per uid (and attaches that run into a hidden name per uid).
//! Each failure puts the next attempt further out — 2 s, 4 s, 8 s, ... up to 15 minutes
//! from the tenth on — and an attempt is booked before its answer is checked, so answers
//! sent in parallel on many connections are refused unchecked instead of tried at once. A
//! success starts its keys afresh; failures an hour old are forgotten.

use cloakfs_fuse::tree::AttachId;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Wait after the first failure; it doubles with each further one.
pub const FIRST_DELAY: Duration = Duration::from_secs(2);
/// The longest wait (reached at the tenth failure in a row).
pub const MAX_DELAY: Duration = Duration::from_secs(15 * 60);
/// Failures older than this are forgotten.
const FORGET_AFTER: Duration = Duration::from_secs(3600);

/// What failures are counted against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Key {
    /// One authorization of one attach, whoever tries it.
    Authz(AttachId, u32),
    /// One user, whatever they try.
    Uid(u32),
}

#[derive(Debug, Clone, Copy)]
struct Failures {
    count: u32,
    not_before: Instant,
    last: Instant,
}

fn delay_of(first: Duration, n: u32) -> Duration {
    let doublings = n.saturating_sub(1).min(20);
    (first * (1u32 << doublings)).min(MAX_DELAY)
}

#[derive(Debug)]
pub struct Throttle {
    first: Duration,
    entries: HashMap<Key, Failures>,
}

impl Default for Throttle {
    fn default() -> Self {
        Self::new(FIRST_DELAY)
    }
}

impl Throttle {
    /// A throttle whose first wait is `first` (tests of other things use zero).
    pub fn new(first: Duration) -> Self {
        Self {
            first,
            entries: HashMap::new(),
        }
    }

    /// The wait after `n` failures (n >= 1).
    pub fn delay(&self, n: u32) -> Duration {
        delay_of(self.first, n)
    }

    /// How long any of `keys` must still wait (zero: none).
    pub fn wait(&self, keys: &[Key], now: Instant) -> Duration {
        keys.iter()
            .filter_map(|k| self.entries.get(k))
            .map(|f| f.not_before.saturating_duration_since(now))
            .max()
            .unwrap_or(Duration::ZERO)
    }

    /// Books an attempt on `keys`: refused with the time left if any must still wait, else
    /// counted as a failure until [`Throttle::succeeded`] says otherwise.
    pub fn begin(&mut self, keys: &[Key], now: Instant) -> Result<(), Duration> {
        let left = self.wait(keys, now);
        if !left.is_zero() {
            return Err(left);
        }
        self.fail(keys, now);
        Ok(())
    }

    /// Counts a failure on every key.
    pub fn fail(&mut self, keys: &[Key], now: Instant) {
        let first = self.first;
        self.entries
            .retain(|_, f| now.saturating_duration_since(f.last) < FORGET_AFTER);
        for k in keys {
            let f = self.entries.entry(*k).or_insert(Failures {
                count: 0,
                not_before: now,
                last: now,
            });
            f.count = f.count.saturating_add(1);
            f.not_before = now + delay_of(first, f.count);
            f.last = now;
        }
    }

    /// The attempt booked on `keys` succeeded: they start afresh.
    pub fn succeeded(&mut self, keys: &[Key]) {
        for k in keys {
            self.entries.remove(k);
        }
    }

    /// Failures counted against `key`.
    pub fn failures(&self, key: Key) -> u32 {
        self.entries.get(&key).map_or(0, |f| f.count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_grow_to_the_cap() {
        let t = Throttle::default();
        assert_eq!(t.delay(1), Duration::from_secs(2));
        assert_eq!(t.delay(2), Duration::from_secs(4));
        assert_eq!(t.delay(9), Duration::from_secs(512));
        assert_eq!(t.delay(10), MAX_DELAY);
        assert_eq!(t.delay(u32::MAX), MAX_DELAY);
        assert_eq!(Throttle::new(Duration::ZERO).delay(5), Duration::ZERO);
    }

    #[test]
    fn parallel_attempts_are_refused_unchecked() {
        let mut t = Throttle::default();
        let t0 = Instant::now();
        let keys = [Key::Authz(1, 2), Key::Uid(1000)];
        // The first attempt is booked; the others at the same moment are refused.
        t.begin(&keys, t0).unwrap();
        for _ in 0..40 {
            assert_eq!(t.begin(&keys, t0), Err(FIRST_DELAY));
        }
        assert_eq!(t.failures(Key::Uid(1000)), 1);
        // Another user guessing at the same authorization waits too.
        assert!(t.begin(&[Key::Authz(1, 2), Key::Uid(1001)], t0).is_err());
        // The same user on another authorization waits too.
        assert!(t.begin(&[Key::Authz(1, 3), Key::Uid(1000)], t0).is_err());
        // After the wait: one more, and the wait doubles.
        let t1 = t0 + FIRST_DELAY;
        t.begin(&keys, t1).unwrap();
        assert_eq!(t.begin(&keys, t1), Err(Duration::from_secs(4)));
        // A success starts afresh.
        t.succeeded(&keys);
        assert_eq!(t.wait(&keys, t1), Duration::ZERO);
        t.begin(&keys, t1).unwrap();
        assert_eq!(t.failures(Key::Authz(1, 2)), 1);
    }

    #[test]
    fn old_failures_are_forgotten() {
        let mut t = Throttle::default();
        let t0 = Instant::now();
        for i in 0..12 {
            t.fail(&[Key::Uid(7)], t0 + Duration::from_secs(i));
        }
        assert_eq!(t.failures(Key::Uid(7)), 12);
        t.fail(&[Key::Uid(8)], t0 + FORGET_AFTER + MAX_DELAY);
        assert_eq!(t.failures(Key::Uid(7)), 0);
        assert_eq!(t.failures(Key::Uid(8)), 1);
    }
}
