//! The deterministic derivations of a reverse view (docs/FORMAT.md section 17): a read-only
//! encrypted view of a plaintext directory whose bytes depend only on the plaintext tree and
//! the master key, so that every mount shows the same ciphertext and backup tools transfer
//! only what changed. A copy of the view is an ordinary volume.
//!
//! Everything random in a normal volume is derived here instead, from
//! `K_reverse = HKDF(MK, salt = volume ID, info = "cloakfs v1 reverse")` with HMAC-SHA256
//! over the entry's path relative to the plaintext directory:
//!
//! - directory ID `D(P) = HMAC(K_reverse, "dir" || 0x00 || P)[..16]` (the root: the volume ID);
//! - file ID `F(P) = HMAC(K_reverse, "file" || 0x00 || P)[..16]`;
//! - block nonce `HMAC(K_reverse, "nonce" || 0x00 || F || u64be(n))[..12]`, used only with
//!   AES-256-GCM-SIV (RFC 8452), which is nonce-misuse resistant;
//! - symlink nonce `HMAC(K_reverse, "symlink" || 0x00 || P || 0x00 || T)[..12]`: a synthetic
//!   IV over the whole plaintext (the SIV construction), so two different targets share a
//!   nonce only on a 96-bit HMAC collision.

use crate::crypto::keys::{label, MasterKey};
use crate::crypto::prf::Prf;
use crate::format::content::FileId;
use crate::format::names::DirId;

/// Domain of the directory IDs.
const DIR_DOMAIN: &[u8] = b"dir\0";
/// Domain of the file IDs.
const FILE_DOMAIN: &[u8] = b"file\0";
/// Domain of the block nonces.
const NONCE_DOMAIN: &[u8] = b"nonce\0";
/// Domain of the symlink nonces.
const SYMLINK_DOMAIN: &[u8] = b"symlink\0";

/// The keyed derivations of one reverse view (the key in locked memory).
#[derive(Debug)]
pub struct ReverseKeys {
    mac: Prf,
    root: DirId,
}

impl ReverseKeys {
    /// The derivations of the volume with master key `mk` and ID `volume_id`.
    pub fn new(mk: &MasterKey, volume_id: &[u8; 16]) -> Self {
        Self {
            mac: Prf::new(&mk.subkey(volume_id, label::REVERSE)),
            root: DirId(*volume_id),
        }
    }

    /// `HMAC(K_reverse, parts[0] || parts[1] || ...)`, truncated to `N` bytes.
    fn prf<const N: usize>(&self, parts: &[&[u8]]) -> [u8; N] {
        self.mac.out(parts)
    }

    /// The ID of the directory at relative path `rel` (empty: the root, whose ID is the
    /// volume ID).
    pub fn dir_id(&self, rel: &[u8]) -> DirId {
        if rel.is_empty() {
            return self.root;
        }
        DirId(self.prf(&[DIR_DOMAIN, rel]))
    }

    /// The file ID of the regular file at relative path `rel`.
    pub fn file_id(&self, rel: &[u8]) -> FileId {
        FileId(self.prf(&[FILE_DOMAIN, rel]))
    }

    /// The nonce of block `n` of the file with ID `id`.
    pub fn block_nonce(&self, id: &FileId, n: u64) -> [u8; 12] {
        self.prf(&[NONCE_DOMAIN, &id.0, &n.to_be_bytes()])
    }

    /// The nonce of the symlink at relative path `rel` with target `target`.
    pub fn symlink_nonce(&self, rel: &[u8], target: &[u8]) -> [u8; 12] {
        self.prf(&[SYMLINK_DOMAIN, rel, b"\0", target])
    }
}

/// The relative path of entry `name` in the directory at relative path `dir`.
pub fn child_path(dir: &[u8], name: &[u8]) -> Vec<u8> {
    if dir.is_empty() {
        return name.to_vec();
    }
    let mut p = Vec::with_capacity(dir.len() + 1 + name.len());
    p.extend_from_slice(dir);
    p.push(b'/');
    p.extend_from_slice(name);
    p
}
