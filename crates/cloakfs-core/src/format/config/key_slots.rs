//! The config's key slots: listing, adding, replacing, re-wrapping and removing them, and
//! unlocking the volume through them: the methods of [`VolumeConfig`] that use
//! [`crate::slots`]. They live here, above slots, so that slots never imports format.

use super::{KeySource, VolumeConfig};
use crate::crypto::kdf::Argon2Params;
use crate::crypto::keys::MasterKey;
use crate::crypto::secret::Passphrase;
use crate::error::{Error, Result};
use crate::slots::{kind, passphrase, Kek, KeySlot, SlotRandomness, Unlocked};
use crate::text::Fields;

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
        let mut slot = KeySlot::new(id, kind, label, fields)?;
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
        if let KeySource::Passphrase { kdf, salt } = self.key_source() {
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

    fn volume() -> (VolumeConfig, MasterKey) {
        let mk = MasterKey::generate();
        let mut c = VolumeConfig::new(VolumeParams::new());
        c.add_passphrase_slot(
            &mk,
            &Passphrase::new(b"pw".to_vec()),
            Argon2Params::LEAST,
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
        let (fields, kek) = passphrase::new_slot(
            &Passphrase::new(b"new".to_vec()),
            Argon2Params::LEAST,
            &[3; 32],
        )
        .unwrap();
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
