//! Secret key material, in locked memory ([`crate::crypto::locked`]) and wiped on drop, and
//! the hardening of a process that holds it.
//!
//! Keys (the master key, its subkeys, key-encryption keys) are kept in [`SecretBytes`]; key
//! schedules in a [`LockedBox`] of their own. Debug output never shows the bytes.

use crate::crypto::locked::LockedBox;
use std::fmt;
use zeroize::Zeroizing;

pub use crate::crypto::locked::relock_after_fork;

/// `N` secret bytes in locked memory, wiped on drop.
pub struct SecretBytes<const N: usize>(LockedBox<[u8; N]>);

impl<const N: usize> SecretBytes<N> {
    /// Wraps a copy of `bytes`; the caller is responsible for wiping its own copy.
    pub fn from_slice(bytes: &[u8; N]) -> Self {
        let mut s = Self::zero();
        s.0.copy_from_slice(bytes);
        s
    }

    /// Fresh random bytes from the operating system's CSPRNG.
    pub fn random() -> Self {
        let mut s = Self::zero();
        crate::crypto::random::fill(&mut s.0[..]);
        s
    }

    /// All-zero bytes, to be filled in place (so no unlocked copy ever exists).
    pub fn zero() -> Self {
        Self(LockedBox::zeroed())
    }

    /// The secret bytes.
    pub fn expose(&self) -> &[u8; N] {
        &self.0
    }

    /// Mutable access for filling in place.
    pub fn expose_mut(&mut self) -> &mut [u8; N] {
        &mut self.0
    }
}

impl<const N: usize> Clone for SecretBytes<N> {
    fn clone(&self) -> Self {
        Self::from_slice(self.expose())
    }
}

impl<const N: usize> fmt::Debug for SecretBytes<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SecretBytes<{N}>(..)")
    }
}

/// A passphrase or other user-supplied secret of variable length, zeroized on drop.
#[derive(Clone)]
pub struct Passphrase(Zeroizing<Vec<u8>>);

impl Passphrase {
    /// Takes ownership of the bytes.
    pub fn new(bytes: Vec<u8>) -> Self {
        Self(Zeroizing::new(bytes))
    }

    /// The secret bytes.
    pub fn expose(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for Passphrase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Passphrase(..)")
    }
}

/// Keeps secrets out of core dumps and away from debuggers of other users: no core files
/// (RLIMIT_CORE 0, hard limit too, inherited by every program it starts) and the process is not
/// dumpable (so /proc/PID/mem and ptrace are closed to its own user). Called by every command
/// that reads a secret or holds a key, before it reads one.
pub fn harden_process() {
    // Lowering limits and the dumpable flag cannot fail for the process itself.
    let _ = rustix::process::setrlimit(
        rustix::process::Resource::Core,
        rustix::process::Rlimit {
            current: Some(0),
            maximum: Some(0),
        },
    );
    let _ = rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable);
}
