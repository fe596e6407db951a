//! File content encryption: a per-file key and independently sealed blocks.
//!
//! Construction (see docs/FORMAT.md, "File contents"):
//! - per-file key = HKDF-SHA256(ikm = content key, salt = none,
//!   info = "cloakfs v1 file" || file ID), 32 bytes;
//! - block n = nonce || AEAD(key, nonce, plaintext, aad = file ID || n as u64 big-endian) || tag,
//!   with a fresh random nonce on every write (AES-256-GCM: 12 bytes, NIST SP 800-38D;
//!   XChaCha20-Poly1305: 24 bytes, draft-irtf-cfrg-xchacha);
//! - an all-zero backing block is a hole (reads as zeros) unless the volume is strict.

use crate::error::{Error, Result};
use crate::keys::{hkdf_expand, label};
use crate::layout::{Layout, HEADER_LEN};
use crate::secret::SecretBytes;
use aes_gcm::aead::{AeadInPlace, KeyInit};
use aes_gcm::Aes256Gcm;
use chacha20poly1305::XChaCha20Poly1305;

/// Version of the per-file header written by this build.
pub const HEADER_VERSION: u16 = 1;
/// Length of the AEAD tag of every block.
pub const TAG_LEN: usize = 16;
/// Length of the additional authenticated data of a block.
pub const AAD_LEN: usize = 24;

/// The content AEAD of a volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContentSuite {
    /// AES-256-GCM with 96-bit random nonces (default).
    Aes256Gcm,
    /// XChaCha20-Poly1305 with 192-bit random nonces.
    XChaCha20Poly1305,
}

impl ContentSuite {
    /// Name used in the volume config.
    pub fn name(self) -> &'static str {
        match self {
            ContentSuite::Aes256Gcm => "aes-256-gcm",
            ContentSuite::XChaCha20Poly1305 => "xchacha20-poly1305",
        }
    }

    /// Parses a config name.
    pub fn from_name(s: &str) -> Option<Self> {
        match s {
            "aes-256-gcm" => Some(ContentSuite::Aes256Gcm),
            "xchacha20-poly1305" => Some(ContentSuite::XChaCha20Poly1305),
            _ => None,
        }
    }

    /// Nonce length in bytes.
    pub fn nonce_len(self) -> usize {
        match self {
            ContentSuite::Aes256Gcm => 12,
            ContentSuite::XChaCha20Poly1305 => 24,
        }
    }

    /// Backing bytes added to each block.
    pub fn overhead(self) -> u64 {
        (self.nonce_len() + TAG_LEN) as u64
    }
}

/// A file's random 128-bit identifier, stored in its header and bound into every block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FileId(pub [u8; 16]);

impl FileId {
    /// A fresh random file ID.
    pub fn random() -> Self {
        Self(crate::random::array())
    }
}

/// The per-file header: version and file ID.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileHeader {
    /// The file's ID.
    pub id: FileId,
}

impl FileHeader {
    /// Serializes the header (`HEADER_LEN` bytes).
    pub fn to_bytes(&self) -> [u8; HEADER_LEN as usize] {
        let mut b = [0u8; HEADER_LEN as usize];
        b[..2].copy_from_slice(&HEADER_VERSION.to_be_bytes());
        b[2..].copy_from_slice(&self.id.0);
        b
    }

    /// Parses a header, refusing unknown versions.
    pub fn parse(b: &[u8]) -> Result<Self> {
        if b.len() < HEADER_LEN as usize {
            return Err(Error::Tampered("file header truncated".into()));
        }
        let version = u16::from_be_bytes([b[0], b[1]]);
        if version != HEADER_VERSION {
            return Err(Error::UnsupportedVersion {
                what: "file header",
                found: version.into(),
                supported: HEADER_VERSION.into(),
            });
        }
        let mut id = [0u8; 16];
        id.copy_from_slice(&b[2..18]);
        Ok(Self { id: FileId(id) })
    }
}

/// Volume-wide content parameters and the content key; makes per-file ciphers.
pub struct ContentCodec {
    suite: ContentSuite,
    layout: Layout,
    strict_holes: bool,
    key: SecretBytes<32>,
}

impl std::fmt::Debug for ContentCodec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ContentCodec")
            .field("suite", &self.suite)
            .field("layout", &self.layout)
            .field("strict_holes", &self.strict_holes)
            .finish_non_exhaustive()
    }
}

impl ContentCodec {
    /// A codec for `suite` with `block_size`-byte blocks and the given content key.
    pub fn new(
        suite: ContentSuite,
        block_size: u64,
        strict_holes: bool,
        key: SecretBytes<32>,
    ) -> Self {
        Self {
            suite,
            layout: Layout::new(block_size, suite.overhead()),
            strict_holes,
            key,
        }
    }

    /// Block geometry.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// The content AEAD.
    pub fn suite(&self) -> ContentSuite {
        self.suite
    }

    /// Whether all-zero blocks are rejected instead of read as holes.
    pub fn strict_holes(&self) -> bool {
        self.strict_holes
    }

    /// The cipher for the file with this ID.
    pub fn file_cipher(&self, id: FileId) -> FileCipher {
        let key: SecretBytes<32> =
            hkdf_expand(self.key.expose(), None, label::FILE.as_bytes(), &id.0);
        let aead = match self.suite {
            ContentSuite::Aes256Gcm => Aead::Gcm(Box::new(Aes256Gcm::new(key.expose().into()))),
            ContentSuite::XChaCha20Poly1305 => {
                Aead::XChaCha(Box::new(XChaCha20Poly1305::new(key.expose().into())))
            }
        };
        FileCipher {
            id,
            aead,
            nonce_len: self.suite.nonce_len(),
            full_block: self.layout.cipher_block_size() as usize,
            strict_holes: self.strict_holes,
        }
    }
}

enum Aead {
    Gcm(Box<Aes256Gcm>),
    XChaCha(Box<XChaCha20Poly1305>),
}

/// Seals and opens the blocks of one file. The key schedules are zeroized on drop.
pub struct FileCipher {
    id: FileId,
    aead: Aead,
    nonce_len: usize,
    full_block: usize,
    strict_holes: bool,
}

impl std::fmt::Debug for FileCipher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileCipher")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl FileCipher {
    /// The file ID this cipher is bound to.
    pub fn id(&self) -> FileId {
        self.id
    }

    fn aad(&self, block: u64) -> [u8; AAD_LEN] {
        let mut aad = [0u8; AAD_LEN];
        aad[..16].copy_from_slice(&self.id.0);
        aad[16..].copy_from_slice(&block.to_be_bytes());
        aad
    }

    /// Seals `plain` as block `block` into `out` (`plain.len() + overhead` bytes) with a fresh
    /// random nonce.
    pub fn seal(&self, block: u64, plain: &[u8], out: &mut [u8]) {
        let mut nonce = [0u8; 24];
        let nonce = &mut nonce[..self.nonce_len];
        // An all-zero nonce would make the block indistinguishable from a hole.
        while nonce.iter().all(|&b| b == 0) {
            crate::random::fill(nonce);
        }
        self.seal_with_nonce(block, nonce, plain, out);
    }

    /// Seals with a caller-chosen nonce. Only for test vectors: reusing a nonce breaks the AEAD.
    pub fn seal_with_nonce(&self, block: u64, nonce: &[u8], plain: &[u8], out: &mut [u8]) {
        let n = self.nonce_len;
        assert_eq!(nonce.len(), n, "nonce length");
        assert_eq!(out.len(), plain.len() + n + TAG_LEN, "sealed block length");
        let aad = self.aad(block);
        out[..n].copy_from_slice(nonce);
        let (body, tag_out) = out[n..].split_at_mut(plain.len());
        body.copy_from_slice(plain);
        let tag = match &self.aead {
            Aead::Gcm(c) => c.encrypt_in_place_detached(nonce.into(), &aad, body),
            Aead::XChaCha(c) => c.encrypt_in_place_detached(nonce.into(), &aad, body),
        }
        .expect("block sizes are far below the AEAD length limits");
        tag_out.copy_from_slice(&tag);
    }

    /// Opens sealed block `block` from `sealed` into `out` (`sealed.len() - overhead` bytes).
    /// An all-zero full-size `sealed` is a hole and yields zeros, unless the volume is strict.
    /// A short (last) block is never a hole: writers always seal it.
    pub fn open(&self, block: u64, sealed: &[u8], out: &mut [u8]) -> Result<()> {
        let n = self.nonce_len;
        if sealed.len() <= n + TAG_LEN || out.len() != sealed.len() - n - TAG_LEN {
            return Err(Error::Tampered(format!("block {block} truncated")));
        }
        if sealed[..n].iter().all(|&b| b == 0) && sealed.iter().all(|&b| b == 0) {
            if self.strict_holes || sealed.len() != self.full_block {
                return Err(Error::Tampered(format!(
                    "block {block} is all zeros (not a hole here)"
                )));
            }
            out.fill(0);
            return Ok(());
        }
        let (nonce, rest) = sealed.split_at(n);
        let (body, tag) = rest.split_at(rest.len() - TAG_LEN);
        out.copy_from_slice(body);
        let aad = self.aad(block);
        let ok = match &self.aead {
            Aead::Gcm(c) => c.decrypt_in_place_detached(nonce.into(), &aad, out, tag.into()),
            Aead::XChaCha(c) => c.decrypt_in_place_detached(nonce.into(), &aad, out, tag.into()),
        };
        ok.map_err(|_| {
            out.fill(0);
            Error::Tampered(format!("block {block} failed authentication"))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn codec(suite: ContentSuite, strict: bool) -> ContentCodec {
        ContentCodec::new(suite, 4096, strict, SecretBytes::from_slice(&[7u8; 32]))
    }

    #[test]
    fn seal_open_round_trip_both_suites() {
        for suite in [ContentSuite::Aes256Gcm, ContentSuite::XChaCha20Poly1305] {
            let c = codec(suite, false).file_cipher(FileId([1; 16]));
            let plain = b"hello block";
            let mut sealed = vec![0u8; plain.len() + suite.overhead() as usize];
            c.seal(3, plain, &mut sealed);
            let mut out = vec![0u8; plain.len()];
            c.open(3, &sealed, &mut out).unwrap();
            assert_eq!(&out, plain);
            // wrong block number, wrong file, flipped bit: all refused
            assert!(c.open(4, &sealed, &mut out).is_err());
            let other = codec(suite, false).file_cipher(FileId([2; 16]));
            assert!(other.open(3, &sealed, &mut out).is_err());
            sealed[suite.nonce_len() + 1] ^= 1;
            assert!(c.open(3, &sealed, &mut out).is_err());
        }
    }

    #[test]
    fn nonces_differ_between_writes() {
        let c = codec(ContentSuite::Aes256Gcm, false).file_cipher(FileId([1; 16]));
        let mut a = vec![0u8; 4 + 28];
        let mut b = vec![0u8; 4 + 28];
        c.seal(0, b"same", &mut a);
        c.seal(0, b"same", &mut b);
        assert_ne!(a, b);
    }

    #[test]
    fn holes_read_as_zero_unless_strict() {
        let zero = vec![0u8; 4096 + 28];
        let mut out = vec![1u8; 4096];
        let c = codec(ContentSuite::Aes256Gcm, false).file_cipher(FileId([1; 16]));
        c.open(0, &zero, &mut out).unwrap();
        assert!(out.iter().all(|&b| b == 0));
        let s = codec(ContentSuite::Aes256Gcm, true).file_cipher(FileId([1; 16]));
        assert!(s.open(0, &zero, &mut out).is_err());
        let short = vec![0u8; 100 + 28];
        assert!(
            c.open(0, &short, &mut out[..100]).is_err(),
            "short blocks are never holes"
        );
    }

    #[test]
    fn header_versions() {
        let h = FileHeader {
            id: FileId([9; 16]),
        };
        assert_eq!(FileHeader::parse(&h.to_bytes()).unwrap(), h);
        let mut b = h.to_bytes();
        b[1] = 2;
        assert!(matches!(
            FileHeader::parse(&b),
            Err(Error::UnsupportedVersion { .. })
        ));
    }
}
