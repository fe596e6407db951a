//! The AES-256-GCM-SIV content suite (RFC 8452, RustCrypto `aes-gcm-siv`): nonce-misuse
//! resistant, so it is the one suite that may seal with nonces derived from the file ID and
//! block number, as a reverse view does (docs/FORMAT.md section 17). Repeating a nonce then
//! reveals only whether the same block position of the same file held the same plaintext;
//! under AES-256-GCM it would reveal the XOR of the plaintexts and allow forgeries.
//!
//! A volume that uses it (the copy of a reverse view) is otherwise ordinary: a normal mount
//! seals with fresh random nonces, like the other suites.

use crate::crypto::locked::LockedBox;
use aes_gcm_siv::aead::{AeadInPlace, KeyInit};
use aes_gcm_siv::Aes256GcmSiv;

/// Name in the volume config.
pub(super) const NAME: &str = "aes-256-gcm-siv";
/// Nonce length (RFC 8452: 96 bits).
pub(super) const NONCE_LEN: usize = 12;

/// One file's AES-256-GCM-SIV key, in locked memory (the crate keeps the 256-bit key-generating
/// key's AES schedule; each seal derives its message keys on the stack and wipes them).
pub(super) struct GcmSivKey(LockedBox<Aes256GcmSiv>);

impl GcmSivKey {
    pub(super) fn new(key: &[u8; 32]) -> Self {
        Self(LockedBox::new(|| Aes256GcmSiv::new(key.into())))
    }

    /// Encrypts `body` in place and returns the tag.
    pub(super) fn seal_in_place(&self, nonce: &[u8], aad: &[u8], body: &mut [u8]) -> [u8; 16] {
        self.0
            .encrypt_in_place_detached(nonce.into(), aad, body)
            .expect("block sizes are far below the AEAD length limits")
            .into()
    }

    /// Decrypts `body` in place if `tag` authenticates it.
    pub(super) fn open_in_place(
        &self,
        nonce: &[u8],
        aad: &[u8],
        body: &mut [u8],
        tag: &[u8],
    ) -> Result<(), ()> {
        self.0
            .decrypt_in_place_detached(nonce.into(), aad, body, tag.into())
            .map_err(drop)
    }
}
