//! The size-preserving AES-256-XTS content suite (IEEE 1619-2018, [`Xts256`]). No integrity: a changed ciphertext
//! decrypts to different plaintext, silently (docs/THREAT-MODEL.md).
//!
//! Each block (data unit) is encrypted where it lies, at its own length, with tweak = its block
//! number as a 128-bit little-endian integer; a last block of 16 bytes or more that is not a
//! multiple of 16 uses IEEE 1619 ciphertext stealing. XTS cannot encrypt fewer than 16 bytes:
//! a last block of 1..15 bytes is AES-256-CTR (NIST SP 800-38A) under a separate per-file key,
//! whose initial counter block (one keystream block is all it uses) is drawn at random for each
//! short block written and kept in the file's header xattr ([`Tail`]), so that no two short
//! blocks share a keystream, whatever an attacker copies between files. That keeps every block
//! independent of its neighbours (docs/FORMAT.md section 20).

use crate::crypto::keys::{label, HkdfKey};
use crate::crypto::locked::{scrubbed, LockedBox};
use crate::crypto::secret::SecretBytes;
use crate::crypto::xts::Xts256;
use crate::error::{Error, Result};
use crate::format::content::{FileHeader, FileId};
use aes::cipher::{KeyIvInit, StreamCipher};
use aes::Aes256;
use std::sync::Mutex;

/// Name in the volume config.
pub(super) const NAME: &str = "aes-256-xts";
/// The backing file's xattr that holds its header (version and file ID, `FileHeader`). The dots
/// keep it apart from every encrypted user xattr name, which is `user.` and base64url.
pub(super) const HEADER_XATTR: &str = "user.cloakfs.id";
/// Shortest data unit XTS encrypts (one AES block).
pub(super) const MIN_XTS_LEN: usize = 16;
/// Version of a header xattr that holds the tail's counter block: `u16be(2) || F || T`.
const TAIL_HEADER_VERSION: u16 = 2;

type Ctr = ctr::Ctr128BE<Aes256>;

/// One file's keys, in locked memory: the XTS key pair's two AES-256 schedules and the
/// AES-256 key of short blocks. The `aes` crate's zeroize feature wipes the schedules on drop.
/// With them, the counter block of the file's short last block (not secret: it is in the
/// header), which a writer changes while its blocks are open: the old short block is opened
/// under the old one, then the new one is drawn to seal it again.
pub(super) struct XtsKey {
    keys: LockedBox<Keys>,
    tail: Mutex<Tail>,
}

/// The initial counter block of a file's short last block (FORMAT.md section 20).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Tail {
    /// `u128le(n)` for block `n`: a header of version 1, which only files written before
    /// version 2 have; the next short block written draws a counter block.
    Position,
    /// `T`, drawn at random and kept in a header of version 2. `sealed`: a block may have
    /// been sealed under it, so the next short block needs a new one.
    Drawn { counter: [u8; 16], sealed: bool },
}

impl Tail {
    /// The same counter block, counted as sealed under.
    pub(super) fn sealed(self) -> Self {
        match self {
            Tail::Drawn { counter, .. } => Tail::Drawn {
                counter,
                sealed: true,
            },
            Tail::Position => Tail::Position,
        }
    }
}

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
        Self {
            keys: LockedBox::new(|| Keys {
                xts: Xts256::new(pair.expose()),
                short,
            }),
            tail: Mutex::new(Tail::Position),
        }
    }

    /// The counter block short blocks are sealed and opened with.
    pub(super) fn tail(&self) -> Tail {
        *self.tail.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn set_tail(&self, tail: Tail) {
        *self.tail.lock().unwrap_or_else(|e| e.into_inner()) = tail;
    }

    /// Before a block of `len` bytes is sealed: a short one gets a counter block that nothing
    /// was sealed under yet (blocks it replaces must be opened before). Returns whether one was
    /// drawn: the header must hold it before the block is written.
    pub(super) fn fresh_tail(&self, len: usize) -> bool {
        if len >= MIN_XTS_LEN {
            return false;
        }
        let mut tail = self.tail.lock().unwrap_or_else(|e| e.into_inner());
        let drawn = !matches!(*tail, Tail::Drawn { sealed: false, .. });
        if drawn {
            *tail = Tail::Drawn {
                counter: crate::crypto::random::array(),
                sealed: true,
            };
        }
        *tail = tail.sealed();
        drawn
    }

    /// Encrypts block `block` in place, at its length (at least 1 byte).
    pub(super) fn encrypt(&self, block: u64, data: &mut [u8]) {
        let keys = &*self.keys;
        if data.len() < MIN_XTS_LEN {
            keys.short_keystream(self.counter(block), data);
        } else {
            keys.xts.encrypt(block.into(), data);
        }
    }

    /// Decrypts block `block` in place.
    pub(super) fn decrypt(&self, block: u64, data: &mut [u8]) {
        let keys = &*self.keys;
        if data.len() < MIN_XTS_LEN {
            keys.short_keystream(self.counter(block), data);
        } else {
            keys.xts.decrypt(block.into(), data);
        }
    }

    /// The initial counter block of short block `block`.
    fn counter(&self, block: u64) -> [u8; 16] {
        match self.tail() {
            Tail::Position => tweak(block),
            Tail::Drawn { counter, .. } => counter,
        }
    }
}

impl Keys {
    /// The CTR key schedule is built on the stack for each short block (a last block under
    /// 16 bytes, so rare): in a frame of its own that is wiped afterwards.
    fn short_keystream(&self, counter: [u8; 16], data: &mut [u8]) {
        scrubbed(|| {
            let mut ctr = Ctr::new(self.short.expose().into(), &counter.into());
            ctr.apply_keystream(data);
        })
    }
}

/// The header xattr's value for file `id`: version 2 (`u16be(2) || F || T`) with a drawn
/// counter block, version 1 (`u16be(1) || F`) without.
pub(super) fn header_bytes(id: FileId, tail: Tail) -> Vec<u8> {
    match tail {
        Tail::Position => FileHeader { id }.to_bytes().to_vec(),
        Tail::Drawn { counter, .. } => [
            TAIL_HEADER_VERSION.to_be_bytes().as_slice(),
            &id.0,
            &counter,
        ]
        .concat(),
    }
}

/// Parses the header xattr's value (either version, of exactly its length); a counter block
/// read from disk counts as sealed under.
pub(super) fn parse_header(b: &[u8]) -> Result<(FileId, Tail)> {
    let malformed = || Error::Tampered(format!("file header ({HEADER_XATTR}) malformed"));
    let (&[v0, v1], rest) = b.split_first_chunk().ok_or_else(malformed)?;
    let (id, counter) = rest.split_first_chunk::<16>().ok_or_else(malformed)?;
    match u16::from_be_bytes([v0, v1]) {
        1 if counter.is_empty() => Ok((FileId(*id), Tail::Position)),
        TAIL_HEADER_VERSION => {
            let counter: [u8; 16] = counter.try_into().map_err(|_| malformed())?;
            Ok((
                FileId(*id),
                Tail::Drawn {
                    counter,
                    sealed: true,
                },
            ))
        }
        1 => Err(malformed()),
        found => Err(Error::UnsupportedVersion {
            what: "file header",
            found: found.into(),
            supported: TAIL_HEADER_VERSION.into(),
        }),
    }
}

/// The tweak (and, in a header of version 1, the initial counter block of a short block): the
/// block number as a 128-bit little-endian integer, as IEEE 1619 numbers data units.
fn tweak(block: u64) -> [u8; 16] {
    u128::from(block).to_le_bytes()
}
