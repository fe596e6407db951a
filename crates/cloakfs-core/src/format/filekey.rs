//! Where a file's content key comes from: the one seam between a file's header and its cipher.
//!
//! - [`FileKeySource::Derived`] (every volume but a sharing one): the key is
//!   HKDF(content key, "cloakfs v1 file" || file ID); the header is version 1, 18 bytes.
//! - [`FileKeySource::Wrapped`] (a sharing volume, `file_keys = "age"`): every file has its own
//!   random 32-byte file key `FK`, stored in its header once per recipient. An entry is a
//!   *recipient key* `W` sealed to the recipient's public key (an age file), and `FK` wrapped
//!   under `W` with AES-256-SIV (RFC 5297's key wrap), bound to the file ID. A mount makes one
//!   `W` per recipient and reuses it for every file it grants to that recipient, and a reader
//!   keeps every `W` it unsealed: the public-key operations are per recipient and mount, not
//!   per file. It also keeps the headers it verified, so that the same bytes read again open
//!   without a second check. The recipient list is authenticated by an HMAC keyed from `FK`. The header is
//!   [`SHARED_HEADER_LEN`] bytes, so that a file's plaintext size still follows from its
//!   backing length alone (stat and listing need no read). Version 2 headers (one age file of
//!   `FK` per entry) are still read; every header written is version 3.
//!
//! Block keys are HKDF(FK, "cloakfs v1 file" || file ID) exactly as for derived keys, with FK
//! in place of the volume's content key. docs/FORMAT.md section 18 has every byte.

use crate::crypto::keys::{label, HkdfKey};
use crate::crypto::secret::SecretBytes;
use crate::crypto::siv::SivKey;
use crate::error::{Error, Result};
use crate::format::content::{FileCipher, FileId};
use crate::format::layout::HEADER_LEN;
use crate::slots::gpg;
use crate::slots::recipient::{self, Identities, Loaded, Recipients};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};

/// Version of the header written for a file whose key is wrapped to recipients.
pub const SHARED_HEADER_VERSION: u16 = 3;
/// The earlier version, still read: each entry is an age file of the file key itself.
pub const SHARED_HEADER_V2: u16 = 2;
/// Length of that header (fixed per volume, zero-padded).
pub const SHARED_HEADER_LEN: u64 = 4096;
/// Bytes of the header before its entries: version, file ID, entry count.
const FIXED_LEN: usize = 2 + 16 + 2;
/// Length of the list MAC.
pub const LIST_MAC_LEN: usize = 32;
/// Length of the volume MAC that follows the list MAC on a volume with `shared_header_mac`.
pub const VOLUME_MAC_LEN: usize = 32;
/// First bytes of the volume MAC's input.
const VOLUME_MAC_DOMAIN: &[u8] = b"cloakfs shared header volume mac\n";
/// HKDF label of the list MAC key.
pub const LIST_LABEL: &str = "share-list";
/// Length of a recipient key `W` (an AES-256-SIV key).
pub const RECIPIENT_KEY_LEN: usize = 64;
/// Length of a file key wrapped under a recipient key: SIV tag and the 32 key bytes.
pub const WRAPPED_KEY_LEN: usize = 16 + 32;
/// Most recipient keys a reader keeps unsealed (a bound on what a hostile store can make it
/// hold; past it the cache starts again).
const MAX_UNSEALED: usize = 4096;
/// Most headers a reader keeps as verified (each up to [`SHARED_HEADER_LEN`] bytes).
const MAX_VERIFIED: usize = 1024;

/// How an entry's recipient key is sealed to its recipient (the entry's first byte).
pub mod kind {
    /// An age file (age-encryption.org/v1) with one stanza, for an `age1...` or ssh key.
    pub const AGE: u8 = 1;
    /// A binary OpenPGP message made by `gpg --encrypt`, for a `gpg:FINGERPRINT` recipient.
    pub const GPG: u8 = 2;
}

/// Prefix of a recipient line naming an OpenPGP key by its fingerprint (`gpg:` and 40
/// upper-case hex digits).
pub const GPG_PREFIX: &str = "gpg:";

/// The fingerprint of a `gpg:FINGERPRINT` recipient line (`None`: an age or ssh key).
pub fn gpg_fingerprint(line: &str) -> Option<&str> {
    line.trim().strip_prefix(GPG_PREFIX)
}

/// First bytes of the MAC input, per header version.
fn mac_domain(version: u16) -> &'static [u8] {
    if version == SHARED_HEADER_V2 {
        b"cloakfs shared header v2\n"
    } else {
        b"cloakfs shared header v3\n"
    }
}

/// How one entry holds the file key for its recipient.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wrap {
    /// Version 2: a binary age file whose plaintext is the file key.
    Direct {
        /// The age file.
        age: Vec<u8>,
    },
    /// Version 3: a recipient key sealed to the recipient, and the file key wrapped under it.
    Keyed {
        /// How `sealed` is sealed ([`kind`]); a kind this version does not know is kept and
        /// skipped when opening.
        kind: u8,
        /// The recipient key, sealed (for [`kind::AGE`]: a binary age file of 64 bytes).
        sealed: Vec<u8>,
        /// AES-256-SIV(W, header = file ID, FK).
        wrapped: [u8; WRAPPED_KEY_LEN],
    },
}

/// One recipient of a file: its public key as the user gave it, and the file key held for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// The public key, one line: `age1...`, an ssh public key, or `gpg:FINGERPRINT`.
    pub recipient: String,
    /// The file key, for this recipient.
    pub wrap: Wrap,
}

/// A parsed shared header. Parsing checks the layout only; the list is authentic only once
/// [`SharedHeader::verify`] accepted it under the file key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedHeader {
    /// [`SHARED_HEADER_VERSION`] or [`SHARED_HEADER_V2`].
    pub version: u16,
    /// The file's ID.
    pub id: FileId,
    /// Its recipients, in order.
    pub grants: Vec<Grant>,
    /// HMAC of everything before it, keyed from the file key.
    pub mac: [u8; LIST_MAC_LEN],
    /// HMAC of everything before it (the list MAC included) under the volume's header key,
    /// if the header carries one ([`HeaderMacKey`]).
    pub volume_mac: Option<[u8; VOLUME_MAC_LEN]>,
}

fn damaged(m: &str) -> Error {
    Error::Tampered(format!("shared file header: {m}"))
}

fn put_part(b: &mut Vec<u8>, part: &[u8]) -> Result<()> {
    let len = u16::try_from(part.len()).map_err(|_| too_many())?;
    b.extend_from_slice(&len.to_be_bytes());
    b.extend_from_slice(part);
    Ok(())
}

impl SharedHeader {
    /// The bytes the MAC covers (version through the last entry).
    fn body(version: u16, id: &FileId, grants: &[Grant]) -> Result<Vec<u8>> {
        let mut b = Vec::with_capacity(SHARED_HEADER_LEN as usize);
        b.extend_from_slice(&version.to_be_bytes());
        b.extend_from_slice(&id.0);
        let n = u16::try_from(grants.len()).map_err(|_| too_many())?;
        b.extend_from_slice(&n.to_be_bytes());
        for g in grants {
            match (&g.wrap, version) {
                (Wrap::Direct { age }, SHARED_HEADER_V2) => {
                    put_part(&mut b, g.recipient.as_bytes())?;
                    put_part(&mut b, age)?;
                }
                (
                    Wrap::Keyed {
                        kind,
                        sealed,
                        wrapped,
                    },
                    SHARED_HEADER_VERSION,
                ) => {
                    b.push(*kind);
                    put_part(&mut b, g.recipient.as_bytes())?;
                    put_part(&mut b, sealed)?;
                    b.extend_from_slice(wrapped);
                }
                _ => {
                    return Err(Error::Refused(format!(
                        "an entry of another kind in a version {version} file header"
                    )))
                }
            }
        }
        // Room for both MACs is kept in every header, so that `cloakfs upgrade` can add the
        // volume MAC to any header written before.
        if b.len() + LIST_MAC_LEN + VOLUME_MAC_LEN > SHARED_HEADER_LEN as usize {
            return Err(too_many());
        }
        Ok(b)
    }

    /// The list MAC of a `version` header of `id` and `grants` under file key `fk`.
    pub fn compute_mac(
        version: u16,
        fk: &[u8; 32],
        id: &FileId,
        grants: &[Grant],
    ) -> Result<[u8; 32]> {
        let body = Self::body(version, id, grants)?;
        let key: SecretBytes<32> = HkdfKey::new(None, fk).expand(LIST_LABEL.as_bytes(), &id.0);
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(key.expose()).expect("any key length");
        m.update(mac_domain(version));
        m.update(&body);
        Ok(m.finalize().into_bytes().into())
    }

    /// A version-3 header for `id` and `grants`, authenticated under `fk`.
    pub fn seal(fk: &[u8; 32], id: FileId, grants: Vec<Grant>) -> Result<Self> {
        Self::seal_version(SHARED_HEADER_VERSION, fk, id, grants)
    }

    /// A header of `version` for `id` and `grants`, authenticated under `fk` (version 2 is
    /// only made by tests and vectors of the older format).
    pub fn seal_version(
        version: u16,
        fk: &[u8; 32],
        id: FileId,
        grants: Vec<Grant>,
    ) -> Result<Self> {
        let mac = Self::compute_mac(version, fk, &id, &grants)?;
        Ok(Self {
            version,
            id,
            grants,
            mac,
            volume_mac: None,
        })
    }

    /// The bytes the volume MAC covers: everything up to the end of the list MAC.
    fn signed_bytes(&self) -> Result<Vec<u8>> {
        let mut b = Self::body(self.version, &self.id, &self.grants)?;
        b.extend_from_slice(&self.mac);
        Ok(b)
    }

    /// Serializes to exactly [`SHARED_HEADER_LEN`] bytes (the MACs, then zero padding).
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let mut b = self.signed_bytes()?;
        if let Some(v) = &self.volume_mac {
            b.extend_from_slice(v);
        }
        b.resize(SHARED_HEADER_LEN as usize, 0);
        Ok(b)
    }

    /// Offset of the volume MAC in the header's bytes (right after the list MAC).
    pub fn volume_mac_offset(&self) -> Result<u64> {
        Ok(self.signed_bytes()?.len() as u64)
    }

    /// Parses a header of [`SHARED_HEADER_LEN`] bytes (or more: the rest is ignored).
    pub fn parse(b: &[u8]) -> Result<Self> {
        if b.len() < SHARED_HEADER_LEN as usize {
            return Err(damaged("truncated"));
        }
        let b = &b[..SHARED_HEADER_LEN as usize];
        let version = u16::from_be_bytes([b[0], b[1]]);
        if version != SHARED_HEADER_VERSION && version != SHARED_HEADER_V2 {
            return Err(Error::UnsupportedVersion {
                what: "file header",
                found: version.into(),
                supported: SHARED_HEADER_VERSION.into(),
            });
        }
        let id = FileId(b[2..18].try_into().expect("16 bytes"));
        let n = u16::from_be_bytes([b[18], b[19]]) as usize;
        let mut at = FIXED_LEN;
        let fixed = |at: &mut usize, len: usize| -> Result<&[u8]> {
            let part = b
                .get(*at..*at + len)
                .ok_or_else(|| damaged("entry past the end"))?;
            *at += len;
            Ok(part)
        };
        let take = |at: &mut usize| -> Result<&[u8]> {
            let len = u16::from_be_bytes(fixed(at, 2)?.try_into().expect("2 bytes")) as usize;
            fixed(at, len)
        };
        let mut grants = Vec::with_capacity(n.min(64));
        for _ in 0..n {
            let kind = match version {
                SHARED_HEADER_V2 => None,
                _ => Some(fixed(&mut at, 1)?[0]),
            };
            let r = take(&mut at)?;
            let recipient = std::str::from_utf8(r)
                .ok()
                .filter(|s| !s.is_empty() && !s.contains('\n'))
                .ok_or_else(|| damaged("recipient is not one line of text"))?
                .to_string();
            let sealed = take(&mut at)?.to_vec();
            let wrap = match kind {
                None => Wrap::Direct { age: sealed },
                Some(kind) => Wrap::Keyed {
                    kind,
                    sealed,
                    wrapped: fixed(&mut at, WRAPPED_KEY_LEN)?
                        .try_into()
                        .expect("48 bytes"),
                },
            };
            grants.push(Grant { recipient, wrap });
        }
        let mac: [u8; LIST_MAC_LEN] = fixed(&mut at, LIST_MAC_LEN)
            .map_err(|_| damaged("MAC past the end"))?
            .try_into()
            .expect("32 bytes");
        // A volume MAC, where the volume has them, follows the list MAC; whether it must be
        // there, and whether it is right, is the volume's to check (HeaderMacKey::check).
        let volume_mac = b
            .get(at..at + VOLUME_MAC_LEN)
            .filter(|v| v.iter().any(|&x| x != 0))
            .map(|v| v.try_into().expect("32 bytes"));
        if volume_mac.is_some() {
            at += VOLUME_MAC_LEN;
        }
        if b[at..].iter().any(|&x| x != 0) {
            return Err(damaged("non-zero padding"));
        }
        Ok(Self {
            version,
            id,
            grants,
            mac,
            volume_mac,
        })
    }

    /// Checks the list MAC under `fk`.
    pub fn verify(&self, fk: &[u8; 32]) -> Result<()> {
        let want = Self::compute_mac(self.version, fk, &self.id, &self.grants)?;
        if subtle::ConstantTimeEq::ct_eq(&want[..], &self.mac[..]).into() {
            Ok(())
        } else {
            Err(damaged("recipient list failed authentication"))
        }
    }

    /// The recipients' public keys, in order.
    pub fn recipients(&self) -> Vec<String> {
        self.grants.iter().map(|g| g.recipient.clone()).collect()
    }
}

/// The volume's header key, HKDF(master key, "share-header"): only members hold it, so a header
/// that carries its MAC was made by a member, whoever can write the storage. `required`: the
/// volume has `shared_header_mac`, so a header without the MAC is refused (and every header
/// written carries one); otherwise headers are written without it, as by older versions, and
/// one that has it (written by `cloakfs upgrade` before it finished) is still checked.
pub struct HeaderMacKey {
    key: SecretBytes<32>,
    required: bool,
}

impl HeaderMacKey {
    /// The header key `key` of a volume that does (`required`) or does not yet have
    /// `shared_header_mac`.
    pub fn new(key: SecretBytes<32>, required: bool) -> Self {
        Self { key, required }
    }

    /// Whether every header must carry the volume MAC.
    pub fn required(&self) -> bool {
        self.required
    }

    /// The volume MAC of `h` (its bytes up to the end of the list MAC).
    pub fn compute(&self, h: &SharedHeader) -> Result<[u8; VOLUME_MAC_LEN]> {
        let mut m =
            <Hmac<Sha256> as Mac>::new_from_slice(self.key.expose()).expect("any key length");
        m.update(VOLUME_MAC_DOMAIN);
        m.update(&h.signed_bytes()?);
        Ok(m.finalize().into_bytes().into())
    }

    /// Checks `h`'s volume MAC: a wrong one is tampering, and so is a missing one where the
    /// volume requires it.
    pub fn check(&self, h: &SharedHeader) -> Result<()> {
        match &h.volume_mac {
            Some(v) => {
                let want = self.compute(h)?;
                if subtle::ConstantTimeEq::ct_eq(&want[..], &v[..]).into() {
                    Ok(())
                } else {
                    Err(damaged(
                        "it failed authentication under the volume key (made by someone \
                         who does not hold it)",
                    ))
                }
            }
            None if self.required => Err(damaged(
                "it has no volume MAC (made by someone who does not hold the volume key)",
            )),
            None => Ok(()),
        }
    }

    /// Gives `h` its volume MAC where the volume requires one.
    fn seal(&self, h: &mut SharedHeader) -> Result<()> {
        h.volume_mac = if self.required {
            Some(self.compute(h)?)
        } else {
            None
        };
        Ok(())
    }
}

/// Where a sharing volume keeps the IDs of files that `share remove` replaced (FORMAT.md section
/// 18.8): a header with such an ID is an older copy put back, refused so that a removed
/// member's key is never used for new data again. Implemented by `io::retired::RetiredIds`.
pub trait RetiredFiles: Send + Sync {
    /// Whether `id` was retired (here or, as far as this store knows, anywhere).
    fn is_retired(&self, id: &FileId) -> bool;
    /// Records that `id` is retired.
    fn retire(&self, id: &FileId) -> Result<()>;
}

fn rolled_back() -> Error {
    damaged(
        "its file ID was retired by `share remove` (an older copy of the file was put back: \
         a rollback)",
    )
}

/// A 32-byte file key out of decrypted bytes.
fn file_key_of(pt: &[u8]) -> Result<SecretBytes<32>> {
    let k: &[u8; 32] = pt
        .try_into()
        .map_err(|_| damaged("an entry does not hold a 32-byte key"))?;
    Ok(SecretBytes::from_slice(k))
}

/// A recipient key `W`, keyed for AES-256-SIV.
struct RecipientKey(SivKey);

impl RecipientKey {
    fn new(w: SecretBytes<RECIPIENT_KEY_LEN>) -> Self {
        Self(SivKey::new(w))
    }

    /// FK wrapped for file `id`.
    fn wrap(&self, id: &FileId, fk: &[u8; 32]) -> [u8; WRAPPED_KEY_LEN] {
        self.0
            .seal(&id.0, fk)
            .try_into()
            .expect("SIV of 32 bytes is 48")
    }

    /// FK of file `id`; a wrap that does not open is tampering (an entry moved in from another
    /// file, or forged), since `W` itself opened.
    fn unwrap(&self, id: &FileId, wrapped: &[u8; WRAPPED_KEY_LEN]) -> Result<SecretBytes<32>> {
        let pt = zeroize::Zeroizing::new(
            self.0
                .open(&id.0, wrapped)
                .ok_or_else(|| damaged("an entry's file key does not belong to this file"))?,
        );
        file_key_of(&pt)
    }
}

/// A recipient key this process made for one recipient, with its sealed form.
struct MadeKey {
    kind: u8,
    sealed: Vec<u8>,
    key: Arc<RecipientKey>,
}

/// A fresh recipient key sealed to `recipient_line`: the entry kind and the sealed bytes (for
/// a gpg key one `gpg --encrypt`).
fn make_recipient_key(
    recipient_line: &str,
    keyring: &gpg::Keyring,
) -> Result<(u8, Vec<u8>, SecretBytes<RECIPIENT_KEY_LEN>)> {
    let w = SecretBytes::<RECIPIENT_KEY_LEN>::random();
    if let Some(fpr) = gpg_fingerprint(recipient_line) {
        check_gpg_line(recipient_line)?;
        return Ok((
            kind::GPG,
            keyring.encrypt(&[fpr.to_string()], w.expose())?,
            w,
        ));
    }
    let r = Recipients::parse(recipient_line)?;
    Ok((kind::AGE, recipient::encrypt_bytes(&r, w.expose())?, w))
}

/// Checks a `gpg:FINGERPRINT` line.
fn check_gpg_line(line: &str) -> Result<()> {
    match gpg_fingerprint(line) {
        Some(fpr) if gpg::is_fingerprint(fpr) => Ok(()),
        _ => Err(Error::Refused(format!(
            "invalid gpg recipient {:?}: give gpg:FINGERPRINT (40 upper-case hex digits)",
            line.trim()
        ))),
    }
}

/// A grant of file `id`'s key `fk` to one recipient (one line of `slots add --recipient`
/// form), under a recipient key of its own (a gpg recipient's sealed with this process's
/// keyring).
pub fn grant(recipient_line: &str, id: &FileId, fk: &[u8; 32]) -> Result<Grant> {
    let line = recipient_line.trim();
    let (kind, sealed, w) = make_recipient_key(line, &gpg::Keyring::default())?;
    Ok(Grant {
        recipient: line.to_string(),
        wrap: Wrap::Keyed {
            kind,
            sealed,
            wrapped: RecipientKey::new(w).wrap(id, fk),
        },
    })
}

fn too_many() -> Error {
    Error::Refused(format!(
        "too many recipients: the list no longer fits the {SHARED_HEADER_LEN}-byte file header"
    ))
}

/// Whether two recipient lines name the same key (an ssh key's comment does not count).
pub fn same_key(a: &str, b: &str) -> bool {
    recipient::short_key(a) == recipient::short_key(b)
}

/// The recipient lines of `text` (one key per line; blank lines and `#` comments skipped),
/// each checked, each kept as given: age and ssh keys as `slots add --recipient` takes them,
/// and `gpg:FINGERPRINT` lines.
pub fn recipient_lines(text: &str) -> Result<Vec<String>> {
    let lines: Vec<String> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(String::from)
        .collect();
    let (gpg_lines, others): (Vec<&String>, Vec<&String>) =
        lines.iter().partition(|l| gpg_fingerprint(l).is_some());
    for l in gpg_lines {
        check_gpg_line(l)?;
    }
    if !others.is_empty() || lines.is_empty() {
        Recipients::parse(&others.iter().map(|l| format!("{l}\n")).collect::<String>())?;
    }
    Ok(lines)
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
    /// With `--gpg`: the fingerprints of the secret keys in the gpg keyring, whose entries
    /// (kind 2) `gpg --decrypt` opens.
    gpg_keys: Option<Vec<String>>,
    /// The gpg keyring the member's gpg operations use (decrypting its entries, sealing to
    /// gpg recipients).
    keyring: gpg::Keyring,
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
        let [recipient] = &recipient_lines(&recipient)?[..] else {
            return Err(Error::Refused(
                "a member owns new files with one public key".into(),
            ));
        };
        Ok(Self {
            identities,
            recipient: recipient.clone(),
            gpg_keys: None,
            keyring: gpg::Keyring::default(),
        })
    }

    /// The same member, using `keyring` for gpg (before [`Self::with_gpg`]).
    pub fn with_keyring(mut self, keyring: gpg::Keyring) -> Self {
        self.keyring = keyring;
        self
    }

    /// The member also opens gpg entries for the secret keys of the gpg keyring (one
    /// `gpg --list-secret-keys` now; each entry's message is decrypted through gpg-agent).
    pub fn with_gpg(mut self) -> Result<Self> {
        self.gpg_keys = Some(self.keyring.secret_fingerprints()?);
        Ok(self)
    }

    /// A member who has only the gpg keyring: the identities are empty, and new files are
    /// owned by `fingerprint` or else the keyring's one secret key that can decrypt.
    pub fn gpg_only(keyring: gpg::Keyring, fingerprint: Option<&str>) -> Result<Self> {
        let keys = keyring.secret_fingerprints()?;
        let own = match (fingerprint, &keys[..]) {
            (Some(f), _) if keys.iter().any(|k| k == f) => f.to_string(),
            (Some(f), _) => {
                return Err(Error::Refused(format!(
                    "the gpg keyring has no secret key {f} that can decrypt"
                )))
            }
            (None, [one]) => one.clone(),
            (None, []) => {
                return Err(Error::Refused(
                    "the gpg keyring has no secret key that can decrypt".into(),
                ))
            }
            (None, _) => {
                return Err(Error::Refused(format!(
                    "the gpg keyring has {} secret keys: say which one owns new files (give an \
                     --identity as well, or keep one secret key in this GNUPGHOME)",
                    keys.len()
                )))
            }
        };
        let m = Self::new(Identities::new(), format!("{GPG_PREFIX}{own}"))?;
        Ok(Self {
            gpg_keys: Some(keys),
            keyring,
            ..m
        })
    }

    /// Whether this member's gpg keyring holds the secret key of recipient line `line`.
    fn has_gpg_key(&self, line: &str) -> bool {
        let (Some(keys), Some(fpr)) = (&self.gpg_keys, gpg_fingerprint(line)) else {
            return false;
        };
        keys.iter().any(|k| k == fpr)
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
    Wrapped(Box<WrappedKeys>),
}

/// The state of [`FileKeySource::Derived`]: the volume's content key, extracted once.
pub struct DerivedKeys(pub(crate) HkdfKey);

/// The state of [`FileKeySource::Wrapped`]: who opens files, the file keys opened so far, and
/// the recipient keys made and unsealed so far (all in locked memory, for the life of the
/// codec: public-key operations are per recipient key, not per file).
pub struct WrappedKeys {
    member: Option<Member>,
    header_mac: HeaderMacKey,
    opened: Mutex<HashMap<FileId, SecretBytes<32>>>,
    /// Recipient keys this process made, by the recipient's short key.
    made: Mutex<HashMap<String, MadeKey>>,
    /// Recipient keys unsealed (or made for the member itself), by their sealed bytes.
    unsealed: Mutex<HashMap<Vec<u8>, Arc<RecipientKey>>>,
    /// Headers opened so far, by file ID: their bytes up to the MAC, and what they opened to.
    verified: Mutex<HashMap<FileId, Verified>>,
    unwraps: std::sync::atomic::AtomicU64,
    /// IDs this process retired, and the volume's record of retired IDs, once attached.
    retired_here: Mutex<HashSet<FileId>>,
    retired: OnceLock<Arc<dyn RetiredFiles>>,
}

/// A header that was parsed and verified, and what it yielded: the same bytes again (an open
/// of the same file, unchanged) yield the same without the parse, the list MAC and the
/// key derivations.
struct Verified {
    bytes: Box<[u8]>,
    block_key: SecretBytes<32>,
    recipients: Vec<String>,
}

fn locked<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn no_member() -> Error {
    Error::AccessDenied("the volume was opened without a member identity".into())
}

impl WrappedKeys {
    /// Keys opened by `member` (`None`: every shared file is refused), headers authenticated
    /// under `header_mac`.
    pub fn new(member: Option<Member>, header_mac: HeaderMacKey) -> Self {
        Self {
            member,
            header_mac,
            opened: Mutex::new(HashMap::new()),
            made: Mutex::new(HashMap::new()),
            unsealed: Mutex::new(HashMap::new()),
            verified: Mutex::new(HashMap::new()),
            unwraps: Default::default(),
            retired_here: Mutex::new(HashSet::new()),
            retired: OnceLock::new(),
        }
    }

    /// Checks file IDs against `store` from now on (the first store attached stays).
    pub fn keep_retired_in(&self, store: Arc<dyn RetiredFiles>) {
        let _ = self.retired.set(store);
    }

    fn is_retired(&self, id: &FileId) -> bool {
        locked(&self.retired_here).contains(id)
            || self.retired.get().is_some_and(|r| r.is_retired(id))
    }

    /// Retires file `id` (it was just replaced by `share remove`): it no longer opens here,
    /// and, with a store attached, in any mount that sees the store's record.
    pub fn retire(&self, id: FileId) -> Result<()> {
        locked(&self.retired_here).insert(id);
        locked(&self.opened).remove(&id);
        locked(&self.verified).remove(&id);
        match self.retired.get() {
            Some(r) => r.retire(&id),
            None => Ok(()),
        }
    }

    /// The member files are opened as.
    pub fn member(&self) -> Option<&Member> {
        self.member.as_ref()
    }

    /// The volume's header key.
    pub fn header_mac(&self) -> &HeaderMacKey {
        &self.header_mac
    }

    /// Parses header `b`, checks its volume MAC ([`HeaderMacKey::check`]) and that its file ID
    /// is not retired ([`RetiredFiles`]); the recipient list is checked under the file key by
    /// [`WrappedKeys::file_key`].
    pub fn parse_header(&self, b: &[u8]) -> Result<SharedHeader> {
        let h = SharedHeader::parse(b)?;
        self.header_mac.check(&h)?;
        if self.is_retired(&h.id) {
            return Err(rolled_back());
        }
        Ok(h)
    }

    /// A version-3 header of `id` granted by `grants`, under file key `fk` and, where the
    /// volume requires it, the volume's header key.
    pub fn seal_header(
        &self,
        fk: &[u8; 32],
        id: FileId,
        grants: Vec<Grant>,
    ) -> Result<SharedHeader> {
        let mut h = SharedHeader::seal(fk, id, grants)?;
        self.header_mac.seal(&mut h)?;
        Ok(h)
    }

    /// How many public-key decryptions were done (an entry's age file or gpg message opened).
    pub fn unwrap_count(&self) -> u64 {
        self.unwraps.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The block key and recipients of header `b`, if exactly these bytes were verified
    /// before (by [`WrappedKeys::keep_verified`]), with the file ID.
    pub fn recall_verified(&self, b: &[u8]) -> Option<(FileId, SecretBytes<32>, Vec<String>)> {
        let id = FileId(b.get(2..18)?.try_into().ok()?);
        if self.is_retired(&id) {
            return None;
        }
        let known = locked(&self.verified);
        let v = known.get(&id)?;
        let n = v.bytes.len();
        let same = b.len() == SHARED_HEADER_LEN as usize
            && b[..n] == v.bytes[..]
            && b[n..].iter().all(|&x| x == 0);
        same.then(|| (id, v.block_key.clone(), v.recipients.clone()))
    }

    /// Keeps header `b` of file `id`, just verified, and what it yielded.
    pub fn keep_verified(
        &self,
        b: &[u8],
        id: FileId,
        block_key: &SecretBytes<32>,
        recipients: &[String],
    ) {
        // The bytes up to the MAC: the rest is zeros (parse checked).
        let end = b[..SHARED_HEADER_LEN as usize]
            .iter()
            .rposition(|&x| x != 0)
            .map_or(0, |i| i + 1);
        let mut known = locked(&self.verified);
        if known.len() >= MAX_VERIFIED {
            known.clear();
        }
        known.insert(
            id,
            Verified {
                bytes: b[..end].into(),
                block_key: block_key.clone(),
                recipients: recipients.to_vec(),
            },
        );
    }

    /// The authenticated file key of `h`: from the cache, else unwrapped with the member's
    /// identities. An error if the member has no entry (EACCES) or the list is forged.
    pub fn file_key(&self, h: &SharedHeader) -> Result<SecretBytes<32>> {
        let cached = locked(&self.opened)
            .get(&h.id)
            .map(|k| SecretBytes::from_slice(k.expose()));
        let fk = match cached {
            Some(k) => k,
            None => self.unwrap_key(h)?.ok_or_else(|| {
                Error::AccessDenied("the file is not shared with this identity".into())
            })?,
        };
        h.verify(fk.expose())?;
        locked(&self.opened)
            .entry(h.id)
            .or_insert_with(|| SecretBytes::from_slice(fk.expose()));
        Ok(fk)
    }

    /// The file key from the first entry the member can open (`None` if no entry is theirs):
    /// first an entry under a recipient key already unsealed, then the member's own entries,
    /// then the rest (an identity may belong to another line). The list is not yet verified.
    fn unwrap_key(&self, h: &SharedHeader) -> Result<Option<SecretBytes<32>>> {
        for g in &h.grants {
            if let Wrap::Keyed {
                sealed, wrapped, ..
            } = &g.wrap
            {
                let known = locked(&self.unsealed).get(sealed).cloned();
                if let Some(key) = known {
                    return key.unwrap(&h.id, wrapped).map(Some);
                }
            }
        }
        let member = self.member.as_ref().ok_or_else(no_member)?;
        let (own, others): (Vec<&Grant>, Vec<&Grant>) = h
            .grants
            .iter()
            .partition(|g| same_key(&g.recipient, &member.recipient));
        for g in own.into_iter().chain(others) {
            let (kind, sealed, wrapped) = match &g.wrap {
                Wrap::Keyed {
                    kind,
                    sealed,
                    wrapped,
                } => (*kind, sealed, Some(wrapped)),
                Wrap::Direct { age } => (kind::AGE, age, None),
            };
            let pt = match kind {
                kind::AGE if !member.identities.is_empty() => {
                    self.unwraps
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    match recipient::decrypt(sealed, &member.identities) {
                        Ok(Some(pt)) => pt,
                        Ok(None) => continue,
                        // An entry that is not an age file at all: damaged (or forged).
                        Err(Error::ConfigDamaged(m)) => return Err(damaged(&m)),
                        Err(e) => return Err(e),
                    }
                }
                kind::GPG if member.has_gpg_key(&g.recipient) => {
                    self.unwraps
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    match member.keyring.decrypt(sealed) {
                        Ok(pt) => pt,
                        // The agent could not (or would not) use the key: not this reader's.
                        Err(gpg::DecryptError::Failed(_)) => continue,
                        Err(gpg::DecryptError::NotPublicKey(what)) => {
                            return Err(damaged(&format!("a gpg entry is refused: {what}")))
                        }
                        Err(gpg::DecryptError::Run(e)) => return Err(e),
                    }
                }
                _ => continue,
            };
            let Some(wrapped) = wrapped else {
                return file_key_of(&pt).map(Some);
            };
            let w: &[u8; RECIPIENT_KEY_LEN] = pt[..]
                .try_into()
                .map_err(|_| damaged("an entry does not hold a 64-byte recipient key"))?;
            let key = Arc::new(RecipientKey::new(SecretBytes::from_slice(w)));
            self.keep_unsealed(sealed.clone(), key.clone());
            return key.unwrap(&h.id, wrapped).map(Some);
        }
        Ok(None)
    }

    fn keep_unsealed(&self, sealed: Vec<u8>, key: Arc<RecipientKey>) {
        let mut u = locked(&self.unsealed);
        if u.len() >= MAX_UNSEALED {
            u.clear();
        }
        u.insert(sealed, key);
    }

    /// Grants of file `id`'s key `fk` to `recipients` (lines of `slots add --recipient` form),
    /// each under this process's recipient key for that recipient, made (one public-key
    /// operation) the first time the recipient is granted anything.
    pub fn seal_grants(
        &self,
        id: &FileId,
        fk: &[u8; 32],
        recipients: &[String],
    ) -> Result<Vec<Grant>> {
        recipients
            .iter()
            .map(|line| {
                let line = line.trim();
                let short = recipient::short_key(line);
                let known = locked(&self.made)
                    .get(&short)
                    .map(|m| (m.kind, m.sealed.clone(), m.key.clone()));
                let (kind, sealed, key) = match known {
                    Some(k) => k,
                    None => {
                        let keyring = self.member.as_ref().map(|m| &m.keyring);
                        let (kind, sealed, w) =
                            make_recipient_key(line, keyring.unwrap_or(&gpg::Keyring::default()))?;
                        let key = Arc::new(RecipientKey::new(w));
                        // The member's own key opens its own files without unsealing.
                        if self
                            .member
                            .as_ref()
                            .is_some_and(|m| same_key(&m.recipient, line))
                        {
                            self.keep_unsealed(sealed.clone(), key.clone());
                        }
                        let mut made = locked(&self.made);
                        let m = made.entry(short).or_insert(MadeKey { kind, sealed, key });
                        (m.kind, m.sealed.clone(), m.key.clone())
                    }
                };
                Ok(Grant {
                    recipient: line.to_string(),
                    wrap: Wrap::Keyed {
                        kind,
                        sealed,
                        wrapped: key.wrap(id, fk),
                    },
                })
            })
            .collect()
    }

    /// A fresh file key for a new file `id`, and its header granted to `recipients` (else
    /// the member).
    pub fn new_file(
        &self,
        id: FileId,
        recipients: &[String],
    ) -> Result<(SharedHeader, SecretBytes<32>, Vec<String>)> {
        let recipients = if recipients.is_empty() {
            vec![self
                .member
                .as_ref()
                .ok_or_else(no_member)?
                .recipient
                .clone()]
        } else {
            recipients.to_vec()
        };
        let fk = random_file_key();
        let grants = self.seal_grants(&id, fk.expose(), &recipients)?;
        let header = self.seal_header(fk.expose(), id, grants)?;
        self.remember(id, &fk);
        Ok((header, fk, recipients))
    }

    /// Grants a file to `more` recipients (lines of `slots add --recipient` form; keys it has
    /// already are skipped): from its header `header`, or, for a file without one (no data),
    /// a fresh header granted to `current` (else the member) and `more`. A version-2 header
    /// comes back as version 3. Returns the new header, its recipients, and how many were
    /// added.
    pub fn regrant(
        &self,
        header: Option<&[u8]>,
        current: &[String],
        more: &[String],
    ) -> Result<(Vec<u8>, Vec<String>, usize)> {
        let (id, fk, mut grants) = match header {
            Some(b) => {
                let h = self.parse_header(b)?;
                let fk = self.file_key(&h)?;
                let grants = match h.version {
                    SHARED_HEADER_V2 => self.seal_grants(&h.id, fk.expose(), &h.recipients())?,
                    _ => h.grants,
                };
                (h.id, fk, grants)
            }
            None => {
                let (h, fk, _) = self.new_file(FileId::random(), current)?;
                (h.id, fk, h.grants)
            }
        };
        let new: Vec<String> = more
            .iter()
            .filter(|r| !grants.iter().any(|g| same_key(&g.recipient, r)))
            .cloned()
            .collect();
        grants.extend(self.seal_grants(&id, fk.expose(), &new)?);
        let recipients = grants.iter().map(|g| g.recipient.clone()).collect();
        let h = self.seal_header(fk.expose(), id, grants)?;
        Ok((
            h.to_bytes()?,
            recipients,
            new.len() + usize::from(header.is_none()),
        ))
    }

    /// Remembers a file key this process made (a new file, a re-keyed one).
    pub fn remember(&self, id: FileId, fk: &SecretBytes<32>) {
        locked(&self.opened).insert(id, SecretBytes::from_slice(fk.expose()));
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
