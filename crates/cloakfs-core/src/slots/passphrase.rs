//! `passphrase` slots: KEK = Argon2id(passphrase, salt, m, t, p), 32 bytes.
//!
//! Fields: `kdf` (`argon2id`), `argon2_memory_kib`, `argon2_iterations`, `argon2_lanes`,
//! `salt` (b64 of 32 random bytes). The same fields describe the key of a volume without a
//! stored key (volume section, `key_source = passphrase`).

use super::{Kek, KeySlot};
use crate::crypto::kdf::{self, Argon2Params, SALT_LEN};
use crate::crypto::secret::Passphrase;
use crate::error::{Error, Result};
use crate::text::{b64, get, parse_b64, parse_num, Fields};

/// Fields of a passphrase slot besides the common ones.
pub const FIELDS: &[&str] = &[
    "kdf",
    "argon2_memory_kib",
    "argon2_iterations",
    "argon2_lanes",
    "salt",
];

/// The stored fields for these parameters and salt.
pub fn fields(params: &Argon2Params, salt: &[u8; SALT_LEN]) -> Fields {
    let mut f = Fields::new();
    f.insert("kdf".into(), "argon2id".into());
    f.insert("argon2_memory_kib".into(), params.memory_kib.to_string());
    f.insert("argon2_iterations".into(), params.iterations.to_string());
    f.insert("argon2_lanes".into(), params.lanes.to_string());
    f.insert("salt".into(), b64(salt));
    f
}

/// The Argon2id parameters stored in `f`, checked against the accepted bounds.
pub fn params(f: &Fields) -> Result<Argon2Params> {
    let kdf = get(f, "kdf")?;
    if kdf != "argon2id" {
        return Err(Error::ConfigDamaged(format!("unknown kdf {kdf:?}")));
    }
    let p = Argon2Params {
        memory_kib: parse_num(f, "argon2_memory_kib")?,
        iterations: parse_num(f, "argon2_iterations")?,
        lanes: parse_num(f, "argon2_lanes")?,
    };
    p.validate()?;
    Ok(p)
}

/// Fields and KEK of a new passphrase slot.
pub fn new_slot(
    pass: &Passphrase,
    params: Argon2Params,
    salt: &[u8; SALT_LEN],
) -> Result<(Fields, Kek)> {
    let kek = kdf::derive(pass, salt, &params)?;
    Ok((fields(&params, salt), kek))
}

/// The KEK a passphrase gives for `slot`.
pub fn kek(slot: &KeySlot, pass: &Passphrase) -> Result<Kek> {
    let params = slot.argon2()?;
    let salt: [u8; SALT_LEN] = parse_b64(slot.fields(), "salt")
        .map_err(|e| Error::ConfigDamaged(format!("slot {}: {e}", slot.id())))?;
    kdf::derive(pass, &salt, &params)
}
