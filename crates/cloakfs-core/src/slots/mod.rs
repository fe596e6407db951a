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

pub mod gpg;
pub mod keyfile;
pub mod passphrase;
pub mod recipient;
pub mod recovery;
pub mod shamir;

use crate::crypto::kdf::{Argon2Params, SALT_LEN};
use crate::crypto::keys::{MasterKey, KEY_LEN};
use crate::crypto::secret::{Passphrase, SecretBytes};
use crate::error::{Error, Result};
use crate::format::config::VolumeConfig;
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
/// Fields every slot has, set by [`VolumeConfig::add_slot`] (kinds may not set them).
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
    fn wrap(&mut self, volume_id: &[u8; 16], kek: &Kek, mk: &MasterKey, nonce: [u8; 12]) {
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

impl VolumeConfig {
    /// The key slots.
    pub fn slots(&self) -> &[KeySlot] {
        &self.slots
    }

    /// The slot with this ID.
    pub fn slot(&self, id: u32) -> Option<&KeySlot> {
        self.slots.iter().find(|s| s.id() == id)
    }

    /// The ID the next added slot gets: the largest existing ID + 1 (1 for the first).
    pub fn next_slot_id(&self) -> u32 {
        self.slots
            .iter()
            .map(KeySlot::id)
            .max()
            .map_or(1, |m| m.saturating_add(1))
    }

    #[allow(clippy::too_many_arguments)]
    fn make_slot(
        &self,
        id: u32,
        kind: &str,
        label: &str,
        fields: Fields,
        kek: &Kek,
        mk: &MasterKey,
        nonce: [u8; 12],
    ) -> Result<KeySlot> {
        if !self.has_stored_key() {
            return Err(Error::Refused(
                "this volume has no stored key (made with --no-stored-key): it has no key slots"
                    .into(),
            ));
        }
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
        let mut slot = KeySlot { fields: all };
        slot.wrap(&self.params.volume_id, kek, mk, nonce);
        Ok(slot)
    }

    /// Adds a slot of `kind` with the kind's `fields`, wrapping `mk` under `kek`; returns its
    /// ID ([`VolumeConfig::next_slot_id`]). Call [`VolumeConfig::seal`] after.
    pub fn add_slot(
        &mut self,
        mk: &MasterKey,
        kind: &str,
        label: &str,
        fields: Fields,
        kek: &Kek,
        nonce: [u8; 12],
    ) -> Result<u32> {
        let id = self.next_slot_id();
        let slot = self.make_slot(id, kind, label, fields, kek, mk, nonce)?;
        self.slots.push(slot);
        self.mac = None;
        Ok(id)
    }

    /// Replaces slot `id` in place (same ID, same position) by a new one. Used to change a
    /// passphrase in one atomic config write. Call [`VolumeConfig::seal`] after.
    #[allow(clippy::too_many_arguments)]
    pub fn replace_slot(
        &mut self,
        id: u32,
        mk: &MasterKey,
        kind: &str,
        label: &str,
        fields: Fields,
        kek: &Kek,
        nonce: [u8; 12],
    ) -> Result<()> {
        let pos = self
            .slots
            .iter()
            .position(|s| s.id() == id)
            .ok_or_else(|| Error::Refused(format!("no key slot {id}")))?;
        self.slots[pos] = self.make_slot(id, kind, label, fields, kek, mk, nonce)?;
        self.mac = None;
        Ok(())
    }

    /// Re-wraps slot `id` (whose KEK is `kek`) around a new master key, keeping every other
    /// field: what a rekey does for the slot that unlocked. Call [`VolumeConfig::seal`] after.
    pub fn rewrap_slot(
        &mut self,
        id: u32,
        kek: &Kek,
        new_mk: &MasterKey,
        nonce: [u8; 12],
    ) -> Result<()> {
        let volume_id = self.params.volume_id;
        let slot = self
            .slots
            .iter_mut()
            .find(|s| s.id() == id)
            .ok_or_else(|| Error::Refused(format!("no key slot {id}")))?;
        if slot.open(&volume_id, kek).is_none() {
            return Err(Error::WrongSecret);
        }
        slot.wrap(&volume_id, kek, new_mk, nonce);
        self.mac = None;
        Ok(())
    }

    /// Removes slot `id`. Call [`VolumeConfig::seal`] after.
    pub fn remove_slot(&mut self, id: u32) -> Result<()> {
        let before = self.slots.len();
        self.slots.retain(|s| s.id() != id);
        if self.slots.len() == before {
            return Err(Error::Refused(format!("no key slot {id}")));
        }
        self.mac = None;
        Ok(())
    }

    /// Adds a passphrase slot wrapping `mk`; returns its ID. Call [`VolumeConfig::seal`] after.
    pub fn add_passphrase_slot(
        &mut self,
        mk: &MasterKey,
        pass: &Passphrase,
        params: Argon2Params,
        label: &str,
        rnd: SlotRandomness,
    ) -> Result<u32> {
        let (fields, kek) = passphrase::new_slot(pass, params, &rnd.salt)?;
        self.add_slot(mk, kind::PASSPHRASE, label, fields, &kek, rnd.nonce)
    }

    /// Tries the slots in order. For each slot of a known kind, `kek_for` returns the slot's
    /// KEK from the secrets at hand, `None` when it has no secret for that slot, or an error
    /// (kept, and reported only if no slot opens). The first slot whose wrap opens yields the
    /// master key; the config MAC is then verified with it (a mismatch is
    /// [`Error::ConfigTampered`], and no further slot is tried).
    ///
    /// With no slot opening: the first error from `kek_for`, else [`Error::WrongSecret`] if a
    /// KEK was tried, else [`Error::NoUsableSlot`].
    pub fn unlock_with<E, F>(&self, mut kek_for: F) -> std::result::Result<Unlocked, E>
    where
        E: From<Error>,
        F: FnMut(&KeySlot) -> std::result::Result<Option<Kek>, E>,
    {
        if !self.has_stored_key() {
            return Err(Error::NoUsableSlot(
                "this volume has no stored key (made with --no-stored-key): \
                 it opens only with its passphrase"
                    .into(),
            )
            .into());
        }
        let mut first_error = None;
        let mut tried = false;
        for slot in self.slots.iter().filter(|s| s.is_known_kind()) {
            let kek = match kek_for(slot) {
                Ok(Some(kek)) => kek,
                Ok(None) => continue,
                Err(e) => {
                    first_error.get_or_insert(e);
                    continue;
                }
            };
            tried = true;
            if let Some(mk) = slot.open(&self.params.volume_id, &kek) {
                self.verify(&mk)?;
                return Ok(Unlocked {
                    master_key: mk,
                    slot_id: slot.id(),
                    kek: Some(kek),
                });
            }
        }
        if let Some(e) = first_error {
            return Err(e);
        }
        if tried {
            return Err(Error::WrongSecret.into());
        }
        let kinds: Vec<&str> = self.slots.iter().map(KeySlot::kind).collect();
        Err(Error::NoUsableSlot(format!(
            "no key slot of this volume takes the secret given (its slots: {})",
            if kinds.is_empty() {
                "none".to_string()
            } else {
                kinds.join(", ")
            }
        ))
        .into())
    }

    /// Opens the volume with a passphrase: tries every passphrase slot, or derives the master
    /// key of a volume without a stored key. Returns the master key and the slot ID (0 for no
    /// stored key). The config MAC is verified.
    pub fn unlock_passphrase(&self, pass: &Passphrase) -> Result<(MasterKey, u32)> {
        let u = self.unlock_passphrase_full(pass)?;
        Ok((u.master_key, u.slot_id))
    }

    /// [`VolumeConfig::unlock_passphrase`], with the KEK of the slot that opened.
    pub fn unlock_passphrase_full(&self, pass: &Passphrase) -> Result<Unlocked> {
        if let crate::format::config::KeySource::Passphrase { kdf, salt } = self.key_source() {
            let mk = MasterKey::from_bytes(crate::crypto::kdf::derive(pass, salt, kdf)?.expose());
            // No slot: a wrong passphrase shows only as a MAC mismatch.
            return match self.verify(&mk) {
                Ok(()) => Ok(Unlocked {
                    master_key: mk,
                    slot_id: 0,
                    kek: None,
                }),
                Err(_) => Err(Error::WrongSecret),
            };
        }
        self.unlock_with(|slot| match slot.kind() {
            kind::PASSPHRASE => passphrase::kek(slot, pass).map(Some),
            _ => Ok(None),
        })
        .map_err(|e| match e {
            Error::NoUsableSlot(_) => Error::NoUsableSlot(
                "this volume has no passphrase slot: unlock it with another kind of secret".into(),
            ),
            e => e,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::config::VolumeParams;

    fn cheap() -> Argon2Params {
        Argon2Params {
            memory_kib: 64,
            iterations: 1,
            lanes: 1,
        }
    }

    fn volume() -> (VolumeConfig, MasterKey) {
        let mk = MasterKey::generate();
        let mut c = VolumeConfig::new(VolumeParams::new());
        c.add_passphrase_slot(
            &mk,
            &Passphrase::new(b"pw".to_vec()),
            cheap(),
            "main",
            SlotRandomness::fresh(),
        )
        .unwrap();
        c.seal(&mk);
        (c, mk)
    }

    #[test]
    fn generic_slot_round_trip_and_wrong_kek() {
        let (mut c, mk) = volume();
        let kek = Kek::random();
        let mut f = Fields::new();
        f.insert("x".into(), "1".into());
        let id = c.add_slot(&mk, "keyfile", "k", f, &kek, [7; 12]).unwrap();
        assert_eq!(id, 2);
        c.seal(&mk);
        let c = VolumeConfig::parse(&c.to_json()).unwrap();
        let u = c
            .unlock_with(|s| -> Result<_> { Ok((s.id() == 2).then(|| kek.clone())) })
            .unwrap();
        assert_eq!(u.master_key.expose(), mk.expose());
        assert_eq!(u.slot_id, 2);
        let wrong = c.unlock_with(|s| -> Result<_> { Ok((s.id() == 2).then(Kek::random)) });
        assert!(matches!(wrong, Err(Error::WrongSecret)));
        let none = c.unlock_with(|_| -> Result<_> { Ok(None) });
        assert!(matches!(none, Err(Error::NoUsableSlot(_))));
    }

    #[test]
    fn reserved_and_multiline_fields_are_refused() {
        let (mut c, mk) = volume();
        let kek = Kek::random();
        for (k, v) in [("id", "3"), ("wrapped", "x"), ("Bad", "x"), ("ok", "a\nb")] {
            let mut f = Fields::new();
            f.insert(k.into(), v.into());
            assert!(c.add_slot(&mk, "keyfile", "", f, &kek, [0; 12]).is_err());
        }
        assert!(c
            .add_slot(&mk, "keyfile", "two\nlines", Fields::new(), &kek, [0; 12])
            .is_err());
    }

    #[test]
    fn unknown_kinds_are_kept_and_skipped() {
        let (mut c, mk) = volume();
        let kek = Kek::random();
        c.add_slot(&mk, "quantum-token", "future", Fields::new(), &kek, [1; 12])
            .unwrap();
        c.seal(&mk);
        let c = VolumeConfig::parse(&c.to_json()).unwrap();
        assert_eq!(c.slots().len(), 2);
        assert!(!c.slots()[1].is_known_kind());
        let mut seen = Vec::new();
        let r = c.unlock_with(|s| -> Result<_> {
            seen.push(s.kind().to_string());
            Ok(Some(kek.clone()))
        });
        // The unknown slot is never offered, even though its KEK would open it.
        assert_eq!(seen, vec!["passphrase"]);
        assert!(matches!(r, Err(Error::WrongSecret)));
        let (got, id) = c
            .unlock_passphrase(&Passphrase::new(b"pw".to_vec()))
            .unwrap();
        assert_eq!((got.expose(), id), (mk.expose(), 1));
    }

    #[test]
    fn errors_are_reported_only_when_nothing_opens() {
        let (mut c, mk) = volume();
        let kek = Kek::random();
        c.add_slot(&mk, "keyfile", "", Fields::new(), &kek, [2; 12])
            .unwrap();
        c.seal(&mk);
        let r = c.unlock_with(|s| match s.id() {
            1 => Err(Error::Refused("token absent".into())),
            _ => Ok(Some(kek.clone())),
        });
        assert_eq!(r.unwrap().slot_id, 2);
        let r = c.unlock_with(|s| match s.id() {
            1 => Err(Error::Refused("token absent".into())),
            _ => Ok(None),
        });
        assert!(matches!(r, Err(Error::Refused(_))));
    }

    #[test]
    fn replace_rewrap_remove() {
        let (mut c, mk) = volume();
        let (fields, kek) =
            passphrase::new_slot(&Passphrase::new(b"new".to_vec()), cheap(), &[3; 32]).unwrap();
        c.replace_slot(1, &mk, kind::PASSPHRASE, "main", fields, &kek, [4; 12])
            .unwrap();
        c.seal(&mk);
        assert!(c
            .unlock_passphrase(&Passphrase::new(b"pw".to_vec()))
            .is_err());
        let u = c
            .unlock_passphrase_full(&Passphrase::new(b"new".to_vec()))
            .unwrap();
        assert_eq!(u.slot_id, 1);
        let mk2 = MasterKey::generate();
        c.rewrap_slot(1, u.kek.as_ref().unwrap(), &mk2, [5; 12])
            .unwrap();
        c.seal(&mk2);
        let (got, _) = c
            .unlock_passphrase(&Passphrase::new(b"new".to_vec()))
            .unwrap();
        assert_eq!(got.expose(), mk2.expose());
        c.remove_slot(1).unwrap();
        assert!(c.remove_slot(1).is_err());
    }

    #[test]
    fn tampered_config_is_refused_after_a_slot_opens() {
        let (c, _) = volume();
        let json = c
            .to_json()
            .replace("\"label\": \"main\"", "\"label\": \"evil\"");
        let c = VolumeConfig::parse(&json).unwrap();
        // The label is in the wrap AAD, so the slot itself no longer opens.
        assert!(c
            .unlock_passphrase(&Passphrase::new(b"pw".to_vec()))
            .is_err());
    }
}
