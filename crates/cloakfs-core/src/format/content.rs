//! File content encryption: the content suites ([`ContentSuite`]) and one file's cipher
//! ([`FileCipher`]), keyed through the volume's [`FileKeySource`].
//!
//! Construction (docs/FORMAT.md, "File contents"):
//! - the file key is derived from the content key and the file ID (HKDF-SHA256, info
//!   "cloakfs v1 file" || file ID) or, in a sharing volume, random and wrapped to each
//!   recipient in the file's header (`format::filekey`);
//! - block n = nonce || AEAD(key, nonce, plaintext, aad = file ID || n as u64 big-endian) || tag,
//!   with a fresh random nonce on every write (AES-256-GCM: 12 bytes, NIST SP 800-38D;
//!   XChaCha20-Poly1305: 24 bytes, draft-irtf-cfrg-xchacha); AES-256-GCM-SIV (`gcm_siv`) may
//!   also seal with derived nonces ([`FileCipher::seal_derived`], for reverse views);
//! - AES-256-XTS (`xts`) is size-preserving: no nonce, no tag, no integrity, and the header is
//!   in an xattr of the backing file (`io::header`);
//! - an all-zero backing block is a hole (reads as zeros) unless the volume is strict.
//!
//! AES-256-GCM is ring's (`crypto/gcm.rs`), byte-identical to RustCrypto's `aes-gcm` (a test
//! below), and opens in place: [`FileCipher::open_within`] lets a read decrypt its blocks inside
//! the buffer it read them into. A request that seals many blocks draws all their nonces in one
//! OS call ([`FileCipher::fresh_nonces`]).

use crate::crypto::gcm::GcmKey;
use crate::crypto::keys::HkdfKey;
use crate::crypto::locked::LockedBox;
use crate::crypto::secret::SecretBytes;
use crate::error::{Error, Result};
use crate::format::filekey::{
    DerivedKeys, FileKeySource, HeaderMacKey, Member, OpenedHeader, WrappedKeys,
};
use crate::format::layout::{Layout, HEADER_LEN};
use chacha20poly1305::aead::{AeadInPlace, KeyInit};
use chacha20poly1305::XChaCha20Poly1305;

mod gcm_siv;
mod xts;

/// Version of the per-file header written by this build.
pub const HEADER_VERSION: u16 = 1;
/// Length of the AEAD tag of every block.
pub const TAG_LEN: usize = 16;
/// Length of the additional authenticated data of a block.
pub const AAD_LEN: usize = 24;
/// Longest nonce of any content suite (XChaCha20-Poly1305).
const MAX_NONCE_LEN: usize = 24;

/// The content AEAD of a volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContentSuite {
    /// AES-256-GCM with 96-bit random nonces (default).
    Aes256Gcm,
    /// XChaCha20-Poly1305 with 192-bit random nonces.
    XChaCha20Poly1305,
    /// AES-256-GCM-SIV (RFC 8452) with 96-bit nonces: random in a mount, derived in a reverse
    /// view (it is nonce-misuse resistant).
    Aes256GcmSiv,
    /// AES-256-XTS (IEEE 1619): size-preserving, no integrity, header in an xattr.
    Aes256Xts,
}

/// Where a file's header (version and file ID) is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeaderPlace {
    /// The first `HEADER_LEN` bytes of the backing file.
    InFile,
    /// The value of the backing file's extended attribute `name`; the backing file holds
    /// only blocks.
    Xattr(&'static str),
}

impl ContentSuite {
    /// Name used in the volume config.
    pub fn name(self) -> &'static str {
        match self {
            ContentSuite::Aes256Gcm => "aes-256-gcm",
            ContentSuite::XChaCha20Poly1305 => "xchacha20-poly1305",
            ContentSuite::Aes256GcmSiv => gcm_siv::NAME,
            ContentSuite::Aes256Xts => xts::NAME,
        }
    }

    /// Parses a config name.
    pub fn from_name(s: &str) -> Option<Self> {
        match s {
            "aes-256-gcm" => Some(ContentSuite::Aes256Gcm),
            "xchacha20-poly1305" => Some(ContentSuite::XChaCha20Poly1305),
            gcm_siv::NAME => Some(ContentSuite::Aes256GcmSiv),
            xts::NAME => Some(ContentSuite::Aes256Xts),
            _ => None,
        }
    }

    /// Nonce length in bytes.
    pub fn nonce_len(self) -> usize {
        match self {
            ContentSuite::Aes256Gcm => 12,
            ContentSuite::XChaCha20Poly1305 => 24,
            ContentSuite::Aes256GcmSiv => gcm_siv::NONCE_LEN,
            ContentSuite::Aes256Xts => 0,
        }
    }

    /// Backing bytes added to each block.
    pub fn overhead(self) -> u64 {
        if self.authenticated() {
            (self.nonce_len() + TAG_LEN) as u64
        } else {
            0
        }
    }

    /// Whether blocks carry a tag, so that a changed ciphertext is detected. False only for
    /// AES-256-XTS, where it decrypts to different plaintext, silently.
    pub fn authenticated(self) -> bool {
        self != ContentSuite::Aes256Xts
    }

    /// For a suite without integrity, the one line that says so (init, info, fsck, README).
    pub fn integrity_warning(self) -> Option<&'static str> {
        (!self.authenticated()).then_some(
            "aes-256-xts has no integrity: a changed ciphertext decrypts to different \
             plaintext, silently (names stay authenticated)",
        )
    }

    /// Whether backing xattr `name` is a file's header (not a user xattr to decrypt).
    pub fn is_header_xattr(self, name: &[u8]) -> bool {
        matches!(self.header_place(), HeaderPlace::Xattr(h) if h.as_bytes() == name)
    }

    /// Where each file's header is kept.
    pub fn header_place(self) -> HeaderPlace {
        match self {
            ContentSuite::Aes256Xts => HeaderPlace::Xattr(xts::HEADER_XATTR),
            _ => HeaderPlace::InFile,
        }
    }

    /// Backing bytes of the header in front of the blocks.
    pub fn header_len(self) -> u64 {
        match self.header_place() {
            HeaderPlace::InFile => HEADER_LEN,
            HeaderPlace::Xattr(_) => 0,
        }
    }
}

/// A file's random 128-bit identifier, stored in its header and bound into every block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FileId(pub [u8; 16]);

impl FileId {
    /// A fresh random file ID.
    pub fn random() -> Self {
        Self(crate::crypto::random::array())
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
    /// Where each file's key comes from (the content key, extracted once, or the header).
    keys: FileKeySource,
}

impl std::fmt::Debug for ContentCodec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ContentCodec")
            .field("suite", &self.suite)
            .field("layout", &self.layout)
            .field("strict_holes", &self.strict_holes)
            .field("keys", &self.keys)
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
            layout: Layout::with_header(block_size, suite.overhead(), suite.header_len()),
            strict_holes,
            keys: FileKeySource::Derived(DerivedKeys(HkdfKey::new(None, key.expose()))),
        }
    }

    /// A codec of a sharing volume: every file's key is random and wrapped to its recipients
    /// in its header, opened with `member`'s identities (`None`: no file opens), every header
    /// authenticated under `header_mac`.
    pub fn new_wrapped(
        suite: ContentSuite,
        block_size: u64,
        strict_holes: bool,
        member: Option<Member>,
        header_mac: HeaderMacKey,
    ) -> Self {
        let keys = FileKeySource::Wrapped(Box::new(WrappedKeys::new(member, header_mac)));
        Self {
            suite,
            layout: Layout::new(block_size, suite.overhead()).with_header_len(keys.header_len()),
            strict_holes,
            keys,
        }
    }

    /// Where file keys come from.
    pub fn key_source(&self) -> &FileKeySource {
        &self.keys
    }

    /// The cipher of the file whose header is `header` ([`Layout::header_len`] bytes). A
    /// shared file the member has no entry for is [`Error::AccessDenied`].
    pub fn open_header(&self, header: &[u8]) -> Result<OpenedHeader> {
        match &self.keys {
            FileKeySource::Derived(_) if self.suite == ContentSuite::Aes256Xts => {
                let (id, tail) = xts::parse_header(header)?;
                let cipher = self.file_cipher(id);
                cipher.set_xts_tail(tail);
                Ok(OpenedHeader {
                    cipher,
                    recipients: Vec::new(),
                })
            }
            FileKeySource::Derived(_) => Ok(OpenedHeader {
                cipher: self.file_cipher(FileHeader::parse(header)?.id),
                recipients: Vec::new(),
            }),
            FileKeySource::Wrapped(w) => {
                if let Some((id, key, recipients)) = w.recall_verified(header) {
                    return Ok(OpenedHeader {
                        cipher: self.cipher_with_key(id, key),
                        recipients,
                    });
                }
                let h = w.parse_header(header)?;
                let fk = w.file_key(&h)?;
                let key = FileKeySource::block_key(&HkdfKey::new(None, fk.expose()), &h.id);
                let recipients = h.recipients();
                w.keep_verified(header, h.id, &key, &recipients);
                Ok(OpenedHeader {
                    cipher: self.cipher_with_key(h.id, key),
                    recipients,
                })
            }
        }
    }

    /// A fresh header with a new random file ID (and, shared, a new file key granted to
    /// `recipients`, or to the member if there are none): its bytes and what it opens to.
    pub fn fresh_header(&self, recipients: &[String]) -> Result<(Vec<u8>, OpenedHeader)> {
        let drawn: [u8; 32] = crate::crypto::random::array();
        let (id, tail) = drawn.split_at(16);
        self.header_with_id(FileId(id.try_into().expect("16 bytes")), tail, recipients)
    }

    /// [`ContentCodec::fresh_header`] and `count` fresh nonces for the file's first blocks, the
    /// file ID (with the tail's counter block) and the nonces drawn in one getrandom(2): a new
    /// file's first write needs both.
    pub fn fresh_header_with_nonces(
        &self,
        recipients: &[String],
        count: usize,
    ) -> Result<(Vec<u8>, OpenedHeader, Vec<FreshNonce>)> {
        let mut id = [0u8; 16];
        let nonce_len = self.suite.nonce_len();
        let mut drawn = vec![0u8; 2 * id.len() + count * nonce_len];
        crate::crypto::random::fill(&mut drawn);
        let (id_bytes, rest) = drawn.split_at(id.len());
        let (tail, nonces) = rest.split_at(id.len());
        id.copy_from_slice(id_bytes);
        let (bytes, opened) = self.header_with_id(FileId(id), tail, recipients)?;
        Ok((bytes, opened, FreshNonce::split(nonces, nonce_len, count)))
    }

    /// A header for new file `id` (see [`ContentCodec::fresh_header`]); `tail` is 16 random
    /// bytes, the counter block of its short last block where the suite keeps one in the header
    /// (AES-256-XTS).
    fn header_with_id(
        &self,
        id: FileId,
        tail: &[u8],
        recipients: &[String],
    ) -> Result<(Vec<u8>, OpenedHeader)> {
        match &self.keys {
            FileKeySource::Derived(_) if self.suite == ContentSuite::Aes256Xts => {
                let tail = xts::Tail::Drawn {
                    counter: tail.try_into().expect("16 bytes"),
                    sealed: false,
                };
                let cipher = self.file_cipher(id);
                cipher.set_xts_tail(tail);
                Ok((
                    xts::header_bytes(id, tail),
                    OpenedHeader {
                        cipher,
                        recipients: Vec::new(),
                    },
                ))
            }
            FileKeySource::Derived(_) => Ok((
                FileHeader { id }.to_bytes().to_vec(),
                OpenedHeader {
                    cipher: self.file_cipher(id),
                    recipients: Vec::new(),
                },
            )),
            FileKeySource::Wrapped(w) => {
                let (header, fk, recipients) = w.new_file(id, recipients)?;
                Ok((
                    header.to_bytes()?,
                    OpenedHeader {
                        cipher: self.cipher_from_file_key(id, &fk),
                        recipients,
                    },
                ))
            }
        }
    }

    /// The cipher of shared file `id` with file key `fk`.
    pub fn cipher_from_file_key(&self, id: FileId, fk: &SecretBytes<32>) -> FileCipher {
        let key = FileKeySource::block_key(&HkdfKey::new(None, fk.expose()), &id);
        self.cipher_with_key(id, key)
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

    /// The cipher for the file with this ID, its key derived from the volume's content key.
    /// Its key and key schedule are built in locked memory; the key bytes are wiped once the
    /// schedule is made. On a sharing volume (whose files have no derived key) use
    /// [`ContentCodec::open_header`]: this then gives a cipher nothing was sealed with.
    pub fn file_cipher(&self, id: FileId) -> FileCipher {
        let key = match &self.keys {
            FileKeySource::Derived(k) => FileKeySource::block_key(&k.0, &id),
            FileKeySource::Wrapped(_) => SecretBytes::random(),
        };
        self.cipher_with_key(id, key)
    }

    fn cipher_with_key(&self, id: FileId, key: SecretBytes<32>) -> FileCipher {
        let aead = match self.suite {
            ContentSuite::Aes256Gcm => Aead::Gcm(GcmKey::new(key.expose())),
            ContentSuite::XChaCha20Poly1305 => Aead::XChaCha(LockedBox::new(|| {
                XChaCha20Poly1305::new(key.expose().into())
            })),
            ContentSuite::Aes256GcmSiv => Aead::GcmSiv(gcm_siv::GcmSivKey::new(key.expose())),
            ContentSuite::Aes256Xts => Aead::Xts(match &self.keys {
                FileKeySource::Derived(k) => xts::XtsKey::new(&k.0, id),
                // A config pairing XTS with wrapped keys is refused (sharing needs an
                // authenticated cipher); were it not, the file key would key the file.
                FileKeySource::Wrapped(_) => {
                    xts::XtsKey::new(&HkdfKey::new(None, key.expose()), id)
                }
            }),
        };
        FileCipher {
            id,
            aead,
            nonce_len: self.suite.nonce_len(),
            overhead: self.suite.overhead() as usize,
            full_block: self.layout.cipher_block_size() as usize,
            strict_holes: self.strict_holes,
        }
    }
}

/// The keyed AEAD of one file, in locked memory: ring's AES-GCM schedule ([`GcmKey`]), or
/// RustCrypto's `XChaCha20Poly1305`, which holds just its 32-byte key. The per-block
/// ChaCha20 and Poly1305 states it derives from that key on the stack wipe themselves when
/// dropped (the chacha20 and poly1305 crates' zeroize features).
enum Aead {
    Gcm(GcmKey),
    XChaCha(LockedBox<XChaCha20Poly1305>),
    GcmSiv(gcm_siv::GcmSivKey),
    Xts(xts::XtsKey),
}

/// A nonce drawn from the operating system's RNG for exactly one seal.
///
/// Neither `Clone` nor `Copy`: [`FileCipher::seal_fresh`] consumes it, so a drawn nonce cannot
/// be used twice. Never all zeros (an all-zero nonce would make a block look like a hole).
pub struct FreshNonce {
    bytes: [u8; MAX_NONCE_LEN],
    len: u8,
}

impl FreshNonce {
    /// Wraps bytes just drawn from the OS RNG, redrawing them in the (2^-96) case that they
    /// are all zero.
    fn from_os(drawn: &[u8]) -> Self {
        let mut bytes = [0u8; MAX_NONCE_LEN];
        if drawn.is_empty() {
            // A suite without nonces (AES-256-XTS).
            return Self { bytes, len: 0 };
        }
        let n = &mut bytes[..drawn.len()];
        n.copy_from_slice(drawn);
        while n.iter().all(|&b| b == 0) {
            crate::crypto::random::fill(n);
        }
        Self {
            bytes,
            len: drawn.len() as u8,
        }
    }

    /// `count` nonces of `nonce_len` bytes from `drawn` (`count * nonce_len` bytes just drawn
    /// from the OS RNG).
    fn split(drawn: &[u8], nonce_len: usize, count: usize) -> Vec<Self> {
        debug_assert_eq!(drawn.len(), count * nonce_len);
        if nonce_len == 0 {
            return (0..count).map(|_| Self::from_os(&[])).collect();
        }
        drawn.chunks_exact(nonce_len).map(Self::from_os).collect()
    }

    fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }
}

impl std::fmt::Debug for FreshNonce {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FreshNonce(..)")
    }
}

/// Seals and opens the blocks of one file. Its key schedule is in locked memory and wiped on
/// drop.
pub struct FileCipher {
    id: FileId,
    aead: Aead,
    nonce_len: usize,
    overhead: usize,
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

/// A file's tail counter block as it was before a write (AES-256-XTS), to put back if the
/// write fails: see [`FileCipher::put_back_tail`].
#[derive(Debug, Clone, Copy)]
pub struct TailMark(Option<(FileId, xts::Tail)>);

impl FileCipher {
    /// The file ID this cipher is bound to.
    pub fn id(&self) -> FileId {
        self.id
    }

    fn set_xts_tail(&self, tail: xts::Tail) {
        if let Aead::Xts(k) = &self.aead {
            k.set_tail(tail);
        }
    }

    /// Before a block of `len` bytes is sealed (after the blocks it replaces are opened):
    /// under AES-256-XTS, a short one (AES-256-CTR) gets an initial counter block that no block
    /// was sealed under yet, drawn at random (FORMAT.md section 20). Returns the header that
    /// records a new one, which the caller must store before it writes the block; `None` when
    /// there is none to store (another suite, a block of 16 bytes or more, or a counter block
    /// still unused).
    pub fn fresh_tail(&self, len: usize) -> Option<Vec<u8>> {
        let Aead::Xts(k) = &self.aead else {
            return None;
        };
        k.fresh_tail(len)
            .then(|| xts::header_bytes(self.id, k.tail()))
    }

    /// What [`FileCipher::fresh_tail`] changes.
    pub fn tail_mark(&self) -> TailMark {
        match &self.aead {
            Aead::Xts(k) => TailMark(Some((self.id, k.tail()))),
            _ => TailMark(None),
        }
    }

    /// Puts back the tail counter block of `mark`, taken from this file before a write that
    /// failed (its old blocks are put back too, sealed under it). Returns the header to store
    /// if that changed it; `None` if not, or if the file has another ID by now.
    pub fn put_back_tail(&self, mark: TailMark) -> Option<Vec<u8>> {
        let (id, tail) = mark.0?;
        let Aead::Xts(k) = &self.aead else {
            return None;
        };
        if id != self.id {
            return None;
        }
        // The failed write may have sealed under either counter block.
        let (old, now) = (tail.sealed(), k.tail().sealed());
        k.set_tail(old);
        (old != now).then(|| xts::header_bytes(id, old))
    }

    fn aad(&self, block: u64) -> [u8; AAD_LEN] {
        let mut aad = [0u8; AAD_LEN];
        aad[..16].copy_from_slice(&self.id.0);
        aad[16..].copy_from_slice(&block.to_be_bytes());
        aad
    }

    /// `count` fresh random nonces, drawn from the operating system's RNG in one call, for a
    /// request that seals `count` blocks: one getrandom(2) per request instead of one per block.
    /// Each is consumed by [`FileCipher::seal_fresh`].
    pub fn fresh_nonces(&self, count: usize) -> Vec<FreshNonce> {
        let mut drawn = vec![0u8; count * self.nonce_len];
        if !drawn.is_empty() {
            crate::crypto::random::fill(&mut drawn);
        }
        FreshNonce::split(&drawn, self.nonce_len, count)
    }

    /// Seals `plain` as block `block` into `out` (`plain.len() + overhead` bytes) with a fresh
    /// random nonce from the OS RNG (one getrandom(2); to seal many blocks, draw their nonces at
    /// once with [`FileCipher::fresh_nonces`] and use [`FileCipher::seal_fresh`]).
    pub fn seal(&self, block: u64, plain: &[u8], out: &mut [u8]) {
        let mut drawn = [0u8; MAX_NONCE_LEN];
        let drawn = &mut drawn[..self.nonce_len];
        crate::crypto::random::fill(drawn);
        self.seal_fresh(block, FreshNonce::from_os(drawn), plain, out);
    }

    /// Seals `plain` as block `block` into `out` (`plain.len() + overhead` bytes) with `nonce`,
    /// one of [`FileCipher::fresh_nonces`].
    pub fn seal_fresh(&self, block: u64, nonce: FreshNonce, plain: &[u8], out: &mut [u8]) {
        self.seal_raw(block, nonce.as_bytes(), plain, out);
    }

    /// Seals `plain` as block `block` into `out` with a nonce derived from the file ID and the
    /// block number (a reverse view, docs/FORMAT.md section 17), so that the same plaintext
    /// gives the same block. Refused unless the suite is nonce-misuse resistant
    /// (AES-256-GCM-SIV): under AES-GCM or XChaCha20-Poly1305 a repeated nonce with different
    /// plaintext would leak their XOR and the authentication key.
    pub fn seal_derived(
        &self,
        block: u64,
        nonce: &[u8; 12],
        plain: &[u8],
        out: &mut [u8],
    ) -> Result<()> {
        if !matches!(self.aead, Aead::GcmSiv(_)) {
            return Err(Error::Refused(
                "derived nonces need a nonce-misuse-resistant suite (aes-256-gcm-siv)".into(),
            ));
        }
        self.seal_raw(block, nonce, plain, out);
        Ok(())
    }

    /// Seals with a caller-chosen nonce. Only for test vectors: reusing a nonce breaks the AEAD.
    pub fn seal_with_nonce(&self, block: u64, nonce: &[u8], plain: &[u8], out: &mut [u8]) {
        self.seal_raw(block, nonce, plain, out);
    }

    fn seal_raw(&self, block: u64, nonce: &[u8], plain: &[u8], out: &mut [u8]) {
        let n = self.nonce_len;
        assert_eq!(nonce.len(), n, "nonce length");
        assert_eq!(
            out.len(),
            plain.len() + self.overhead,
            "sealed block length"
        );
        if let Aead::Xts(k) = &self.aead {
            out.copy_from_slice(plain);
            k.encrypt(block, out);
            return;
        }
        let aad = self.aad(block);
        out[..n].copy_from_slice(nonce);
        let (body, tag_out) = out[n..].split_at_mut(plain.len());
        body.copy_from_slice(plain);
        match &self.aead {
            Aead::Gcm(c) => {
                let nonce = nonce.try_into().expect("12-byte nonce");
                tag_out.copy_from_slice(&c.seal_in_place(nonce, &aad, body));
            }
            Aead::XChaCha(c) => {
                let tag = c
                    .encrypt_in_place_detached(nonce.into(), &aad, body)
                    .expect("block sizes are far below the AEAD length limits");
                tag_out.copy_from_slice(&tag);
            }
            Aead::GcmSiv(c) => tag_out.copy_from_slice(&c.seal_in_place(nonce, &aad, body)),
            Aead::Xts(_) => unreachable!("sealed above"),
        }
    }

    /// Opens sealed block `block` from `sealed` into `out` (`sealed.len() - overhead` bytes).
    /// An all-zero full-size `sealed` is a hole and yields zeros, unless the volume is strict.
    /// A short (last) block is never a hole: writers always seal it.
    pub fn open(&self, block: u64, sealed: &[u8], out: &mut [u8]) -> Result<()> {
        let n = self.nonce_len;
        if sealed.len() <= self.overhead || out.len() != sealed.len() - self.overhead {
            return Err(Error::Tampered(format!("block {block} truncated")));
        }
        if self.is_hole(block, sealed)? {
            out.fill(0);
            return Ok(());
        }
        out.copy_from_slice(&sealed[n..n + out.len()]);
        self.decrypt(block, &sealed[..n], &sealed[n + out.len()..], out, 0)
    }

    /// Opens sealed block `block`, held in `in_out[src..]`, into `in_out[..len]` and returns
    /// `len` (its plaintext length), without a second buffer: a read can open the blocks of a
    /// run in order, each moving left over the sealed bytes of the ones before it. Holes as in
    /// [`FileCipher::open`].
    pub fn open_within(&self, block: u64, in_out: &mut [u8], src: usize) -> Result<usize> {
        let n = self.nonce_len;
        let sealed = in_out.get(src..).unwrap_or_default();
        if sealed.len() <= self.overhead {
            return Err(Error::Tampered(format!("block {block} truncated")));
        }
        let len = sealed.len() - self.overhead;
        if self.is_hole(block, sealed)? {
            in_out[..len].fill(0);
            return Ok(len);
        }
        // Copied out: the plaintext will overwrite them.
        let mut nonce = [0u8; MAX_NONCE_LEN];
        nonce[..n].copy_from_slice(&sealed[..n]);
        let mut tag = [0u8; TAG_LEN];
        let tag = &mut tag[..self.overhead - n];
        tag.copy_from_slice(&sealed[n + len..]);
        let in_out = &mut in_out[..src + n + len];
        self.decrypt(block, &nonce[..n], tag, in_out, src + n)?;
        Ok(len)
    }

    /// Whether `sealed` (at least one byte past nonce and tag) is a hole: all zeros, allowed
    /// only for a full block of a volume that is not strict.
    fn is_hole(&self, block: u64, sealed: &[u8]) -> Result<bool> {
        let n = self.nonce_len;
        if !(sealed[..n].iter().all(|&b| b == 0) && sealed.iter().all(|&b| b == 0)) {
            return Ok(false);
        }
        if self.overhead == 0 && sealed.len() != self.full_block {
            // Without a tag nothing marks tampering: a short all-zero block is a ciphertext
            // like any other (a 1-byte tail is all zeros one time in 256).
            return Ok(false);
        }
        if self.strict_holes || sealed.len() != self.full_block {
            return Err(Error::Tampered(format!(
                "block {block} is all zeros (not a hole here)"
            )));
        }
        Ok(true)
    }

    /// Decrypts the ciphertext `in_out[src..]` of block `block` into `in_out[..]` (moved left
    /// by `src`).
    fn decrypt(
        &self,
        block: u64,
        nonce: &[u8],
        tag: &[u8],
        in_out: &mut [u8],
        src: usize,
    ) -> Result<()> {
        let len = in_out.len() - src;
        if let Aead::Xts(k) = &self.aead {
            if src > 0 {
                in_out.copy_within(src.., 0);
            }
            k.decrypt(block, &mut in_out[..len]);
            return Ok(());
        }
        let aad = self.aad(block);
        let ok = match &self.aead {
            Aead::Gcm(c) => c.open_within(
                nonce.try_into().expect("12-byte nonce"),
                &aad,
                tag.try_into().expect("16-byte tag"),
                in_out,
                src,
            ),
            Aead::XChaCha(c) => {
                if src > 0 {
                    in_out.copy_within(src.., 0);
                }
                c.decrypt_in_place_detached(nonce.into(), &aad, &mut in_out[..len], tag.into())
                    .map_err(drop)
            }
            Aead::GcmSiv(c) => {
                if src > 0 {
                    in_out.copy_within(src.., 0);
                }
                c.open_in_place(nonce, &aad, &mut in_out[..len], tag)
            }
            Aead::Xts(_) => unreachable!("decrypted above"),
        };
        // On failure the output may hold unauthenticated plaintext: never hand it out.
        ok.map_err(|()| {
            in_out[..len].fill(0);
            Error::Tampered(format!("block {block} failed authentication"))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::keys::{hkdf_expand, label};

    const ALL_SUITES: [ContentSuite; 3] = [
        ContentSuite::Aes256Gcm,
        ContentSuite::XChaCha20Poly1305,
        ContentSuite::Aes256GcmSiv,
    ];

    #[test]
    fn derived_nonces_only_with_gcm_siv() {
        let nonce = [9u8; 12];
        let mut a = vec![0u8; 4 + 28];
        let mut b = vec![0u8; 4 + 28];
        for suite in [ContentSuite::Aes256Gcm, ContentSuite::XChaCha20Poly1305] {
            let c = codec(suite, false).file_cipher(FileId([1; 16]));
            let mut out = vec![0u8; 4 + suite.overhead() as usize];
            assert!(c.seal_derived(0, &nonce, b"same", &mut out).is_err());
        }
        let c = codec(ContentSuite::Aes256GcmSiv, false).file_cipher(FileId([1; 16]));
        c.seal_derived(0, &nonce, b"same", &mut a).unwrap();
        c.seal_derived(0, &nonce, b"same", &mut b).unwrap();
        assert_eq!(a, b, "deterministic");
        let mut out = [0u8; 4];
        c.open(0, &a, &mut out).unwrap();
        assert_eq!(&out, b"same");
        assert!(
            c.open(1, &a, &mut out).is_err(),
            "bound to the block number"
        );
    }

    #[test]
    fn xts_preserves_sizes_and_round_trips_every_length() {
        let c = codec(ContentSuite::Aes256Xts, false).file_cipher(FileId([3; 16]));
        for len in [1usize, 2, 15, 16, 17, 31, 32, 100, 4095, 4096] {
            let plain: Vec<u8> = (0..len).map(|i| (i * 7 + 1) as u8).collect();
            let mut sealed = vec![0u8; len];
            c.seal(5, &plain, &mut sealed);
            assert_ne!(sealed, plain, "length {len}");
            let mut again = vec![0u8; len];
            c.seal(5, &plain, &mut again);
            assert_eq!(again, sealed, "deterministic per block, length {len}");
            c.seal(6, &plain, &mut again);
            assert_ne!(again, sealed, "the tweak is the block number, length {len}");
            let mut out = vec![0u8; len];
            c.open(5, &sealed, &mut out).unwrap();
            assert_eq!(out, plain, "length {len}");
            // No integrity: a flipped bit opens, to other plaintext.
            sealed[0] ^= 1;
            c.open(5, &sealed, &mut out).unwrap();
            assert_ne!(out, plain, "length {len}");
            let mut in_out = [vec![0xEE; 3], sealed.clone()].concat();
            sealed[0] ^= 1;
            in_out[3] ^= 1;
            assert_eq!(c.open_within(5, &mut in_out, 3).unwrap(), len);
            assert_eq!(in_out[..len], plain[..], "length {len}");
        }
        // A full all-zero block is a hole; a short one is a ciphertext like any other.
        let mut out = vec![1u8; 4096];
        c.open(0, &[0u8; 4096], &mut out).unwrap();
        assert!(out.iter().all(|&b| b == 0));
        let mut sealed = [0u8; 1];
        c.open(0, &[0u8; 1], &mut sealed).unwrap();
        c.seal(0, &sealed.clone(), &mut sealed);
        assert_eq!(sealed, [0u8; 1]);
        assert_eq!(ContentSuite::Aes256Xts.overhead(), 0);
        assert_eq!(
            codec(ContentSuite::Aes256Xts, false).layout().header_len(),
            0
        );
    }

    fn codec(suite: ContentSuite, strict: bool) -> ContentCodec {
        ContentCodec::new(suite, 4096, strict, SecretBytes::from_slice(&[7u8; 32]))
    }

    #[test]
    fn open_within_moves_each_block_left_over_the_ones_before() {
        for suite in ALL_SUITES {
            let c = codec(suite, false).file_cipher(FileId([2; 16]));
            let over = suite.overhead() as usize;
            let cbs = 4096 + over;
            // Three blocks: data, a hole, a short last block.
            let mut run = vec![0u8; 2 * cbs + 10 + over];
            c.seal(0, &[1u8; 4096], &mut run[..cbs]);
            c.seal(2, &[3u8; 10], &mut run[2 * cbs..]);
            let sealed = run.clone();
            for i in 0..3 {
                let end = ((i + 1) * cbs).min(run.len());
                let len = c.open_within(i as u64, &mut run[i * 4096..end], i * over);
                assert_eq!(len.unwrap(), if i == 2 { 10 } else { 4096 });
            }
            assert_eq!(run[..4096], [1u8; 4096]);
            assert_eq!(run[4096..8192], [0u8; 4096]);
            assert_eq!(run[8192..8202], [3u8; 10]);
            // A flipped bit fails, and leaves zeros where the plaintext would be.
            let mut bad = sealed[2 * cbs..].to_vec();
            bad[over] ^= 1;
            let mut in_out = [vec![0xEE; 7], bad].concat();
            assert!(c.open_within(2, &mut in_out, 7).is_err());
            assert_eq!(in_out[..10], [0u8; 10]);
        }
    }

    #[test]
    fn seal_open_round_trip_both_suites() {
        for suite in ALL_SUITES {
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
    fn batched_nonces_are_fresh_and_seal() {
        for suite in ALL_SUITES {
            let c = codec(suite, false).file_cipher(FileId([1; 16]));
            assert!(c.fresh_nonces(0).is_empty());
            let nonces = c.fresh_nonces(64);
            assert_eq!(nonces.len(), 64);
            let mut seen = std::collections::HashSet::new();
            for (i, nonce) in nonces.into_iter().enumerate() {
                assert_eq!(nonce.as_bytes().len(), suite.nonce_len());
                assert!(nonce.as_bytes().iter().any(|&b| b != 0));
                assert!(seen.insert(nonce.as_bytes().to_vec()), "nonce repeated");
                let plain = [i as u8; 100];
                let mut sealed = vec![0u8; plain.len() + suite.overhead() as usize];
                let nonce_bytes = nonce.as_bytes().to_vec();
                c.seal_fresh(i as u64, nonce, &plain, &mut sealed);
                assert_eq!(&sealed[..suite.nonce_len()], &nonce_bytes[..]);
                let mut out = [0u8; 100];
                c.open(i as u64, &sealed, &mut out).unwrap();
                assert_eq!(out, plain);
            }
        }
    }

    #[test]
    fn a_fresh_header_comes_with_fresh_nonces_for_its_first_blocks() {
        let mut ids = std::collections::HashSet::new();
        for suite in ALL_SUITES.into_iter().chain([ContentSuite::Aes256Xts]) {
            let codec = codec(suite, false);
            let (bytes, opened, nonces) = codec.fresh_header_with_nonces(&[], 3).unwrap();
            let id = match suite {
                ContentSuite::Aes256Xts => xts::parse_header(&bytes).unwrap().0,
                _ => FileHeader::parse(&bytes).unwrap().id,
            };
            assert_eq!(opened.cipher.id(), id);
            assert!(ids.insert(id.0), "file ID repeated");
            let reopened = codec.open_header(&bytes).unwrap().cipher;
            assert_eq!(nonces.len(), 3);
            let mut seen = std::collections::HashSet::new();
            for (b, nonce) in nonces.into_iter().enumerate() {
                assert_eq!(nonce.as_bytes().len(), suite.nonce_len());
                if suite.nonce_len() > 0 {
                    let n = suite.nonce_len().min(id.0.len());
                    assert_ne!(
                        &nonce.as_bytes()[..n],
                        &id.0[..n],
                        "drawn apart from the ID"
                    );
                    assert!(seen.insert(nonce.as_bytes().to_vec()), "nonce repeated");
                }
                let plain = [b as u8 + 1; 100];
                let mut sealed = vec![0u8; plain.len() + suite.overhead() as usize];
                opened
                    .cipher
                    .seal_fresh(b as u64, nonce, &plain, &mut sealed);
                let mut out = [0u8; 100];
                reopened.open(b as u64, &sealed, &mut out).unwrap();
                assert_eq!(out, plain);
            }
            assert!(codec.fresh_header_with_nonces(&[], 0).unwrap().2.is_empty());
        }
    }

    /// ring must give exactly the bytes of RustCrypto's aes-gcm (what earlier builds wrote),
    /// both ways, and a failed open must not leak unauthenticated plaintext.
    #[test]
    fn aes_gcm_is_byte_identical_to_rustcrypto() {
        use aes_gcm::aead::{Aead as _, KeyInit as _, Payload};
        let id = FileId([1; 16]);
        let c = codec(ContentSuite::Aes256Gcm, false).file_cipher(id);
        let key: SecretBytes<32> = hkdf_expand(&[7u8; 32], None, label::FILE.as_bytes(), &id.0);
        let reference = aes_gcm::Aes256Gcm::new(key.expose().into());
        let nonce = [0x5au8; 12];
        for len in [1usize, 15, 16, 17, 100, 4095, 4096] {
            let plain: Vec<u8> = (0..len).map(|i| (i * 31 + 3) as u8).collect();
            let aad = c.aad(9);
            let expected = reference
                .encrypt(
                    (&nonce).into(),
                    Payload {
                        msg: &plain,
                        aad: &aad,
                    },
                )
                .unwrap();
            let mut sealed = vec![0u8; len + 28];
            c.seal_with_nonce(9, &nonce, &plain, &mut sealed);
            assert_eq!(&sealed[..12], &nonce);
            assert_eq!(&sealed[12..], &expected[..], "length {len}");
            let mut out = vec![0u8; len];
            c.open(9, &sealed, &mut out).unwrap();
            assert_eq!(out, plain);
            let last = sealed.len() - 1;
            sealed[last] ^= 0x80; // bad tag: the body still decrypts, but must not come out
            out.fill(0xee);
            assert!(c.open(9, &sealed, &mut out).is_err());
            assert!(out.iter().all(|&b| b == 0), "failed open leaked bytes");
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
    fn xts_header_values_of_both_versions_parse_and_others_are_refused() {
        let id = FileId([9; 16]);
        let v1 = FileHeader { id }.to_bytes();
        assert_eq!(xts::parse_header(&v1).unwrap(), (id, xts::Tail::Position));
        let tail = xts::Tail::Drawn {
            counter: [5; 16],
            sealed: false,
        };
        let v2 = xts::header_bytes(id, tail);
        assert_eq!(v2, [&[0u8, 2][..], &[9; 16], &[5; 16]].concat());
        assert_eq!(xts::parse_header(&v2).unwrap(), (id, tail.sealed()));
        for bad in [
            &v1[..17],
            &v2[..18],
            &v2[..33],
            &[v2.as_slice(), &[0]].concat(),
            &[][..],
        ] {
            assert!(
                matches!(xts::parse_header(bad), Err(Error::Tampered(_))),
                "{} bytes",
                bad.len()
            );
        }
        let mut v3 = v2.clone();
        v3[1] = 3;
        assert!(matches!(
            xts::parse_header(&v3),
            Err(Error::UnsupportedVersion { found: 3, .. })
        ));
    }

    /// Each short XTS block is sealed under a counter block of its own, which the header
    /// returned before it records; blocks of 16 bytes and more need none.
    #[test]
    fn xts_short_blocks_get_a_counter_block_each() {
        let codec = codec(ContentSuite::Aes256Xts, false);
        let (header, opened, _) = codec.fresh_header_with_nonces(&[], 0).unwrap();
        let c = opened.cipher;
        assert_eq!(header.len(), 34);
        // The fresh header's counter block is unused: the first short block takes it.
        assert_eq!(c.fresh_tail(5), None);
        let mut first = [0u8; 5];
        c.seal(1, b"short", &mut first);
        assert_eq!(c.fresh_tail(16), None);
        let before = c.tail_mark();
        let header2 = c.fresh_tail(5).expect("a new counter block");
        assert_eq!(header2[..18], header[..18], "same version and ID");
        assert_ne!(header2[18..], header[18..]);
        let mut second = [0u8; 5];
        c.seal(1, b"short", &mut second);
        assert_ne!(first, second, "same plaintext, another keystream");
        for (h, sealed) in [(&header, first), (&header2, second)] {
            let mut out = [0u8; 5];
            codec
                .open_header(h)
                .unwrap()
                .cipher
                .open(1, &sealed, &mut out)
                .unwrap();
            assert_eq!(&out, b"short");
        }
        // Putting the first back (a failed write) gives its header again; it counts as used.
        assert_eq!(c.put_back_tail(before), Some(header.clone()));
        let mut out = [0u8; 5];
        c.open(1, &first, &mut out).unwrap();
        assert_eq!(&out, b"short");
        assert_ne!(c.fresh_tail(3), None);
        let other = codec.file_cipher(FileId([1; 16]));
        assert_eq!(other.put_back_tail(before), None, "another file's");
        let gcm = self::codec(ContentSuite::Aes256Gcm, false).file_cipher(FileId([1; 16]));
        assert_eq!(gcm.fresh_tail(5), None);
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
