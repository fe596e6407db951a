//! What one user can make the daemon hold, and how long a request may take. Every number
//! here is a default docs/MULTI-USER.md and docs/THREAT-MODEL.md give; `cloakfs daemon` can
//! change the timeouts.

use std::time::Duration;

/// The daemon's limits and quotas.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Control connections served at once, all users together, before the reserve.
    pub connections: usize,
    /// Control connections one uid may hold at once.
    pub connections_per_uid: usize,
    /// Connections beyond `connections` kept for root and for users who own an attach (two
    /// each), so an owner can always reach `status`, `sessions`, `revoke` and `detach`.
    pub reserved_for_owners: usize,
    /// A request must arrive whole (its first byte to its newline) within this time.
    pub request_timeout: Duration,
    /// A connection with no request under way is closed after this time (it covers typing
    /// a passphrase between a challenge and its answer).
    pub idle_timeout: Duration,
    /// Attaches one uid may own.
    pub attaches_per_uid: usize,
    /// Authorizations one attach may hold (its owner's included).
    pub authzs_per_attach: usize,
    /// Authorizations one uid may have granted, over all attaches.
    pub authzs_per_uid: usize,
    /// Sessions (active, timed out or revoked) one attach may hold.
    pub sessions_per_attach: usize,
    /// Longest timeout callback, in bytes.
    pub callback_len: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            connections: 256,
            connections_per_uid: 8,
            reserved_for_owners: 32,
            request_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(120),
            attaches_per_uid: 16,
            authzs_per_attach: 128,
            authzs_per_uid: 256,
            sessions_per_attach: 256,
            callback_len: 1024,
        }
    }
}
