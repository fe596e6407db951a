//! Secret key material: heap-allocated, locked into RAM (mlock) and zeroized on drop.
//!
//! Long-lived keys (the master key and its subkeys) are kept in [`SecretBytes`] so they never
//! reach swap and are wiped when the volume is closed. Debug output never shows the bytes.

use std::fmt;
use std::sync::Mutex;
use zeroize::{Zeroize, Zeroizing};

/// Address and length of every live mlocked secret, so a forked child can lock them again
/// (memory locks are not inherited across fork).
static LOCKED: Mutex<Vec<(usize, usize)>> = Mutex::new(Vec::new());

/// `N` secret bytes, mlocked for their whole life and zeroized on drop.
pub struct SecretBytes<const N: usize> {
    bytes: Box<[u8; N]>,
    locked: bool,
}

impl<const N: usize> SecretBytes<N> {
    /// Wraps a copy of `bytes`; the caller is responsible for wiping its own copy.
    pub fn from_slice(bytes: &[u8; N]) -> Self {
        let mut s = Self::zero();
        s.bytes.copy_from_slice(bytes);
        s
    }

    /// Fresh random bytes from the operating system's CSPRNG.
    pub fn random() -> Self {
        let mut s = Self::zero();
        crate::crypto::random::fill(&mut s.bytes[..]);
        s
    }

    /// All-zero bytes, to be filled in place (so no unlocked copy ever exists).
    pub fn zero() -> Self {
        let bytes = Box::new([0u8; N]);
        let locked = lock_memory(bytes.as_ptr(), N);
        Self { bytes, locked }
    }

    /// The secret bytes.
    pub fn expose(&self) -> &[u8; N] {
        &self.bytes
    }

    /// Mutable access for filling in place.
    pub fn expose_mut(&mut self) -> &mut [u8; N] {
        &mut self.bytes
    }
}

impl<const N: usize> Clone for SecretBytes<N> {
    fn clone(&self) -> Self {
        Self::from_slice(&self.bytes)
    }
}

impl<const N: usize> Drop for SecretBytes<N> {
    fn drop(&mut self) {
        self.bytes.zeroize();
        if self.locked {
            unlock_memory(self.bytes.as_ptr(), N);
        }
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

fn lock_memory(ptr: *const u8, len: usize) -> bool {
    // SAFETY: `ptr..ptr+len` is a live allocation owned by the caller; mlock only changes
    // paging behaviour and fails harmlessly (ENOMEM/EPERM) when RLIMIT_MEMLOCK is exhausted.
    let ok = unsafe { libc::mlock(ptr.cast(), len) == 0 };
    if ok {
        registry().push((ptr as usize, len));
    }
    ok
}

fn unlock_memory(ptr: *const u8, len: usize) {
    let mut r = registry();
    if let Some(i) = r.iter().position(|&e| e == (ptr as usize, len)) {
        r.swap_remove(i);
    }
    // SAFETY: the same range was successfully mlocked in `lock_memory` and is still allocated.
    unsafe {
        libc::munlock(ptr.cast(), len);
    }
}

fn registry() -> std::sync::MutexGuard<'static, Vec<(usize, usize)>> {
    LOCKED.lock().unwrap_or_else(|e| e.into_inner())
}

/// Locks every live secret again. Called in a child after fork(2), which drops memory locks.
pub fn relock_after_fork() {
    for &(ptr, len) in registry().iter() {
        // SAFETY: each entry is a live SecretBytes allocation (entries are removed on drop).
        unsafe { libc::mlock(ptr as *const libc::c_void, len) };
    }
}

/// Keeps secrets out of core dumps and away from debuggers of other users: no core files, and
/// the process is not dumpable. Called by long-running processes that hold a volume key.
pub fn harden_process() {
    // SAFETY: plain syscalls with constant, valid arguments; failure is tolerated.
    unsafe {
        let zero = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        libc::setrlimit(libc::RLIMIT_CORE, &zero);
        libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
    }
}
