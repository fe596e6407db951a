//! The text forms of stored values: unpadded base64url, and the flat string-field maps of the
//! config's volume section and of each key slot, with their strict parsers. Both `format` (the
//! config, names, metadata) and `slots` (each slot's fields) use them; this module sits below
//! both and uses neither.

use crate::error::{Error, Result};
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use std::collections::BTreeMap;

/// Encodes bytes as unpadded base64url.
pub fn b64(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

/// Decodes unpadded base64url; rejects padding, other alphabets and non-canonical trailing bits,
/// so every byte string has exactly one accepted encoding.
pub fn unb64(text: &[u8]) -> Option<Vec<u8>> {
    URL_SAFE_NO_PAD.decode(text).ok()
}

/// Decodes unpadded base64url into exactly `N` bytes.
pub fn unb64_array<const N: usize>(text: &str) -> Option<[u8; N]> {
    unb64(text.as_bytes())?.try_into().ok()
}

/// A flat map of string fields, the shape of both the volume section and each slot.
pub type Fields = BTreeMap<String, String>;

/// Field `k`, or a "damaged config" error naming it.
pub(crate) fn get<'a>(f: &'a Fields, k: &str) -> Result<&'a str> {
    f.get(k)
        .map(String::as_str)
        .ok_or_else(|| Error::ConfigDamaged(format!("missing field {k:?}")))
}

/// Field `k` as a canonical decimal number (no sign, no leading zero).
pub(crate) fn parse_num<T: std::str::FromStr>(f: &Fields, k: &str) -> Result<T> {
    let v = get(f, k)?;
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) || (v.len() > 1 && v.starts_with('0'))
    {
        return Err(Error::ConfigDamaged(format!("field {k:?} is not a number")));
    }
    v.parse()
        .map_err(|_| Error::ConfigDamaged(format!("field {k:?} is out of range")))
}

/// Field `k` as base64url of exactly `N` bytes.
pub(crate) fn parse_b64<const N: usize>(f: &Fields, k: &str) -> Result<[u8; N]> {
    unb64_array(get(f, k)?)
        .ok_or_else(|| Error::ConfigDamaged(format!("field {k:?} is not {N} base64url bytes")))
}
