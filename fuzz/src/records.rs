//! The input format of the `slots` target: key slots as binary records, so that the fuzzer
//! mutates the bytes of binary fields (the wrapped key, an age file, a salt) directly instead of
//! their base64url text.
//!
//! A record is `tag(1) || len(2, little-endian) || value(len)`; tag `0xFF` (no length or
//! value) starts the next slot. The tag names a field ([`FIELDS`], modulo its length); the
//! value of a binary field ([`BINARY`]) is stored base64url-encoded, any other as text (invalid
//! UTF-8 replaced). A record cut short by the end of the input takes what is left.

use cloakfs_core::text::{b64, unb64, Fields};

/// Field names a tag selects.
pub const FIELDS: [&str; 20] = [
    "id",
    "kind",
    "label",
    "wrapped",
    "kdf",
    "argon2_memory_kib",
    "argon2_iterations",
    "argon2_lanes",
    "salt",
    "recipient_types",
    "age",
    "threshold",
    "shares",
    "pkcs11_token",
    "pkcs11_object",
    "gpg_recipients",
    "gpg",
    "key_source",
    "Bad Field",
    "extra",
];
/// Fields whose record value is raw bytes, stored as base64url.
pub const BINARY: [&str; 4] = ["wrapped", "salt", "age", "gpg"];
/// The tag that starts the next slot.
pub const NEXT_SLOT: u8 = 0xFF;

/// The slots (as field maps) that `data` describes.
pub fn decode(data: &[u8]) -> Vec<Fields> {
    let mut slots = vec![Fields::new()];
    let mut rest = data;
    while let Some((&tag, after)) = rest.split_first() {
        rest = after;
        if tag == NEXT_SLOT {
            slots.push(Fields::new());
            continue;
        }
        let len = match rest {
            [a, b, ..] => usize::from(u16::from_le_bytes([*a, *b])),
            _ => rest.len(),
        };
        rest = rest.get(2..).unwrap_or_default();
        let (value, after) = rest.split_at(len.min(rest.len()));
        rest = after;
        let name = FIELDS[usize::from(tag) % FIELDS.len()];
        let value = if BINARY.contains(&name) {
            b64(value)
        } else {
            String::from_utf8_lossy(value).into_owned()
        };
        slots
            .last_mut()
            .expect("one slot")
            .insert(name.into(), value);
    }
    slots
}

/// The records of `slots` (the inverse of [`decode`] for fields named in [`FIELDS`]).
pub fn encode(slots: &[&Fields]) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, fields) in slots.iter().enumerate() {
        if i > 0 {
            out.push(NEXT_SLOT);
        }
        for (k, v) in fields.iter() {
            let Some(tag) = FIELDS.iter().position(|f| f == k) else {
                continue;
            };
            let value = if BINARY.contains(&k.as_str()) {
                unb64(v.as_bytes()).unwrap_or_else(|| v.as_bytes().to_vec())
            } else {
                v.as_bytes().to_vec()
            };
            out.push(tag as u8);
            out.extend_from_slice(&(value.len() as u16).to_le_bytes());
            out.extend_from_slice(&value);
        }
    }
    out
}
