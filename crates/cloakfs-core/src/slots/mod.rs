//! Key slots: the master key stored wrapped, once per slot, like LUKS key slots.
//!
//! Every slot kind wraps the master key the same way: `wrapped = nonce || AES-256-GCM(KEK,
//! nonce, master key, AAD)`, where the AAD is the slot's canonical text (every field except
//! `wrapped`, bound to the volume ID; see docs/FORMAT.md section 5). A kind only defines how
//! its 32-byte key-encryption key (KEK) is obtained, and which fields it stores for that:
//!
//! | kind | KEK | module |
//! |---|---|---|
//! | `passphrase` | Argon2id(passphrase, salt) | [`passphrase`] |
//! | `keyfile` | HKDF(key file bytes, salt) | [`keyfile`] |
//! | `recovery` | HKDF(random recovery key shown once, salt) | [`recovery`] |
//! | `recipient` | random, stored age-encrypted to X25519 / ssh recipients | [`recipient`] |
//! | `shamir` | random, split M-of-N into share files | [`shamir`] |
//! | `pkcs11` | HMAC-SHA256 on a token over a salt (in the CLI: it needs the token) | – |
//! | `gpg` | random, stored encrypted by `gpg` to an OpenPGP key (fields in the CLI) | [`gpg`] runs gpg |
//!
//! A slot of a kind this build does not know is kept (and covered by the config MAC) but never
//! used to unlock: a newer cloakfs may have added it.
//!
//! The config's methods that add, replace, re-wrap and remove slots and unlock through them
//! (`VolumeConfig::add_slot`, `unlock_with`, `unlock_passphrase`, ...) live above this module,
//! in format/config/key_slots.rs: format uses slots, and slots does not use format.

pub mod gpg;
pub mod keyfile;
pub mod passphrase;
pub mod recipient;
pub mod recovery;
pub mod shamir;

use crate::crypto::kdf::{Argon2Params, SALT_LEN};
use crate::crypto::keys::{MasterKey, KEY_LEN};
use crate::crypto::secret::SecretBytes;
use crate::error::{Error, Result};
use crate::text::{b64, get, parse_b64, parse_num, unb64, unb64_array, Fields};
use aes_gcm::aead::{AeadInPlace, KeyInit};
use aes_gcm::Aes256Gcm;

/// First line of the additional data of every slot's key wrap.
pub const WRAP_DOMAIN: &str = "cloakfs slot v1\n";
/// Length of every key-encryption key.
pub const KEK_LEN: usize = 32;
/// A slot's key-encryption key.
pub type Kek = SecretBytes<KEK_LEN>;
/// Bytes of the `wrapped` field: nonce(12) || encrypted master key(32) || tag(16).
pub const WRAPPED_LEN: usize = 12 + KEY_LEN + 16;
/// Fields every slot has, set when the slot is made (kinds may not set them).
pub const COMMON_FIELDS: [&str; 4] = ["id", "kind", "label", "wrapped"];

/// Slot kind names.
pub mod kind {
    /// Argon2id over a passphrase.
    pub const PASSPHRASE: &str = "passphrase";
    /// HKDF over the bytes of a key file.
    pub const KEYFILE: &str = "keyfile";
    /// HKDF over a random recovery key shown once.
    pub const RECOVERY: &str = "recovery";
    /// A random KEK, age-encrypted to X25519 or ssh public keys.
    pub const RECIPIENT: &str = "recipient";
    /// A random KEK, split M-of-N into Shamir shares kept outside the volume.
    pub const SHAMIR: &str = "shamir";
    /// HMAC-SHA256 over a salt, computed by a key that never leaves a PKCS#11 token.
    pub const PKCS11: &str = "pkcs11";
    /// A random KEK, encrypted by GnuPG to an OpenPGP key.
    pub const GPG: &str = "gpg";
    /// Every kind this build can unlock.
    pub const KNOWN: [&str; 7] = [
        PASSPHRASE, KEYFILE, RECOVERY, RECIPIENT, SHAMIR, PKCS11, GPG,
    ];
}

/// The fields (besides [`COMMON_FIELDS`]) each known kind stores; `None` for an unknown kind.
pub fn kind_fields(kind: &str) -> Option<&'static [&'static str]> {
    Some(match kind {
        kind::PASSPHRASE => passphrase::FIELDS,
        kind::KEYFILE => keyfile::FIELDS,
        kind::RECOVERY => recovery::FIELDS,
        kind::RECIPIENT => recipient::FIELDS,
        kind::SHAMIR => shamir::FIELDS,
        kind::PKCS11 => &["pkcs11_token", "pkcs11_object", "salt"],
        kind::GPG => &["gpg_recipients", "gpg"],
        _ => return None,
    })
}

/// One key slot: the master key wrapped under a key that one kind of secret produces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeySlot {
    pub(crate) fields: Fields,
}

impl KeySlot {
    /// A new slot `id` of `kind` with the kind's `fields` and the [`COMMON_FIELDS`] but no key
    /// yet: [`KeySlot::wrap`] adds the `wrapped` field. Refuses a label or kind with a newline
    /// or NUL and kind fields that cannot be stored ([`check_kind_fields`]).
    pub(crate) fn new(id: u32, kind: &str, label: &str, fields: Fields) -> Result<Self> {
        if label.contains(['\n', '\0']) {
            return Err(Error::Refused(
                "a slot label may not contain a newline or NUL".into(),
            ));
        }
        if kind.is_empty() || kind.contains(['\n', '\0']) {
            return Err(Error::Refused(format!("invalid slot kind {kind:?}")));
        }
        check_kind_fields(&fields)?;
        let mut all = fields;
        all.insert("id".into(), id.to_string());
        all.insert("kind".into(), kind.into());
        all.insert("label".into(), label.into());
        Ok(KeySlot { fields: all })
    }

    /// The slot's numeric ID (unique within the volume).
    pub fn id(&self) -> u32 {
        self.fields
            .get("id")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    }

    /// The slot's kind (`passphrase`, ...).
    pub fn kind(&self) -> &str {
        self.fields.get("kind").map(String::as_str).unwrap_or("")
    }

    /// Whether this build knows the slot's kind (unknown kinds are kept but never used).
    pub fn is_known_kind(&self) -> bool {
        kind::KNOWN.contains(&self.kind())
    }

    /// The user's label for the slot (may be empty).
    pub fn label(&self) -> &str {
        self.fields.get("label").map(String::as_str).unwrap_or("")
    }

    /// All fields, for display of non-secret parts and for future slot kinds.
    pub fn fields(&self) -> &Fields {
        &self.fields
    }

    /// A field, or a "damaged config" error naming the slot.
    pub fn get(&self, k: &str) -> Result<&str> {
        get(&self.fields, k).map_err(|e| self.damaged(e))
    }

    /// A decimal field.
    pub fn num<T: std::str::FromStr>(&self, k: &str) -> Result<T> {
        parse_num(&self.fields, k).map_err(|e| self.damaged(e))
    }

    /// A base64url field of exactly `N` bytes.
    pub fn bytes<const N: usize>(&self, k: &str) -> Result<[u8; N]> {
        parse_b64(&self.fields, k).map_err(|e| self.damaged(e))
    }

    /// A base64url field of at most `max` bytes.
    pub fn var_bytes(&self, k: &str, max: usize) -> Result<Vec<u8>> {
        let v = self.get(k)?;
        match unb64(v.as_bytes()) {
            Some(b) if !b.is_empty() && b.len() <= max => Ok(b),
            _ => Err(self.damaged(Error::ConfigDamaged(format!(
                "field {k:?} is not base64url of 1..{max} bytes"
            )))),
        }
    }

    fn damaged(&self, e: Error) -> Error {
        match e {
            Error::ConfigDamaged(m) => Error::ConfigDamaged(format!("slot {}: {m}", self.id())),
            e => e,
        }
    }

    /// The Argon2id parameters of a passphrase slot.
    pub fn argon2(&self) -> Result<Argon2Params> {
        passphrase::params(&self.fields).map_err(|e| self.damaged(e))
    }

    /// Additional data of the key wrap: every field but `wrapped`, bound to the volume.
    pub fn wrap_aad(&self, volume_id: &[u8; 16]) -> Vec<u8> {
        let mut s = String::from(WRAP_DOMAIN);
        s.push_str(&format!("volume_id={}\n", b64(volume_id)));
        for (k, v) in self.fields.iter().filter(|(k, _)| *k != "wrapped") {
            s.push_str(&format!("{k}={v}\n"));
        }
        s.into_bytes()
    }

    /// Wraps `mk` under `kek` into this slot's `wrapped` field: nonce(12) || ct(32) || tag(16).
    pub(crate) fn wrap(
        &mut self,
        volume_id: &[u8; 16],
        kek: &Kek,
        mk: &MasterKey,
        nonce: [u8; 12],
    ) {
        let aad = self.wrap_aad(volume_id);
        let mut buf = SecretBytes::<KEY_LEN>::from_slice(mk.expose());
        let tag = Aes256Gcm::new(kek.expose().into())
            .encrypt_in_place_detached(&nonce.into(), &aad, buf.expose_mut())
            .expect("32-byte wrap");
        let mut out = nonce.to_vec();
        out.extend_from_slice(buf.expose());
        out.extend_from_slice(&tag);
        self.fields.insert("wrapped".into(), b64(&out));
    }

    /// Unwraps the master key with `kek`; `None` if this slot does not accept it (or its
    /// `wrapped` field is malformed).
    pub fn open(&self, volume_id: &[u8; 16], kek: &Kek) -> Option<MasterKey> {
        let wrapped: [u8; WRAPPED_LEN] = unb64_array(self.fields.get("wrapped")?)?;
        let aad = self.wrap_aad(volume_id);
        let mut mk = SecretBytes::<KEY_LEN>::from_slice(wrapped[12..44].try_into().ok()?);
        Aes256Gcm::new(kek.expose().into())
            .decrypt_in_place_detached(
                wrapped[..12].into(),
                &aad,
                mk.expose_mut(),
                wrapped[44..].into(),
            )
            .ok()?;
        Some(MasterKey::from_bytes(mk.expose()))
    }
}

/// Randomness injected into slot creation, so test vectors can be reproduced.
#[derive(Debug, Clone, Copy)]
pub struct SlotRandomness {
    /// Salt of the kind's KEK derivation (Argon2id, HKDF, token HMAC).
    pub salt: [u8; SALT_LEN],
    /// Key-wrap nonce.
    pub nonce: [u8; 12],
}

impl SlotRandomness {
    /// Fresh randomness from the OS.
    pub fn fresh() -> Self {
        Self {
            salt: crate::crypto::random::array(),
            nonce: crate::crypto::random::array(),
        }
    }
}

/// The result of a successful unlock.
#[derive(Debug)]
pub struct Unlocked {
    /// The master key (the config MAC has been verified with it).
    pub master_key: MasterKey,
    /// The slot that opened (0 for a volume without a stored key).
    pub slot_id: u32,
    /// That slot's KEK (`None` for a volume without a stored key), so the slot can be
    /// re-wrapped around a new master key (rekey).
    pub kek: Option<Kek>,
}

/// Checks that kind-specific fields are storable: valid keys, single-line values, no common
/// field.
fn check_kind_fields(fields: &Fields) -> Result<()> {
    for (k, v) in fields {
        let key_ok = !k.is_empty()
            && k.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
        if !key_ok || COMMON_FIELDS.contains(&k.as_str()) {
            return Err(Error::Refused(format!("invalid slot field name {k:?}")));
        }
        if v.contains(['\n', '\0']) {
            return Err(Error::Refused(format!(
                "slot field {k:?} may not contain a newline or NUL"
            )));
        }
    }
    Ok(())
}
