//! Name encryption: AES-256-SIV (RFC 5297) bound to a per-directory ID, base64url-encoded.
//!
//! `encrypted = base64url(SIV(names key, headers = [dir ID], plaintext name))`, where the SIV
//! output is the 16-byte synthetic IV followed by the ciphertext. Deterministic within a
//! directory (lookups need no listing), different across directories, and authenticated: a
//! tampered name, a name moved from another directory or another volume fails to decrypt.
//!
//! An encrypted name longer than the volume's `long_name_max` is stored as
//! `cloakfs.long.<base64url(SHA-256(encrypted))>`, with the full encrypted name in a sidecar file
//! of the same name plus `.name`.

use crate::crypto::secret::SecretBytes;
use crate::crypto::siv::SivKey;
use crate::error::{Error, Result};
use crate::text::{b64, unb64};
use sha2::{Digest, Sha256};

/// Longest plaintext name (bytes), as on Linux file systems.
pub const NAME_MAX: usize = 255;
/// Name of the file holding a directory's ID (every directory but the root).
pub const DIRID_FILE: &str = "cloakfs.dirid";
/// Prefix of long-name backing entries.
pub const LONG_PREFIX: &str = "cloakfs.long.";
/// Suffix of a long name's sidecar file.
pub const LONG_SIDECAR_SUFFIX: &str = ".name";
/// Prefix shared by every name cloakfs reserves in the cipher directory.
pub const RESERVED_PREFIX: &str = "cloakfs.";
/// Default and largest `long_name_max`.
pub const LONG_NAME_MAX_DEFAULT: usize = 255;
/// Smallest `long_name_max` (a long-name entry itself is 56 bytes).
pub const LONG_NAME_MAX_MIN: usize = 62;
/// Largest sidecar file read: one encrypted name (at most 362 bytes) with room to spare. A
/// larger (planted) sidecar is refused without being read into memory.
pub const SIDECAR_MAX: usize = 4096;

/// A directory's random 128-bit ID; names inside it are bound to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DirId(pub [u8; 16]);

impl DirId {
    /// A fresh random directory ID.
    pub fn random() -> Self {
        Self(crate::crypto::random::array())
    }
}

/// How an encrypted name is stored in the backing directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoredName {
    /// The encrypted name is the backing name.
    Short(String),
    /// The backing name is a hash; `full` goes into the sidecar file `<backing>.name`.
    Long {
        /// `cloakfs.long.<hash>`.
        backing: String,
        /// The full encrypted name.
        full: String,
    },
}

impl StoredName {
    /// The name of the entry in the backing directory.
    pub fn backing(&self) -> &str {
        match self {
            StoredName::Short(s) => s,
            StoredName::Long { backing, .. } => backing,
        }
    }
}

/// What a backing directory entry is, judged by its name alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind<'a> {
    /// An encrypted name.
    Encrypted(&'a str),
    /// A long-name entry whose full name is in the sidecar.
    Long(&'a str),
    /// cloakfs's own bookkeeping (dir ID, sidecars, config, temporary files): never listed.
    Internal,
}

/// Classifies a backing entry name.
pub fn classify(backing: &str) -> EntryKind<'_> {
    if let Some(rest) = backing.strip_prefix(LONG_PREFIX) {
        if !rest.contains('.') {
            return EntryKind::Long(backing);
        }
        return EntryKind::Internal;
    }
    if backing.starts_with(RESERVED_PREFIX) || backing.contains('.') {
        return EntryKind::Internal;
    }
    EntryKind::Encrypted(backing)
}

/// What a backing entry is once its name was checked with the names key: the one place that
/// tells an adopted tree's plaintext entries from encrypted ones.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Classified {
    /// cloakfs's own bookkeeping: never listed.
    Internal,
    /// An encrypted entry, with its plaintext name.
    Encrypted(Vec<u8>),
    /// A plaintext entry of an adopted tree, listed under its backing name as it is.
    Plain,
    /// An encrypted-looking entry that does not decrypt (in a normal volume, every entry
    /// that is not cloakfs's own and does not decrypt; in an adopted one, a long name only).
    Undecryptable(&'static str),
}

/// Whether `name` may be a plaintext entry of an adopted tree: a valid name outside the
/// names cloakfs reserves (`cloakfs.` prefix), which `init --adopt` refuses in the tree.
pub fn is_adoptable(name: &[u8]) -> bool {
    validate_plain(name).is_ok() && !name.starts_with(RESERVED_PREFIX.as_bytes())
}

/// The long-name backing entry for a full encrypted name.
pub fn long_backing_name(full: &str) -> String {
    format!("{LONG_PREFIX}{}", b64(&Sha256::digest(full.as_bytes())))
}

/// Sidecar file name of a long-name entry.
pub fn sidecar_name(backing: &str) -> String {
    format!("{backing}{LONG_SIDECAR_SUFFIX}")
}

/// Checks that `name` may be a plaintext directory entry.
pub fn validate_plain(name: &[u8]) -> Result<()> {
    if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') || name.contains(&0)
    {
        return Err(Error::InvalidName);
    }
    if name.len() > NAME_MAX {
        return Err(Error::NameTooLong);
    }
    Ok(())
}

/// Encrypts and decrypts names with a SIV key (keyed once, in locked memory).
pub struct NameCodec {
    siv: SivKey,
    long_name_max: usize,
}

impl std::fmt::Debug for NameCodec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NameCodec")
            .field("long_name_max", &self.long_name_max)
            .finish_non_exhaustive()
    }
}

impl NameCodec {
    /// A codec with the given AES-256-SIV key (64 bytes) and long-name threshold.
    pub fn new(key: SecretBytes<64>, long_name_max: usize) -> Self {
        Self {
            siv: SivKey::new(key),
            long_name_max,
        }
    }

    /// SIV-encrypts `data` with one header; output = synthetic IV || ciphertext.
    pub(crate) fn seal_raw(&self, header: &[u8], data: &[u8]) -> Vec<u8> {
        self.siv.seal(header, data)
    }

    /// Reverses [`NameCodec::seal_raw`].
    pub(crate) fn open_raw(&self, header: &[u8], sealed: &[u8]) -> Option<Vec<u8>> {
        if sealed.len() <= 16 {
            return None;
        }
        self.siv.open(header, sealed)
    }

    /// The encrypted form of plaintext `name` inside directory `dir`.
    pub fn encrypt(&self, dir: &DirId, name: &[u8]) -> Result<StoredName> {
        validate_plain(name)?;
        let full = b64(&self.seal_raw(&dir.0, name));
        if full.len() <= self.long_name_max {
            Ok(StoredName::Short(full))
        } else {
            Ok(StoredName::Long {
                backing: long_backing_name(&full),
                full,
            })
        }
    }

    /// Whether `full` (an encrypted name) is stored as a long name in this volume. Each name
    /// has exactly one stored form; the other form is refused, so no name can be listed twice.
    pub fn is_long(&self, full: &str) -> bool {
        full.len() > self.long_name_max
    }

    /// The plaintext of a name stored directly as backing entry `encrypted` in `dir`.
    pub fn decrypt_short(&self, dir: &DirId, encrypted: &str) -> Result<Vec<u8>> {
        if self.is_long(encrypted) {
            return Err(Error::Tampered(
                "over-long name stored in short form".into(),
            ));
        }
        self.decrypt(dir, encrypted)
    }

    /// The plaintext of a long name whose sidecar (of long-name entry `backing`) holds `full`.
    pub fn decrypt_long(&self, dir: &DirId, backing: &str, full: &str) -> Result<Vec<u8>> {
        if !self.is_long(full) || long_backing_name(full) != backing {
            return Err(Error::Tampered(
                "long-name sidecar does not match its entry".into(),
            ));
        }
        self.decrypt(dir, full)
    }

    /// Classifies backing entry `backing` of a directory whose ID is `dir` (None: an adopted
    /// plaintext directory that has no `cloakfs.dirid` yet, so nothing in it is encrypted).
    /// `sidecar` reads a long name's sidecar. In an adopted tree (`adopted`), an entry is
    /// encrypted only if its name is in the stored form and decrypts under the names key in
    /// this directory (AES-SIV authenticates it: a plaintext name passes with probability
    /// 2^-128); every other entry outside the reserved names is plaintext.
    pub fn classify_entry(
        &self,
        dir: Option<&DirId>,
        backing: &[u8],
        adopted: bool,
        sidecar: impl FnOnce(&str) -> std::result::Result<String, &'static str>,
    ) -> Classified {
        let plain_or = |why| {
            if adopted {
                Classified::Plain
            } else {
                Classified::Undecryptable(why)
            }
        };
        let Ok(name) = std::str::from_utf8(backing) else {
            return plain_or("backing name is not text");
        };
        let kind = classify(name);
        if adopted && kind == EntryKind::Internal && !name.starts_with(RESERVED_PREFIX) {
            // A dot, which no encrypted name has: a plaintext name.
            return Classified::Plain;
        }
        let Some(dir) = dir else {
            return match kind {
                EntryKind::Internal | EntryKind::Long(_) => Classified::Internal,
                EntryKind::Encrypted(_) => plain_or("directory without its ID"),
            };
        };
        match kind {
            EntryKind::Internal => Classified::Internal,
            EntryKind::Encrypted(e) => match self.decrypt_short(dir, e) {
                Ok(p) => Classified::Encrypted(p),
                Err(_) => plain_or(
                    "name does not decrypt in this directory (tampered, moved or from another volume)",
                ),
            },
            EntryKind::Long(b) => match sidecar(b) {
                Ok(full) => match self.decrypt_long(dir, b, &full) {
                    Ok(p) => Classified::Encrypted(p),
                    Err(_) => Classified::Undecryptable(
                        "long name does not decrypt in this directory (tampered, moved or from another volume)",
                    ),
                },
                Err(why) => Classified::Undecryptable(why),
            },
        }
    }

    /// The plaintext of a full encrypted name found in directory `dir` (either stored form).
    pub fn decrypt(&self, dir: &DirId, encrypted: &str) -> Result<Vec<u8>> {
        let tampered = || Error::Tampered("file name does not decrypt in this directory".into());
        let sealed = unb64(encrypted.as_bytes()).ok_or_else(tampered)?;
        let name = self.open_raw(&dir.0, &sealed).ok_or_else(tampered)?;
        validate_plain(&name).map_err(|_| tampered())?;
        Ok(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn codec() -> NameCodec {
        NameCodec::new(SecretBytes::from_slice(&[3u8; 64]), 255)
    }

    #[test]
    fn round_trip_and_binding() {
        let c = codec();
        let a = DirId([1; 16]);
        let b = DirId([2; 16]);
        let s = c.encrypt(&a, b"hello.txt").unwrap();
        let StoredName::Short(enc) = &s else { panic!() };
        assert_eq!(c.decrypt(&a, enc).unwrap(), b"hello.txt");
        assert!(c.decrypt(&b, enc).is_err(), "moved to another directory");
        assert_ne!(c.encrypt(&b, b"hello.txt").unwrap(), s);
        assert_eq!(c.encrypt(&a, b"hello.txt").unwrap(), s, "deterministic");
        assert!(matches!(classify(enc), EntryKind::Encrypted(_)));
        let mut t = enc.clone().into_bytes();
        t[3] = if t[3] == b'A' { b'B' } else { b'A' };
        assert!(c.decrypt(&a, std::str::from_utf8(&t).unwrap()).is_err());
    }

    #[test]
    fn long_names() {
        let c = codec();
        let d = DirId([1; 16]);
        let name = vec![b'x'; 255];
        let StoredName::Long { backing, full } = c.encrypt(&d, &name).unwrap() else {
            panic!("255 bytes must spill")
        };
        assert!(backing.len() <= 62);
        assert_eq!(long_backing_name(&full), backing);
        assert!(matches!(classify(&backing), EntryKind::Long(_)));
        assert_eq!(classify(&sidecar_name(&backing)), EntryKind::Internal);
        assert_eq!(c.decrypt(&d, &full).unwrap(), name);
        assert!(matches!(
            c.encrypt(&d, &[b'y'; 256]),
            Err(Error::NameTooLong)
        ));
    }

    #[test]
    fn adopted_entries_are_plaintext_unless_they_decrypt() {
        let c = codec();
        let d = DirId([1; 16]);
        let no_sidecar = |_: &str| Err("no sidecar");
        let StoredName::Short(enc) = c.encrypt(&d, b"new.txt").unwrap() else {
            panic!()
        };
        let classify = |dir, name: &[u8], adopted| c.classify_entry(dir, name, adopted, no_sidecar);
        assert_eq!(
            classify(Some(&d), enc.as_bytes(), true),
            Classified::Encrypted(b"new.txt".to_vec())
        );
        // The same stored name in another directory, a plaintext name in the stored form, a
        // name with a dot and a name that is not text are plaintext in an adopted tree only.
        for name in [enc.as_bytes(), b"README", b"notes.txt", b"caf\xe9"] {
            assert_eq!(
                classify(Some(&DirId([2; 16])), name, true),
                Classified::Plain
            );
            assert_eq!(classify(None, name, true), Classified::Plain);
            assert!(matches!(
                classify(Some(&DirId([2; 16])), name, false),
                Classified::Undecryptable(_) | Classified::Internal
            ));
        }
        for name in [DIRID_FILE, "cloakfs.conf", "cloakfs.tmp.00"] {
            assert_eq!(
                classify(Some(&d), name.as_bytes(), true),
                Classified::Internal
            );
        }
        assert!(is_adoptable(b"notes.txt"));
        assert!(!is_adoptable(b"cloakfs.notes"));
    }

    #[test]
    fn invalid_names() {
        let c = codec();
        let d = DirId([1; 16]);
        for n in [&b""[..], b".", b"..", b"a/b", b"a\0b"] {
            assert!(c.encrypt(&d, n).is_err());
        }
        assert_eq!(classify(DIRID_FILE), EntryKind::Internal);
        assert_eq!(classify("cloakfs.conf"), EntryKind::Internal);
    }
}
