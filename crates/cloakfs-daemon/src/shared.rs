//! The registry shared by the FUSE gate, the control server, the timer and the process
//! watcher, with the condition variable every state change is announced on.

use crate::limits::Limits;
use crate::registry::{Event, Registry};
use crate::tree::Tree;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

pub struct Shared {
    reg: Mutex<Registry>,
    /// Notified after every change that may wake a sleeping request or move a deadline.
    pub changed: Condvar,
}

impl Shared {
    pub fn new() -> Self {
        Self::with_limits(Limits::default())
    }

    pub fn with_limits(limits: Limits) -> Self {
        Self {
            reg: Mutex::new(Registry::with_limits(limits)),
            changed: Condvar::new(),
        }
    }

    /// The registry (a panic elsewhere never locks everyone out).
    pub fn lock(&self) -> MutexGuard<'_, Registry> {
        self.reg.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn notify(&self) {
        self.changed.notify_all();
    }
}

impl Default for Shared {
    fn default() -> Self {
        Self::new()
    }
}

/// The current Unix time in seconds.
pub fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Carries out registry events (outside the registry lock).
pub fn dispatch<T: Tree>(tree: &T, events: Vec<Event>) {
    for e in events {
        match e {
            Event::Invalidate(id) => tree.invalidate(id),
            Event::Detach(id) => {
                if let Err(e) = tree.detach(id) {
                    tracing::warn!("detaching attach {id}: {e}");
                }
            }
            Event::Callback {
                uid,
                cmd,
                name,
                reason,
            } => crate::callback::spawn(uid, &cmd, &name, &reason),
        }
    }
}
