//! AES-256-SIV (RFC 5297), from RustCrypto's aes-siv, keyed once and kept in locked memory.
//!
//! aes-siv's operations take `&mut self` (its CMAC state), so a key keeps a few keyed
//! instances, each behind a mutex in a locked slot, and a thread takes the first one that is
//! free, starting at its own. `Aes256Siv` holds everything inline: the CMAC's AES schedule and
//! state, and the CTR key, from which aes-siv builds a CTR schedule on the stack per
//! operation; each operation is therefore [`scrubbed`].

use crate::crypto::locked::{scrubbed, LockedBox};
use crate::crypto::secret::SecretBytes;
use aes_siv::siv::Aes256Siv;
use aes_siv::KeyInit;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock, TryLockError};

/// Most keyed instances per key.
const MAX_INSTANCES: usize = 8;

/// An AES-256-SIV key (64 bytes: the CMAC key, then the CTR key).
pub struct SivKey {
    key: SecretBytes<64>,
    keyed: Box<[LockedBox<Mutex<Aes256Siv>>]>,
}

impl SivKey {
    /// Keys one instance per CPU (at most `MAX_INSTANCES`).
    pub fn new(key: SecretBytes<64>) -> Self {
        let keyed = (0..instances())
            .map(|_| LockedBox::new(|| Mutex::new(Aes256Siv::new(key.expose().into()))))
            .collect();
        Self { key, keyed }
    }

    /// SIV-encrypts `data` with one header; output = synthetic IV || ciphertext.
    pub fn seal(&self, header: &[u8], data: &[u8]) -> Vec<u8> {
        let mut siv = self.take();
        scrubbed(|| siv.encrypt([header], data)).expect("one header is within the SIV header limit")
    }

    /// Reverses [`SivKey::seal`]; `None` if `sealed` does not authenticate.
    pub fn open(&self, header: &[u8], sealed: &[u8]) -> Option<Vec<u8>> {
        let mut siv = self.take();
        scrubbed(|| siv.decrypt([header], sealed)).ok()
    }

    /// A free keyed instance, or this thread's own once it is free.
    fn take(&self) -> MutexGuard<'_, Aes256Siv> {
        let n = self.keyed.len();
        let start = THREAD_INDEX.with(|i| *i) % n;
        for k in 0..n {
            match self.keyed[(start + k) % n].try_lock() {
                Ok(guard) => return guard,
                Err(TryLockError::Poisoned(e)) => return self.rekeyed(e.into_inner(), start + k),
                Err(TryLockError::WouldBlock) => {}
            }
        }
        match self.keyed[start].lock() {
            Ok(guard) => guard,
            Err(e) => self.rekeyed(e.into_inner(), start),
        }
    }

    /// An instance whose operation panicked midway may hold a half-fed CMAC state: key it
    /// afresh rather than trust it.
    fn rekeyed<'a>(
        &'a self,
        mut guard: MutexGuard<'a, Aes256Siv>,
        index: usize,
    ) -> MutexGuard<'a, Aes256Siv> {
        scrubbed(|| *guard = Aes256Siv::new(self.key.expose().into()));
        self.keyed[index % self.keyed.len()].clear_poison();
        guard
    }
}

static NEXT_THREAD: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// Spreads threads over the keyed instances.
    static THREAD_INDEX: usize = NEXT_THREAD.fetch_add(1, Ordering::Relaxed);
}

fn instances() -> usize {
    static N: OnceLock<usize> = OnceLock::new();
    *N.get_or_init(|| {
        std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(MAX_INSTANCES)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_instance_gives_the_same_bytes_and_a_panic_midway_is_survived() {
        let key = SivKey::new(SecretBytes::from_slice(&[9u8; 64]));
        let reference = Aes256Siv::new((&[9u8; 64]).into())
            .encrypt([b"hdr"], b"a name")
            .unwrap();
        // Hold every instance but one, in turn, so each one does the work once.
        for free in 0..key.keyed.len() {
            let held: Vec<_> = (0..key.keyed.len())
                .filter(|&i| i != free)
                .map(|i| key.keyed[i].lock().unwrap())
                .collect();
            assert_eq!(key.seal(b"hdr", b"a name"), reference, "instance {free}");
            drop(held);
        }
        assert_eq!(key.open(b"hdr", &reference).unwrap(), b"a name");
        assert!(key.open(b"other", &reference).is_none());

        // Poison every instance: each must be rekeyed, not used as it was left.
        for m in key.keyed.iter() {
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let mut g = m.lock().unwrap();
                let _ = g.encrypt([b"half"], b"fed");
                panic!("midway");
            }));
            assert!(m.is_poisoned());
        }
        assert_eq!(key.seal(b"hdr", b"a name"), reference);
        assert_eq!(key.open(b"hdr", &reference).unwrap(), b"a name");
    }
}
