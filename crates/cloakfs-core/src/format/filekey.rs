//! Where a file's content key comes from: the one seam between a file's header and its cipher.
//!
//! - [`FileKeySource::Derived`] (every volume but a sharing one): the key is
//!   HKDF(content key, "cloakfs v1 file" || file ID); the header is version 1, 18 bytes.
//! - [`FileKeySource::Wrapped`] (a sharing volume, `file_keys = "age"`): every file has its own
//!   random 32-byte file key `FK`, stored in its header once per recipient, each as a
//!   one-recipient age file; the recipient list is authenticated by an HMAC keyed from `FK`.
//!   The header is version 2, [`SHARED_HEADER_LEN`] bytes, so that a file's plaintext size
//!   still follows from its backing length alone (stat and listing need no read).
//!
//! Block keys are HKDF(FK, "cloakfs v1 file" || file ID) exactly as for derived keys, with FK
//! in place of the volume's content key. docs/FORMAT.md section 18 has every byte.

use crate::crypto::keys::{label, HkdfKey};
use crate::crypto::secret::SecretBytes;
use crate::error::{Error, Result};
use crate::format::content::{FileCipher, FileId};
use crate::format::layout::HEADER_LEN;
use crate::slots::recipient::{self, Identities, Loaded, Recipients};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::collections::HashMap;
use std::sync::Mutex;

/// Version of the header of a file whose key is wrapped to recipients.
pub const SHARED_HEADER_VERSION: u16 = 2;
/// Length of that header (fixed per volume, zero-padded).
pub const SHARED_HEADER_LEN: u64 = 4096;
/// Bytes of the header before its entries: version, file ID, entry count.
const FIXED_LEN: usize = 2 + 16 + 2;
/// Length of the list MAC.
pub const LIST_MAC_LEN: usize = 32;
/// HKDF label of the list MAC key.
pub const LIST_LABEL: &str = "share-list";
/// First bytes of the MAC input.
const MAC_DOMAIN: &[u8] = b"cloakfs shared header v2\n";

/// One recipient of a file: its public key as the user gave it, and the file key encrypted to
/// it (a binary age file with exactly this recipient).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// The public key, one line: `age1...` or an ssh public key.
    pub recipient: String,
    /// The binary age file whose plaintext is the file key.
    pub age: Vec<u8>,
}

/// A parsed version-2 header. Parsing checks the layout only; the list is authentic only once
/// [`SharedHeader::verify`] accepted it under the file key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedHeader {
    /// The file's ID.
    pub id: FileId,
    /// Its recipients, in order.
    pub grants: Vec<Grant>,
    /// HMAC of everything before it, keyed from the file key.
    pub mac: [u8; LIST_MAC_LEN],
}

fn damaged(m: &str) -> Error {
    Error::Tampered(format!("shared file header: {m}"))
}

impl SharedHeader {
    /// The bytes the MAC covers (version through the last entry).
    fn body(id: &FileId, grants: &[Grant]) -> Result<Vec<u8>> {
        let mut b = Vec::with_capacity(SHARED_HEADER_LEN as usize);
        b.extend_from_slice(&SHARED_HEADER_VERSION.to_be_bytes());
        b.extend_from_slice(&id.0);
        let n = u16::try_from(grants.len()).map_err(|_| too_many())?;
        b.extend_from_slice(&n.to_be_bytes());
        for g in grants {
            for part in [g.recipient.as_bytes(), &g.age[..]] {
                let len = u16::try_from(part.len()).map_err(|_| too_many())?;
                b.extend_from_slice(&len.to_be_bytes());
                b.extend_from_slice(part);
            }
        }
        if b.len() + LIST_MAC_LEN > SHARED_HEADER_LEN as usize {
            return Err(too_many());
        }
        Ok(b)
    }

    /// The list MAC of `id` and `grants` under file key `fk`.
    pub fn compute_mac(fk: &[u8; 32], id: &FileId, grants: &[Grant]) -> Result<[u8; 32]> {
        let body = Self::body(id, grants)?;
        let key: SecretBytes<32> = HkdfKey::new(None, fk).expand(LIST_LABEL.as_bytes(), &id.0);
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(key.expose()).expect("any key length");
        m.update(MAC_DOMAIN);
        m.update(&body);
        Ok(m.finalize().into_bytes().into())
    }

    /// A header for `id` and `grants`, authenticated under `fk`.
    pub fn seal(fk: &[u8; 32], id: FileId, grants: Vec<Grant>) -> Result<Self> {
        let mac = Self::compute_mac(fk, &id, &grants)?;
        Ok(Self { id, grants, mac })
    }

    /// Serializes to exactly [`SHARED_HEADER_LEN`] bytes (zero padding after the MAC).
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let mut b = Self::body(&self.id, &self.grants)?;
        b.extend_from_slice(&self.mac);
        b.resize(SHARED_HEADER_LEN as usize, 0);
        Ok(b)
    }

    /// Parses a header of [`SHARED_HEADER_LEN`] bytes (or more: the rest is ignored).
    pub fn parse(b: &[u8]) -> Result<Self> {
        if b.len() < SHARED_HEADER_LEN as usize {
            return Err(damaged("truncated"));
        }
        let b = &b[..SHARED_HEADER_LEN as usize];
        let version = u16::from_be_bytes([b[0], b[1]]);
        if version != SHARED_HEADER_VERSION {
            return Err(Error::UnsupportedVersion {
                what: "file header",
                found: version.into(),
                supported: SHARED_HEADER_VERSION.into(),
            });
        }
        let id = FileId(b[2..18].try_into().expect("16 bytes"));
        let n = u16::from_be_bytes([b[18], b[19]]) as usize;
        let mut at = FIXED_LEN;
        let take = |at: &mut usize| -> Result<&[u8]> {
            let len_end = *at + 2;
            let len = u16::from_be_bytes(
                b.get(*at..len_end)
                    .ok_or_else(|| damaged("entry past the end"))?
                    .try_into()
                    .expect("2 bytes"),
            ) as usize;
            let part = b
                .get(len_end..len_end + len)
                .ok_or_else(|| damaged("entry past the end"))?;
            *at = len_end + len;
            Ok(part)
        };
        let mut grants = Vec::with_capacity(n.min(64));
        for _ in 0..n {
            let r = take(&mut at)?;
            let recipient = std::str::from_utf8(r)
                .ok()
                .filter(|s| !s.is_empty() && !s.contains('\n'))
                .ok_or_else(|| damaged("recipient is not one line of text"))?
                .to_string();
            let age = take(&mut at)?.to_vec();
            grants.push(Grant { recipient, age });
        }
        let mac: [u8; LIST_MAC_LEN] = b
            .get(at..at + LIST_MAC_LEN)
            .ok_or_else(|| damaged("MAC past the end"))?
            .try_into()
            .expect("32 bytes");
        if b[at + LIST_MAC_LEN..].iter().any(|&x| x != 0) {
            return Err(damaged("non-zero padding"));
        }
        Ok(Self { id, grants, mac })
    }

    /// Checks the list MAC under `fk`.
    pub fn verify(&self, fk: &[u8; 32]) -> Result<()> {
        let want = Self::compute_mac(fk, &self.id, &self.grants)?;
        if subtle::ConstantTimeEq::ct_eq(&want[..], &self.mac[..]).into() {
            Ok(())
        } else {
            Err(damaged("recipient list failed authentication"))
        }
    }

    /// The file key from the first entry `ids` can open (`None` if no entry is theirs). The
    /// list is not yet verified.
    pub fn unwrap_key(&self, ids: &Identities) -> Result<Option<SecretBytes<32>>> {
        for g in &self.grants {
            match recipient::decrypt(&g.age, ids) {
                Ok(Some(pt)) => {
                    let k: &[u8; 32] = pt[..]
                        .try_into()
                        .map_err(|_| damaged("an entry does not hold a 32-byte key"))?;
                    return Ok(Some(SecretBytes::from_slice(k)));
                }
                Ok(None) => {}
                // An entry that is not an age file at all: damaged (or forged).
                Err(Error::ConfigDamaged(m)) => return Err(damaged(&m)),
                Err(e) => return Err(e),
            }
        }
        Ok(None)
    }
}

fn too_many() -> Error {
    Error::Refused(format!(
        "too many recipients: the list no longer fits the {SHARED_HEADER_LEN}-byte file header"
    ))
}

/// A grant of `fk` to one recipient (one line of `slots add --recipient` form).
pub fn grant(recipient_line: &str, fk: &[u8; 32]) -> Result<Grant> {
    let line = recipient_line.trim();
    let r = Recipients::parse(line)?;
    let key = crate::slots::Kek::from_slice(fk);
    Ok(Grant {
        recipient: line.to_string(),
        age: recipient::encrypt(&r, &key)?,
    })
}

/// Whether two recipient lines name the same key (an ssh key's comment does not count).
pub fn same_key(a: &str, b: &str) -> bool {
    recipient::short_key(a) == recipient::short_key(b)
}

/// The recipient lines of `text` (one key per line; blank lines and `#` comments skipped),
/// each checked, each kept as given.
pub fn recipient_lines(text: &str) -> Result<Vec<String>> {
    Recipients::parse(text)?;
    Ok(text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(String::from)
        .collect())
}

/// Callbacks for identities loaded where there is no terminal: every question goes unanswered.
#[derive(Clone, Copy)]
struct NoPrompt;

impl age::Callbacks for NoPrompt {
    fn display_message(&self, _message: &str) {}

    fn confirm(&self, _message: &str, _yes: &str, _no: Option<&str>) -> Option<bool> {
        None
    }

    fn request_public_string(&self, _description: &str) -> Option<String> {
        None
    }

    fn request_passphrase(&self, _description: &str) -> Option<age::secrecy::SecretString> {
        None
    }
}

/// The member a sharing volume is opened as: identities to unwrap file keys with, and the
/// public key every file it creates is granted to.
pub struct Member {
    identities: Identities,
    recipient: String,
}

impl std::fmt::Debug for Member {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Member")
            .field("recipient", &self.recipient)
            .finish_non_exhaustive()
    }
}

impl Member {
    /// A member with these identities, granting new files to `recipient`.
    pub fn new(identities: Identities, recipient: String) -> Result<Self> {
        Recipients::parse(&recipient)?;
        Ok(Self {
            identities,
            recipient: recipient.trim().to_string(),
        })
    }

    /// A member from the texts of its identity files, where nobody can be asked for a
    /// passphrase (the multi-user daemon): a passphrase-protected ssh key is refused.
    /// `texts` pairs each text with the name its errors give.
    pub fn from_texts(texts: &[(String, &[u8])], recipient: String) -> Result<Self> {
        let mut identities = Identities::new();
        for (name, text) in texts {
            if identities.add_file(text, name, NoPrompt)? == Loaded::EncryptedSsh {
                return Err(Error::Refused(format!(
                    "identity file {name} is a passphrase-protected ssh key, whose passphrase \
                     cannot be asked for there: use an age identity or an ssh key without one"
                )));
            }
        }
        Self::new(identities, recipient)
    }

    /// The member's own public key.
    pub fn recipient(&self) -> &str {
        &self.recipient
    }

    /// The member's identities.
    pub fn identities(&self) -> &Identities {
        &self.identities
    }
}

/// What a file's header yields: its cipher, and (for a shared file) its recipients, which a
/// fresh header of the same file keeps.
pub struct OpenedHeader {
    /// The file's cipher.
    pub cipher: FileCipher,
    /// The recipients' public keys (empty for a file with a derived key).
    pub recipients: Vec<String>,
}

/// Where file keys come from (see the module documentation).
pub enum FileKeySource {
    /// HKDF of the volume's content key (extracted once) and the file ID.
    Derived(DerivedKeys),
    /// Random per file, wrapped to recipients in the header.
    Wrapped(WrappedKeys),
}

/// The state of [`FileKeySource::Derived`]: the volume's content key, extracted once.
pub struct DerivedKeys(pub(crate) HkdfKey);

/// The state of [`FileKeySource::Wrapped`]: who opens files, and the file keys opened so far
/// (in locked memory, for the life of the codec: one public-key operation per file).
pub struct WrappedKeys {
    member: Option<Member>,
    opened: Mutex<HashMap<FileId, SecretBytes<32>>>,
    unwraps: std::sync::atomic::AtomicU64,
}

impl WrappedKeys {
    /// Keys opened by `member` (`None`: every shared file is refused).
    pub fn new(member: Option<Member>) -> Self {
        Self {
            member,
            opened: Mutex::new(HashMap::new()),
            unwraps: Default::default(),
        }
    }

    /// The member files are opened as.
    pub fn member(&self) -> Option<&Member> {
        self.member.as_ref()
    }

    /// How many public-key unwraps were done (each opened file once).
    pub fn unwrap_count(&self) -> u64 {
        self.unwraps.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The authenticated file key of `h`: from the cache, else unwrapped with the member's
    /// identities. An error if the member has no entry (EACCES) or the list is forged.
    pub fn file_key(&self, h: &SharedHeader) -> Result<SecretBytes<32>> {
        let cached = self
            .opened
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&h.id)
            .map(|k| SecretBytes::from_slice(k.expose()));
        let fk = match cached {
            Some(k) => k,
            None => {
                let member = self.member.as_ref().ok_or_else(|| {
                    Error::AccessDenied("the volume was opened without a member identity".into())
                })?;
                self.unwraps
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                h.unwrap_key(&member.identities)?.ok_or_else(|| {
                    Error::AccessDenied("the file is not shared with this identity".into())
                })?
            }
        };
        h.verify(fk.expose())?;
        self.opened
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(h.id)
            .or_insert_with(|| SecretBytes::from_slice(fk.expose()));
        Ok(fk)
    }

    /// Grants a file to `more` recipients (lines of `slots add --recipient` form; keys it has
    /// already are skipped): from its header `header`, or, for a file without one (no data),
    /// a fresh header granted to `current` (else the member) and `more`. Returns the new
    /// header, its recipients, and how many were added.
    pub fn regrant(
        &self,
        header: Option<&[u8]>,
        current: &[String],
        more: &[String],
    ) -> Result<(Vec<u8>, Vec<String>, usize)> {
        let (id, fk, mut grants) = match header {
            Some(b) => {
                let h = SharedHeader::parse(b)?;
                let fk = self.file_key(&h)?;
                (h.id, fk, h.grants)
            }
            None => {
                let fk = random_file_key();
                let id = FileId::random();
                let base = if current.is_empty() {
                    let m = self.member.as_ref().ok_or_else(|| {
                        Error::AccessDenied(
                            "the volume was opened without a member identity".into(),
                        )
                    })?;
                    vec![m.recipient.clone()]
                } else {
                    current.to_vec()
                };
                let grants = base
                    .iter()
                    .map(|r| grant(r, fk.expose()))
                    .collect::<Result<Vec<_>>>()?;
                self.remember(id, &fk);
                (id, fk, grants)
            }
        };
        let mut added = 0;
        for r in more {
            if grants.iter().any(|g| same_key(&g.recipient, r)) {
                continue;
            }
            grants.push(grant(r, fk.expose())?);
            added += 1;
        }
        let recipients = grants.iter().map(|g| g.recipient.clone()).collect();
        let h = SharedHeader::seal(fk.expose(), id, grants)?;
        Ok((
            h.to_bytes()?,
            recipients,
            added + usize::from(header.is_none()),
        ))
    }

    /// Remembers a file key this process made (a new file, a re-keyed one).
    pub fn remember(&self, id: FileId, fk: &SecretBytes<32>) {
        self.opened
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, SecretBytes::from_slice(fk.expose()));
    }
}

impl std::fmt::Debug for FileKeySource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FileKeySource::Derived(_) => f.write_str("Derived"),
            FileKeySource::Wrapped(w) => write!(f, "Wrapped({:?})", w.member),
        }
    }
}

impl FileKeySource {
    /// Length of every header this source reads and writes.
    pub fn header_len(&self) -> u64 {
        match self {
            FileKeySource::Derived(_) => HEADER_LEN,
            FileKeySource::Wrapped(_) => SHARED_HEADER_LEN,
        }
    }

    /// Whether file keys are wrapped to recipients (a sharing volume).
    pub fn is_wrapped(&self) -> bool {
        matches!(self, FileKeySource::Wrapped(_))
    }

    /// Whether a file's header must be opened when the file is (access is decided by it).
    pub fn opens_at_open(&self) -> bool {
        self.is_wrapped()
    }

    /// The per-file key a cipher for file `id` is expanded from, given the file key (or,
    /// derived, the volume's content key) extracted as `ikm`.
    pub(crate) fn block_key(ikm: &HkdfKey, id: &FileId) -> SecretBytes<32> {
        ikm.expand(label::FILE.as_bytes(), &id.0)
    }
}

/// A fresh file key: random, in locked memory.
pub fn random_file_key() -> SecretBytes<32> {
    SecretBytes::random()
}
