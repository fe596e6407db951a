//! How often refusals are logged: any user can make the daemon refuse them as fast as the
//! control socket answers (a throttled challenge costs nothing), so each user's refusals of
//! one kind are logged at most once per window, the next logged line carrying how many went
//! unlogged meanwhile. The log then grows by at most a line per user, kind and window.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Users remembered at most; past it, windows that ended are dropped (and if none has, all).
const MAX_USERS: usize = 4096;

/// The kinds of refusal logged under this limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// A challenge asked for while throttled.
    Challenge,
    /// A challenge answer sent while throttled.
    Answer,
    /// An attach name held by a hidden attach (a guess).
    HiddenName,
}

/// Per user and kind: when the current window began, and the refusals not logged in it.
#[derive(Debug)]
pub struct RefusalLog {
    window: Duration,
    seen: Mutex<HashMap<(u32, Refusal), (Instant, u64)>>,
}

impl RefusalLog {
    /// A log that lets one refusal of each user and kind through per `window`.
    pub fn new(window: Duration) -> Self {
        Self {
            window,
            seen: Mutex::new(HashMap::new()),
        }
    }

    /// Whether `uid`'s refusal at `now` is logged: `Some(n)` with the `n` refusals of this
    /// kind that were not logged since the last one that was, `None` to stay silent.
    pub fn admit(&self, uid: u32, kind: Refusal, now: Instant) -> Option<u64> {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        match seen.get_mut(&(uid, kind)) {
            Some((since, unlogged)) if now.duration_since(*since) < self.window => {
                *unlogged += 1;
                None
            }
            Some(entry) => {
                let n = entry.1;
                *entry = (now, 0);
                Some(n)
            }
            None => {
                if seen.len() >= MAX_USERS {
                    let window = self.window;
                    seen.retain(|_, (since, _)| now.duration_since(*since) < window);
                    if seen.len() >= MAX_USERS {
                        seen.clear();
                    }
                }
                seen.insert((uid, kind), (now, 0));
                Some(0)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_user_kind_and_window_then_the_count() {
        let log = RefusalLog::new(Duration::from_secs(60));
        let t0 = Instant::now();
        assert_eq!(log.admit(1000, Refusal::Challenge, t0), Some(0));
        for i in 1..=500 {
            assert_eq!(
                log.admit(1000, Refusal::Challenge, t0 + Duration::from_millis(i)),
                None
            );
        }
        // Another user, another kind: their own windows.
        assert_eq!(log.admit(1001, Refusal::Challenge, t0), Some(0));
        assert_eq!(log.admit(1000, Refusal::Answer, t0), Some(0));
        assert_eq!(
            log.admit(1000, Refusal::Challenge, t0 + Duration::from_secs(60)),
            Some(500)
        );
        assert_eq!(
            log.admit(1000, Refusal::Challenge, t0 + Duration::from_secs(61)),
            None
        );
    }

    #[test]
    fn stays_bounded_with_many_users() {
        let log = RefusalLog::new(Duration::from_secs(60));
        let t0 = Instant::now();
        for uid in 0..(3 * MAX_USERS as u32) {
            log.admit(uid, Refusal::HiddenName, t0);
        }
        assert!(log.seen.lock().unwrap().len() <= MAX_USERS);
    }
}
