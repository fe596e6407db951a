//! The timeout thread: sleeps until the next deadline (or a change), then times out
//! sessions and ends key lifetimes. No polling.

use crate::shared::{dispatch, now, Shared};
use crate::tree::Tree;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Longest sleep without a deadline (a clock jump is noticed at least this often).
const MAX_SLEEP: Duration = Duration::from_secs(60);

pub fn start<T: Tree>(shared: Arc<Shared>, tree: T) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("cloakfs-timer".into())
        .spawn(move || run(&shared, &tree))
}

fn run<T: Tree>(shared: &Shared, tree: &T) {
    let mut reg = shared.lock();
    loop {
        if reg.stopped {
            return;
        }
        let events = reg.tick(now());
        if !events.is_empty() {
            drop(reg);
            shared.notify();
            dispatch(tree, events);
            reg = shared.lock();
            continue;
        }
        let wait = match reg.next_deadline() {
            Some(d) => {
                let at = UNIX_EPOCH + Duration::from_secs(d);
                at.duration_since(SystemTime::now())
                    .unwrap_or(Duration::ZERO)
                    .min(MAX_SLEEP)
            }
            None => MAX_SLEEP,
        };
        reg = shared
            .changed
            .wait_timeout(reg, wait)
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
}

/// Stops the timer thread.
pub fn stop(shared: &Shared, handle: JoinHandle<()>) {
    shared.lock().stopped = true;
    shared.notify();
    let _ = handle.join();
}
