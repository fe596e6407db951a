//! AES-256-GCM (NIST SP 800-38D) for file contents, from ring.
//!
//! ring 0.17's x86-64 code is BoringSSL's: VAES + VPCLMULQDQ on 256-bit AVX2 registers where
//! the CPU has them (AMD Zen 3 and later, Intel Ice Lake and later), AES-NI + PCLMULQDQ + AVX
//! otherwise; ARMv8 crypto extensions on aarch64. AWS-LC (aws-lc-rs 1.19), used before, has a
//! VAES path only with AVX-512. On the 2-core AMD EPYC dev VM (AVX2, VAES, no AVX-512), 1 MiB
//! of 4 KiB blocks on one core, as in one FUSE request (a scratch program, 256 passes): ring
//! sealed at 4.7-4.8 GB/s and opened at 5.1 GB/s, each with a copy of the block into place;
//! AWS-LC, out of place, at 3.2-3.4 GB/s. Both give the same bytes (the docs/FORMAT.md vectors).
//!
//! ring seals and opens only in place (opening may shift the data left); callers that hold
//! the input elsewhere copy it into the output first.

use crate::crypto::locked::LockedBox;
use ring::aead::{Aad, LessSafeKey, Nonce, Tag, UnboundKey, AES_256_GCM};

/// Nonce length (96 bits, the GCM default).
pub const NONCE_LEN: usize = 12;
/// Tag length (128 bits).
pub const TAG_LEN: usize = 16;

/// An AES-256-GCM key schedule in locked memory, wiped when dropped (ring does not wipe its
/// keys). ring's `LessSafeKey` holds its schedule inline: round keys and GHASH table in
/// arrays, plus a `&'static` algorithm.
pub struct GcmKey(LockedBox<LessSafeKey>);

impl GcmKey {
    /// The schedule of a 32-byte key.
    pub fn new(key: &[u8; 32]) -> Self {
        Self(LockedBox::new(|| {
            let key = UnboundKey::new(&AES_256_GCM, key).expect("32 bytes is an AES-256 key");
            LessSafeKey::new(key)
        }))
    }

    fn key(&self) -> &LessSafeKey {
        &self.0
    }

    /// Encrypts `in_out` in place; returns the tag.
    pub fn seal_in_place(
        &self,
        nonce: &[u8; NONCE_LEN],
        aad: &[u8],
        in_out: &mut [u8],
    ) -> [u8; TAG_LEN] {
        let tag = self
            .key()
            .seal_in_place_separate_tag(
                Nonce::assume_unique_for_key(*nonce),
                Aad::from(aad),
                in_out,
            )
            .expect("block sizes are far below the GCM length limit");
        let mut out = [0u8; TAG_LEN];
        out.copy_from_slice(tag.as_ref());
        out
    }

    /// Decrypts `in_out[src..]` into `in_out[..in_out.len() - src]` if `tag` authenticates it;
    /// on failure the output holds no plaintext the caller may use.
    pub fn open_within(
        &self,
        nonce: &[u8; NONCE_LEN],
        aad: &[u8],
        tag: &[u8; TAG_LEN],
        in_out: &mut [u8],
        src: usize,
    ) -> Result<(), ()> {
        self.key()
            .open_in_place_separate_tag(
                Nonce::assume_unique_for_key(*nonce),
                Aad::from(aad),
                Tag::from(*tag),
                in_out,
                src..,
            )
            .map(drop)
            .map_err(drop)
    }
}
