//! The size-preserving AES-256-XTS content suite (IEEE 1619-2018, [`Xts256`]). No integrity: a changed ciphertext
//! decrypts to different plaintext, silently (docs/THREAT-MODEL.md).
//!
//! Each block (data unit) is encrypted where it lies, at its own length, with tweak = its block
//! number as a 128-bit little-endian integer; a last block of 16 bytes or more that is not a
//! multiple of 16 uses IEEE 1619 ciphertext stealing. XTS cannot encrypt fewer than 16 bytes:
//! a last block of 1..15 bytes is AES-256-CTR (NIST SP 800-38A) under a separate per-file key,
//! with the same 16 bytes as initial counter block (one keystream block is all it uses). That
//! keeps every block independent of its neighbours; the price is that rewriting such a short
//! tail with different bytes shows the XOR of the old and new tail to someone who saw both
//! (docs/FORMAT.md section 20).

use crate::crypto::keys::{label, HkdfKey};
use crate::crypto::locked::{scrubbed, LockedBox};
use crate::crypto::secret::SecretBytes;
use crate::crypto::xts::Xts256;
use crate::format::content::FileId;
use aes::cipher::{KeyIvInit, StreamCipher};
use aes::Aes256;

/// Name in the volume config.
pub(super) const NAME: &str = "aes-256-xts";
/// The backing file's xattr that holds its header (version and file ID, `FileHeader`). The dots
/// keep it apart from every encrypted user xattr name, which is `user.` and base64url.
pub(super) const HEADER_XATTR: &str = "user.cloakfs.id";
/// Shortest data unit XTS encrypts (one AES block).
pub(super) const MIN_XTS_LEN: usize = 16;

type Ctr = ctr::Ctr128BE<Aes256>;

/// One file's keys, in locked memory: the XTS key pair's two AES-256 schedules and the
/// AES-256 key of short blocks. The `aes` crate's zeroize feature wipes the schedules on drop.
pub(super) struct XtsKey(LockedBox<Keys>);

struct Keys {
    xts: Xts256,
    short: SecretBytes<32>,
}

impl XtsKey {
    /// The keys of file `id`: HKDF-SHA256 expansions of the content key (`files`) with info
    /// "cloakfs v1 xts-file" || ID (64 bytes: data key, then tweak key) and "cloakfs v1
    /// xts-short" || ID (32 bytes).
    pub(super) fn new(files: &HkdfKey, id: FileId) -> Self {
        let pair: SecretBytes<64> = files.expand(label::XTS_FILE.as_bytes(), &id.0);
        let short: SecretBytes<32> = files.expand(label::XTS_SHORT.as_bytes(), &id.0);
        Self(LockedBox::new(|| Keys {
            xts: Xts256::new(pair.expose()),
            short,
        }))
    }

    /// Encrypts block `block` in place, at its length (at least 1 byte).
    pub(super) fn encrypt(&self, block: u64, data: &mut [u8]) {
        let keys = &*self.0;
        if data.len() < MIN_XTS_LEN {
            keys.short_keystream(block, data);
        } else {
            keys.xts.encrypt(block.into(), data);
        }
    }

    /// Decrypts block `block` in place.
    pub(super) fn decrypt(&self, block: u64, data: &mut [u8]) {
        let keys = &*self.0;
        if data.len() < MIN_XTS_LEN {
            keys.short_keystream(block, data);
        } else {
            keys.xts.decrypt(block.into(), data);
        }
    }
}

impl Keys {
    /// The CTR key schedule is built on the stack for each short block (a last block under
    /// 16 bytes, so rare): in a frame of its own that is wiped afterwards.
    fn short_keystream(&self, block: u64, data: &mut [u8]) {
        scrubbed(|| {
            let mut ctr = Ctr::new(self.short.expose().into(), &tweak(block).into());
            ctr.apply_keystream(data);
        })
    }
}

/// The tweak (and initial counter block of a short block): the block number as a 128-bit
/// little-endian integer, as IEEE 1619 numbers data units.
fn tweak(block: u64) -> [u8; 16] {
    u128::from(block).to_le_bytes()
}
