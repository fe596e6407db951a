//! HMAC-SHA256 as a keyed pseudo-random function over a list of byte strings: the one shape
//! behind derived directory IDs (FORMAT.md 9.2), the reverse view's IDs and nonces (17), an
//! adopted tree's manifest tags (21.1) and the retirement records (18.8, 21.1).
//!
//! The key's HMAC state is made once and kept in locked memory; each use clones it and runs
//! in a frame whose stack is scrubbed afterwards. The parts are concatenated as they are:
//! each caller's parts are of fixed length or end its input, so the concatenation is
//! unambiguous, and each caller starts with a domain string of its own where one key serves
//! several purposes.

use crate::crypto::locked::{scrubbed, LockedBox};
use crate::crypto::secret::SecretBytes;
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// HMAC-SHA256 under one key.
pub struct Prf(LockedBox<Hmac<Sha256>>);

impl std::fmt::Debug for Prf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prf").finish_non_exhaustive()
    }
}

impl Prf {
    /// The function keyed with `key`.
    pub fn new(key: &SecretBytes<32>) -> Self {
        Self(LockedBox::new(|| {
            <Hmac<Sha256> as Mac>::new_from_slice(key.expose()).expect("any key length")
        }))
    }

    /// `HMAC-SHA256(key, parts[0] || parts[1] || ...)`, its first `N` bytes (`N` <= 32).
    pub fn out<const N: usize>(&self, parts: &[&[u8]]) -> [u8; N] {
        const { assert!(N <= 32) };
        scrubbed(|| {
            let mut m = (*self.0).clone();
            for p in parts {
                m.update(p);
            }
            let full = m.finalize().into_bytes();
            let mut out = [0u8; N];
            out.copy_from_slice(&full[..N]);
            out
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn is_hmac_sha256_of_the_concatenation_truncated() {
        let key = SecretBytes::from_slice(&[5; 32]);
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(&[5; 32]).unwrap();
        m.update(b"abcdef");
        let want = m.finalize().into_bytes();
        let prf = Prf::new(&key);
        assert_eq!(prf.out::<32>(&[b"ab", b"", b"cdef"])[..], want[..]);
        assert_eq!(prf.out::<16>(&[b"abcdef"])[..], want[..16]);
    }
}
