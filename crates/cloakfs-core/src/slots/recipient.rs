//! `recipient` slots: the KEK is random and stored encrypted with age (the `age` crate, format
//! age-encryption.org/v1) to one or more public keys: age X25519 recipients (`age1...`, as made
//! by `age-keygen`) and ssh-ed25519 / ssh-rsa public keys. It is unlocked with identity files:
//! age identity files (`AGE-SECRET-KEY-1...`) or ssh private keys (passphrase-protected ones
//! ask for the passphrase through the caller's [`age::Callbacks`]).
//!
//! Fields: `recipient_types` (comma-separated types of the recipients, in order, for display:
//! `x25519`, `ssh-ed25519`, `ssh-rsa`; the keys themselves are not stored) and `age` (b64 of the
//! binary age file whose plaintext is the 32-byte KEK). The age data is interoperable:
//! `age -d -i IDENTITY` decrypts it to the KEK.

use super::{Kek, KeySlot};
use crate::error::{Error, Result};
use crate::text::{b64, Fields};
use std::io::{Read, Write};
use zeroize::Zeroizing;

/// Fields of a recipient slot besides the common ones.
pub const FIELDS: &[&str] = &["recipient_types", "age"];
/// The optional field that keeps the recipients' public keys (sharing volumes only).
pub const KEYS_FIELD: &str = "recipient_keys";
/// Largest `age` field accepted (an ssh-rsa 16384-bit stanza is about 3 KiB per recipient).
pub const MAX_AGE_LEN: usize = 1 << 20;

/// Parsed public keys to encrypt a KEK to.
pub struct Recipients {
    list: Vec<Box<dyn age::Recipient + Send>>,
    types: Vec<String>,
    /// Each key in its short form (`age1...`, or an ssh key's type and key without comment).
    keys: Vec<String>,
}

impl std::fmt::Debug for Recipients {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Recipients({})", self.types.join(","))
    }
}

impl Recipients {
    /// The recipients' types, in order.
    pub fn types(&self) -> &[String] {
        &self.types
    }

    /// Parses recipients, one per line (blank lines and `#` comments skipped): `age1...` X25519
    /// keys, or ssh public keys in authorized_keys form (`ssh-ed25519 AAAA... comment`).
    pub fn parse(text: &str) -> Result<Self> {
        let mut list: Vec<Box<dyn age::Recipient + Send>> = Vec::new();
        let mut types = Vec::new();
        let mut keys = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bad = |m: String| Error::Refused(format!("recipient on line {}: {m}", n + 1));
            keys.push(short_key(line));
            if line.starts_with("age1") {
                let r: age::x25519::Recipient = line
                    .parse()
                    .map_err(|e| bad(format!("not a valid age X25519 key ({e})")))?;
                list.push(Box::new(r));
                types.push("x25519".to_string());
            } else if ["ssh-", "ecdsa-", "sk-"]
                .iter()
                .any(|p| line.starts_with(p))
            {
                use age::ssh::ParseRecipientKeyError as P;
                let r: age::ssh::Recipient = line.parse().map_err(|e| {
                    bad(match e {
                        P::RsaModulusTooSmall => "ssh-rsa key shorter than 2048 bits".into(),
                        P::RsaModulusTooLarge => "ssh-rsa key too large".into(),
                        P::Unsupported(t) => {
                            format!(
                                "ssh key type {t} is not supported (use ssh-ed25519 or ssh-rsa)"
                            )
                        }
                        _ => "not a valid ssh public key".into(),
                    })
                })?;
                let t = line.split_whitespace().next().unwrap_or("ssh").to_string();
                list.push(Box::new(r));
                types.push(t);
            } else {
                return Err(bad(
                    "not an age (age1...) or ssh (ssh-ed25519, ssh-rsa) public key".into(),
                ));
            }
        }
        if list.is_empty() {
            return Err(Error::Refused("no recipient given".into()));
        }
        Ok(Self { list, types, keys })
    }
}

/// A recipient line's key without an ssh key's comment: what identifies the key.
pub fn short_key(line: &str) -> String {
    line.split_whitespace()
        .take(2)
        .collect::<Vec<_>>()
        .join(" ")
}

/// The public keys a recipient slot of a sharing volume keeps (field `recipient_keys`, short
/// forms separated by commas), `None` for a slot that keeps none.
pub fn slot_keys(slot: &KeySlot) -> Option<Vec<String>> {
    let v = slot.fields().get(KEYS_FIELD)?;
    Some(v.split(',').map(String::from).collect())
}

/// Encrypts `kek` to `recipients`: the binary age file.
pub fn encrypt(recipients: &Recipients, kek: &Kek) -> Result<Vec<u8>> {
    encrypt_to_vec(recipients, false, kek.expose())
}

/// Encrypts `data` to `recipients`: the binary age file.
pub fn encrypt_bytes(recipients: &Recipients, data: &[u8]) -> Result<Vec<u8>> {
    encrypt_to_vec(recipients, false, data)
}

/// Encrypts `data` to `recipients` as an ASCII-armored age file (`age -d` reads it), e.g. a
/// Shamir share given to one person.
pub fn encrypt_armored(recipients: &Recipients, data: &[u8]) -> Result<Vec<u8>> {
    encrypt_to_vec(recipients, true, data)
}

fn encrypt_to_vec(recipients: &Recipients, armor: bool, data: &[u8]) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    encrypt_stream(recipients, armor, &mut out, &mut |w| Ok(w.write_all(data)?))?;
    Ok(out)
}

/// Writes a standard age file (ASCII-armored if `armor`) encrypted to `recipients` to `out`,
/// its plaintext written by `fill`.
pub fn encrypt_stream(
    recipients: &Recipients,
    armor: bool,
    out: &mut dyn Write,
    fill: &mut dyn FnMut(&mut dyn Write) -> Result<()>,
) -> Result<()> {
    use age::armor::{ArmoredWriter, Format};
    let enc = age::Encryptor::with_recipients(
        recipients
            .list
            .iter()
            .map(|r| r.as_ref() as &dyn age::Recipient),
    )
    .map_err(|e| Error::Refused(format!("age: {e}")))?;
    let format = if armor {
        Format::AsciiArmor
    } else {
        Format::Binary
    };
    let armored = ArmoredWriter::wrap_output(out, format)?;
    let mut w = enc.wrap_output(armored)?;
    fill(&mut w)?;
    w.finish()?.finish()?;
    Ok(())
}

/// Decrypts an ASCII-armored (or binary) age file with `ids`: `None` if none of them is a
/// recipient.
pub fn decrypt_armored(data: &[u8], ids: &Identities) -> Result<Option<Zeroizing<Vec<u8>>>> {
    let mut raw = Vec::new();
    age::armor::ArmoredReader::new(data)
        .read_to_end(&mut raw)
        .map_err(|e| Error::InvalidSecret(format!("not a valid age file ({e})")))?;
    match decrypt(&raw, ids) {
        Err(Error::ConfigDamaged(m)) => Err(Error::InvalidSecret(m)),
        r => r,
    }
}

/// Fields of a new recipient slot, with a fresh random KEK. `keep_keys` (a sharing volume,
/// whose file headers name their recipients anyway) also stores the public keys, so that fsck
/// can tell the members' keys from others.
pub fn new_slot(recipients: &Recipients, keep_keys: bool) -> Result<(Fields, Kek)> {
    let kek = Kek::random();
    let mut f = Fields::new();
    f.insert("recipient_types".into(), recipients.types.join(","));
    if keep_keys {
        f.insert(KEYS_FIELD.into(), recipients.keys.join(","));
    }
    f.insert("age".into(), b64(&encrypt(recipients, &kek)?));
    Ok((f, kek))
}

/// What an identity file held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loaded {
    /// Identities usable as they are (age identities, an unencrypted ssh key).
    Ready,
    /// A passphrase-protected ssh key: the callbacks will be asked for its passphrase.
    EncryptedSsh,
}

/// Identities loaded from identity files.
#[derive(Default)]
pub struct Identities {
    list: Vec<Box<dyn age::Identity + Send + Sync>>,
}

impl std::fmt::Debug for Identities {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Identities({})", self.list.len())
    }
}

impl Identities {
    /// No identity.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether none was loaded.
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Adds the identities in one file's contents: an age identity file, or an ssh private
    /// key. `name` names the file in errors; `callbacks` asks for an ssh key's passphrase.
    pub fn add_file<C: age::Callbacks>(
        &mut self,
        data: &[u8],
        name: &str,
        callbacks: C,
    ) -> Result<Loaded> {
        let bad = |m: &str| Error::InvalidSecret(format!("identity file {name}: {m}"));
        let text = std::str::from_utf8(data).map_err(|_| bad("not a text file"))?;
        if text.contains("PRIVATE KEY-----") {
            let id = age::ssh::Identity::from_buffer(text.as_bytes(), Some(name.to_string()))
                .map_err(|_| bad("not an ssh private key that age can use"))?;
            if let age::ssh::Identity::Unsupported(k) = &id {
                struct D<'a>(&'a age::ssh::UnsupportedKey, &'a str);
                impl std::fmt::Display for D<'_> {
                    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                        self.0.display(f, Some(self.1))
                    }
                }
                let msg = D(k, name).to_string();
                let first = msg.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
                return Err(bad(&format!("unsupported ssh key: {}", first.trim())));
            }
            let loaded = match id {
                age::ssh::Identity::Encrypted(_) => Loaded::EncryptedSsh,
                _ => Loaded::Ready,
            };
            self.list.push(Box::new(id.with_callbacks(callbacks)));
            return Ok(loaded);
        }
        let file = age::IdentityFile::from_buffer(text.as_bytes()).map_err(|_| {
            bad("not an age identity file (AGE-SECRET-KEY-1...) or ssh private key")
        })?;
        let ids = file
            .with_callbacks(callbacks)
            .into_identities()
            .map_err(|e| bad(&e.to_string()))?;
        if ids.is_empty() {
            return Err(bad("it contains no identity"));
        }
        for id in ids {
            self.list.push(id);
        }
        Ok(Loaded::Ready)
    }
}

/// Decrypts an age file with `ids`: `None` if none of them is a recipient.
pub fn decrypt(ct: &[u8], ids: &Identities) -> Result<Option<Zeroizing<Vec<u8>>>> {
    let dec = age::Decryptor::new_buffered(ct)
        .map_err(|e| Error::ConfigDamaged(format!("age data: {e}")))?;
    let mut r = match dec.decrypt(ids.list.iter().map(|i| i.as_ref() as &dyn age::Identity)) {
        Ok(r) => r,
        Err(age::DecryptError::NoMatchingKeys) => return Ok(None),
        Err(age::DecryptError::KeyDecryptionFailed) => {
            return Err(Error::InvalidSecret(
                "cannot decrypt the ssh private key (wrong passphrase?)".into(),
            ))
        }
        Err(e) => return Err(Error::ConfigDamaged(format!("age data: {e}"))),
    };
    let mut out = Zeroizing::new(Vec::new());
    r.read_to_end(&mut out)
        .map_err(|e| Error::ConfigDamaged(format!("age data: {e}")))?;
    Ok(Some(out))
}

/// The KEK `ids` give for `slot`: `None` if none of them is one of its recipients.
pub fn kek(slot: &KeySlot, ids: &Identities) -> Result<Option<Kek>> {
    if ids.is_empty() {
        return Ok(None);
    }
    let ct = slot.var_bytes("age", MAX_AGE_LEN)?;
    let damaged = |m: String| Error::ConfigDamaged(format!("slot {}: {m}", slot.id()));
    match decrypt(&ct, ids) {
        Ok(Some(pt)) => {
            let k: [u8; 32] = pt[..]
                .try_into()
                .map_err(|_| damaged("age data does not hold a 32-byte key".into()))?;
            Ok(Some(Kek::from_slice(&k)))
        }
        Ok(None) => Ok(None),
        Err(Error::ConfigDamaged(m)) => Err(damaged(m)),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn x25519_round_trip_and_foreign_identity() {
        let id = age::x25519::Identity::generate();
        let other = age::x25519::Identity::generate();
        use age::secrecy::ExposeSecret;
        let recipients = Recipients::parse(&format!("# mine\n{}\n", id.to_public())).unwrap();
        assert_eq!(recipients.types(), ["x25519"]);
        let (f, want) = new_slot(&recipients, false).unwrap();
        let slot = KeySlot {
            fields: {
                let mut all = f.clone();
                all.insert("id".into(), "1".into());
                all
            },
        };
        let mut ids = Identities::new();
        ids.add_file(
            id.to_string().expose_secret().as_bytes(),
            "id",
            age::NoCallbacks,
        )
        .unwrap();
        let got = kek(&slot, &ids).unwrap().unwrap();
        assert_eq!(got.expose(), want.expose());
        let mut wrong = Identities::new();
        wrong
            .add_file(
                other.to_string().expose_secret().as_bytes(),
                "other",
                age::NoCallbacks,
            )
            .unwrap();
        assert!(kek(&slot, &wrong).unwrap().is_none());
    }

    #[test]
    fn bad_recipients_and_identities() {
        assert!(Recipients::parse("").is_err());
        assert!(Recipients::parse("age1notakey").is_err());
        assert!(Recipients::parse("hello").is_err());
        assert!(Recipients::parse("ssh-dss AAAAB3NzaC1kc3M=").is_err());
        let mut ids = Identities::new();
        assert!(ids.add_file(b"garbage\n", "f", age::NoCallbacks).is_err());
        assert!(ids
            .add_file(b"# only a comment\n", "f", age::NoCallbacks)
            .is_err());
    }
}
