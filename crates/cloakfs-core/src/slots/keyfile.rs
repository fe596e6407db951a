//! `keyfile` slots: KEK = HKDF-SHA256(IKM = the key file's bytes, salt = the slot's `salt`,
//! info = `"cloakfs v1 slot keyfile"`, L = 32).
//!
//! HKDF does not stretch: the key file must carry the entropy itself (e.g. 64 bytes from
//! /dev/urandom). Any bytes work; the whole file is used, not its first line.
//!
//! Fields: `salt` (b64 of 32 random bytes).

use super::{Kek, KeySlot};
use crate::crypto::keys::hkdf_expand;
use crate::error::{Error, Result};
use crate::text::{b64, Fields};

/// Fields of a keyfile slot besides the common ones.
pub const FIELDS: &[&str] = &["salt"];
/// HKDF info label (after the `"cloakfs v1 "` prefix).
pub const INFO_LABEL: &str = "slot keyfile";
/// Largest key file read (as cryptsetup's default limit).
pub const MAX_LEN: usize = 8 << 20;
/// Shortest key file accepted for a new slot (a key file is not stretched like a passphrase).
pub const MIN_NEW_LEN: usize = 16;

/// The KEK of a key file under a slot's salt.
pub fn derive(key_file: &[u8], salt: &[u8; 32]) -> Kek {
    hkdf_expand(key_file, Some(salt), INFO_LABEL.as_bytes(), &[])
}

/// Fields and KEK of a new keyfile slot.
pub fn new_slot(key_file: &[u8], salt: &[u8; 32]) -> Result<(Fields, Kek)> {
    if key_file.len() < MIN_NEW_LEN {
        return Err(Error::Refused(format!(
            "key file too short ({} bytes): use at least {MIN_NEW_LEN} random bytes, e.g. \
             head -c 64 /dev/urandom > FILE",
            key_file.len()
        )));
    }
    if key_file.len() > MAX_LEN {
        return Err(Error::Refused(format!(
            "key file too large (more than {MAX_LEN} bytes)"
        )));
    }
    let mut f = Fields::new();
    f.insert("salt".into(), b64(salt));
    Ok((f, derive(key_file, salt)))
}

/// The KEK a key file gives for `slot`.
pub fn kek(slot: &KeySlot, key_file: &[u8]) -> Result<Kek> {
    let salt: [u8; 32] = slot.bytes("salt")?;
    Ok(derive(key_file, &salt))
}
