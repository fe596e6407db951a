//! The key hierarchy: one random 256-bit master key, and subkeys derived from it with
//! HKDF-SHA256 (RFC 5869), salt = volume ID, info = `"cloakfs v1 " || label`.
//!
//! Distinct labels keep every primitive on its own key (the gocryptfs audit's finding 2.4).

use crate::crypto::locked::{scrubbed, LockedBox};
use crate::crypto::secret::SecretBytes;
use hkdf::Hkdf;
use sha2::Sha256;

/// Length of the master key and of every 256-bit subkey.
pub const KEY_LEN: usize = 32;
/// Length of the AES-256-SIV name key (two AES-256 keys).
pub const SIV_KEY_LEN: usize = 64;
/// Prefix of every HKDF info string.
pub const INFO_PREFIX: &str = "cloakfs v1 ";

/// HKDF labels, one per purpose.
pub mod label {
    /// Content master key, from which per-file keys are derived.
    pub const CONTENT: &str = "content";
    /// AES-256-SIV key for file and directory names.
    pub const NAMES: &str = "names";
    /// AES-256-SIV key for extended-attribute names.
    pub const XATTR_NAMES: &str = "xattr-names";
    /// AES-256-GCM key for symlink targets and xattr values.
    pub const METADATA: &str = "metadata";
    /// HMAC-SHA256 key authenticating the volume config.
    pub const CONFIG_MAC: &str = "config-mac";
    /// Info prefix of a per-file key (followed by the 16-byte file ID).
    pub const FILE: &str = "file";
    /// Info prefix of a file's 64-byte XTS-AES-256 key pair (followed by the file ID).
    pub const XTS_FILE: &str = "xts-file";
    /// Info prefix of a file's AES-256-CTR key for XTS data units shorter than one AES block
    /// (followed by the file ID).
    pub const XTS_SHORT: &str = "xts-short";
    /// HMAC-SHA256 key of a reverse view's derived IDs and nonces (docs/FORMAT.md section 17).
    pub const REVERSE: &str = "reverse";
    /// HMAC-SHA256 key of a sharing volume's file headers (docs/FORMAT.md section 18.2).
    pub const SHARE_HEADER: &str = "share-header";
    /// HMAC-SHA256 key of a sharing volume's retirement records (docs/FORMAT.md section 18.8).
    pub const SHARE_RETIRED: &str = "share-retired";
    /// HMAC-SHA256 key of an adopted tree's manifest of plaintext entries and its retired
    /// entries (docs/FORMAT.md section 21.1).
    pub const ADOPTED: &str = "adopted manifest";
    /// HMAC-SHA256 key new directory IDs are derived with (docs/FORMAT.md section 9.2).
    pub const DIR_ID: &str = "directory id";
    /// The master key's public fingerprint, which a machine remembers per volume (key pinning).
    pub const FINGERPRINT: &str = "key-fingerprint";
}

/// The volume's random master key. Stored on disk only wrapped by key slots.
#[derive(Clone, Debug)]
pub struct MasterKey(SecretBytes<KEY_LEN>);

impl MasterKey {
    /// A fresh random master key.
    pub fn generate() -> Self {
        Self(SecretBytes::random())
    }

    /// A master key from known bytes (unwrapped from a slot, or a test vector).
    pub fn from_bytes(bytes: &[u8; KEY_LEN]) -> Self {
        Self(SecretBytes::from_slice(bytes))
    }

    /// The raw key bytes.
    pub fn expose(&self) -> &[u8; KEY_LEN] {
        self.0.expose()
    }

    /// The key's fingerprint: HKDF-derived like a subkey, so it reveals nothing about the key
    /// or any other subkey, yet changes whenever the key does.
    pub fn fingerprint(&self, volume_id: &[u8; 16]) -> KeyFingerprint {
        let fp: SecretBytes<32> = self.subkey(volume_id, label::FINGERPRINT);
        KeyFingerprint(*fp.expose())
    }

    /// Derives the subkey for `label` into `N` bytes.
    pub fn subkey<const N: usize>(&self, volume_id: &[u8; 16], label: &str) -> SecretBytes<N> {
        hkdf_expand(self.0.expose(), Some(volume_id), label.as_bytes(), &[])
    }
}

/// A master key's fingerprint ([`MasterKey::fingerprint`]): public, shown to users and kept
/// by each machine that opened the volume. Displayed as unpadded base64url.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct KeyFingerprint(pub [u8; 32]);

impl KeyFingerprint {
    /// Parses the displayed form (unpadded base64url of 32 bytes).
    pub fn parse(text: &str) -> Option<Self> {
        crate::text::unb64_array(text.trim()).map(Self)
    }
}

impl std::fmt::Display for KeyFingerprint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&crate::text::b64(&self.0))
    }
}

impl std::fmt::Debug for KeyFingerprint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KeyFingerprint({self})")
    }
}

/// HKDF-SHA256 with info = `INFO_PREFIX || label || extra`, into a locked buffer.
pub(crate) fn hkdf_expand<const N: usize>(
    ikm: &[u8],
    salt: Option<&[u8]>,
    label: &[u8],
    extra: &[u8],
) -> SecretBytes<N> {
    HkdfKey::new(salt, ikm).expand(label, extra)
}

/// HKDF-SHA256 after its extract step: the HMAC keyed with the pseudorandom key, in locked
/// memory. `Hkdf<Sha256>` holds that HMAC state inline.
///
/// Extracting and expanding both leave key material on the stack (the input key in SHA-256's
/// block buffer, each output block before it is copied out), so both are scrubbed.
pub(crate) struct HkdfKey(LockedBox<Hkdf<Sha256>>);

impl HkdfKey {
    /// Extracts from `ikm` with `salt`.
    pub(crate) fn new(salt: Option<&[u8]>, ikm: &[u8]) -> Self {
        Self(LockedBox::new(|| Hkdf::<Sha256>::new(salt, ikm)))
    }

    /// Expands with info = `INFO_PREFIX || label || extra` into a fresh locked buffer.
    pub(crate) fn expand<const N: usize>(&self, label: &[u8], extra: &[u8]) -> SecretBytes<N> {
        let mut out = SecretBytes::<N>::zero();
        scrubbed(|| {
            self.0
                .expand_multi_info(&[INFO_PREFIX.as_bytes(), label, extra], out.expose_mut())
        })
        .expect("HKDF output length is a small constant");
        out
    }
}
