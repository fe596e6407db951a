//! `gpg` slots (seed 003: the GnuPG key module): the KEK is random and stored encrypted by
//! `gpg --encrypt` to one or more OpenPGP keys; unlocking runs `gpg --decrypt`, so the user's
//! gpg-agent (and its pinentry, smart card, ...) supplies the private key.
//!
//! Fields: `gpg_recipients` (comma-separated key IDs as given, for display) and `gpg` (b64 of
//! the binary OpenPGP message whose plaintext is the 32-byte KEK).

use crate::failure::{code, Failure, Result};
use cloakfs_core::slots::gpg::{self, DecryptError};
use cloakfs_core::slots::{Kek, KeySlot};
use cloakfs_core::text::{b64, Fields};

/// Largest `gpg` field accepted.
const MAX_CT: usize = 1 << 20;

/// Encrypts a fresh KEK to `recipients` and returns the new slot's fields and KEK.
pub fn new_slot(recipients: &[String], keep_keys: bool) -> Result<(Fields, Kek)> {
    if recipients.is_empty() {
        return Err(Failure::usage("no gpg recipient given"));
    }
    let kek = Kek::random();
    let ct = gpg::encrypt(recipients, kek.expose())?;
    let mut f = Fields::new();
    f.insert("gpg_recipients".into(), recipients.join(","));
    if keep_keys {
        // A sharing volume's file entries name gpg keys as `gpg:FINGERPRINT` (FORMAT.md
        // 18.1): kept in that form, fsck tells this member's entries from unknown keys.
        let keys = recipients
            .iter()
            .map(|id| gpg::resolve(id).map(|fpr| format!("gpg:{fpr}")))
            .collect::<cloakfs_core::error::Result<Vec<_>>>()?;
        f.insert(
            cloakfs_core::slots::recipient::KEYS_FIELD.into(),
            keys.join(","),
        );
    }
    f.insert("gpg".into(), b64(&ct));
    Ok((f, kek))
}

/// Decrypts the slot's KEK with `gpg --decrypt`.
pub fn kek(slot: &KeySlot) -> Result<Option<Kek>> {
    let ct = slot.var_bytes("gpg", MAX_CT)?;
    let pt = match gpg::decrypt(&ct) {
        Ok(pt) => pt,
        Err(DecryptError::Run(e)) => return Err(e.into()),
        Err(DecryptError::Failed(why)) => {
            return Err(Failure::new(
                code::WRONG_SECRET,
                format!("gpg could not decrypt key slot {}: {why}", slot.id()),
            ))
        }
        Err(DecryptError::NotPublicKey(what)) => {
            return Err(Failure::new(
                code::VOLUME,
                format!(
                    "key slot {} is refused: {what}; the volume config may have been replaced",
                    slot.id()
                ),
            ))
        }
    };
    let k: [u8; 32] = pt[..].try_into().map_err(|_| {
        Failure::new(
            code::VOLUME,
            format!(
                "damaged volume config: slot {}: gpg data does not hold a 32-byte key",
                slot.id()
            ),
        )
    })?;
    Ok(Some(Kek::from_slice(&k)))
}
