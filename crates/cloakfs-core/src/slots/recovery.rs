//! `recovery` slots: a random 256-bit recovery key, shown once to the user in a typeable form;
//! KEK = HKDF-SHA256(IKM = recovery key, salt = the slot's `salt`, info =
//! `"cloakfs v1 slot recovery"`, L = 32).
//!
//! Typeable form: the 35 bytes `key(32) || check(3)`, where `check` is the first 3 bytes of
//! SHA-256(`"cloakfs recovery key v1"` || key), in Crockford base32 (alphabet
//! `0123456789ABCDEFGHJKMNPQRSTVWXYZ`, most significant bit first: 280 bits, 56 symbols),
//! written as 14 groups of 4 symbols joined by `-`. Reading ignores case, spaces and `-`, and
//! takes `O` for `0` and `I`, `L` for `1`; a wrong checksum is reported as a typo.
//!
//! Fields: `salt` (b64 of 32 random bytes).

use super::{Kek, KeySlot};
use crate::crypto::keys::hkdf_expand;
use crate::crypto::secret::SecretBytes;
use crate::error::{Error, Result};
use crate::text::{b64, Fields};
use sha2::{Digest, Sha256};
use zeroize::Zeroizing;

/// Fields of a recovery slot besides the common ones.
pub const FIELDS: &[&str] = &["salt"];
/// HKDF info label (after the `"cloakfs v1 "` prefix).
pub const INFO_LABEL: &str = "slot recovery";
/// Domain of the checksum of the typeable form.
pub const CHECK_DOMAIN: &str = "cloakfs recovery key v1";
const ALPHABET: &[u8; 32] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";
const SYMBOLS: usize = 56;

/// A recovery key.
#[derive(Clone, Debug)]
pub struct RecoveryKey(SecretBytes<32>);

impl RecoveryKey {
    /// A fresh random recovery key.
    pub fn generate() -> Self {
        Self(SecretBytes::random())
    }

    /// A recovery key from known bytes (test vectors).
    pub fn from_bytes(bytes: &[u8; 32]) -> Self {
        Self(SecretBytes::from_slice(bytes))
    }

    /// The raw key.
    pub fn expose(&self) -> &[u8; 32] {
        self.0.expose()
    }

    fn check(key: &[u8]) -> [u8; 3] {
        let d = Sha256::new()
            .chain_update(CHECK_DOMAIN.as_bytes())
            .chain_update(key)
            .finalize();
        [d[0], d[1], d[2]]
    }

    /// The typeable form: 14 groups of 4 Crockford base32 symbols joined by `-`.
    pub fn encode(&self) -> Zeroizing<String> {
        let mut bytes = Zeroizing::new(self.expose().to_vec());
        bytes.extend_from_slice(&Self::check(self.expose()));
        let mut out = Zeroizing::new(String::with_capacity(SYMBOLS + 13));
        for i in 0..SYMBOLS {
            if i > 0 && i % 4 == 0 {
                out.push('-');
            }
            let mut v = 0u8;
            for b in 0..5 {
                let bit = i * 5 + b;
                v = (v << 1) | ((bytes[bit / 8] >> (7 - bit % 8)) & 1);
            }
            out.push(ALPHABET[v as usize] as char);
        }
        out
    }

    /// Reads the typeable form (case, spaces and dashes do not matter).
    pub fn parse(text: &str) -> Result<Self> {
        let bad = |m: &str| Error::InvalidSecret(format!("invalid recovery key: {m}"));
        let mut values = Zeroizing::new(Vec::with_capacity(SYMBOLS));
        for c in text.chars() {
            if c == '-' || c.is_whitespace() {
                continue;
            }
            let c = match c.to_ascii_uppercase() {
                'O' => '0',
                'I' | 'L' => '1',
                c => c,
            };
            match ALPHABET.iter().position(|&a| a as char == c) {
                Some(v) => values.push(v as u8),
                None => return Err(bad("it contains a character that is not in the alphabet")),
            }
        }
        if values.len() != SYMBOLS {
            return Err(bad(&format!(
                "it has {} symbols instead of {SYMBOLS}",
                values.len()
            )));
        }
        let mut bytes = Zeroizing::new([0u8; 35]);
        for (i, v) in values.iter().enumerate() {
            for b in 0..5 {
                let bit = i * 5 + b;
                if (v >> (4 - b)) & 1 == 1 {
                    bytes[bit / 8] |= 1 << (7 - bit % 8);
                }
            }
        }
        let key: [u8; 32] = bytes[..32].try_into().expect("32 bytes");
        if Self::check(&key) != bytes[32..35] {
            return Err(bad("checksum mismatch (a typo?)"));
        }
        let k = Self::from_bytes(&key);
        let mut key = key;
        zeroize::Zeroize::zeroize(&mut key);
        Ok(k)
    }
}

/// The KEK of a recovery key under a slot's salt.
pub fn derive(key: &RecoveryKey, salt: &[u8; 32]) -> Kek {
    hkdf_expand(key.expose(), Some(salt), INFO_LABEL.as_bytes(), &[])
}

/// Fields and KEK of a new recovery slot for `key`.
pub fn new_slot(key: &RecoveryKey, salt: &[u8; 32]) -> (Fields, Kek) {
    let mut f = Fields::new();
    f.insert("salt".into(), b64(salt));
    (f, derive(key, salt))
}

/// The KEK a recovery key gives for `slot`.
pub fn kek(slot: &KeySlot, key: &RecoveryKey) -> Result<Kek> {
    let salt: [u8; 32] = slot.bytes("salt")?;
    Ok(derive(key, &salt))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_typos() {
        let k = RecoveryKey::generate();
        let text = k.encode();
        assert_eq!(text.len(), 56 + 13);
        let back = RecoveryKey::parse(&text).unwrap();
        assert_eq!(back.expose(), k.expose());
        // Lower case, no dashes, O for 0 and l for 1 all read the same.
        let sloppy: String = text
            .chars()
            .filter(|c| *c != '-')
            .map(|c| match c {
                '0' => 'o',
                '1' => 'l',
                c => c.to_ascii_lowercase(),
            })
            .collect();
        assert_eq!(RecoveryKey::parse(&sloppy).unwrap().expose(), k.expose());
        // One changed symbol is caught by the checksum.
        let mut typo: Vec<char> = text.chars().collect();
        typo[5] = if typo[5] == 'A' { 'B' } else { 'A' };
        let typo: String = typo.into_iter().collect();
        let e = RecoveryKey::parse(&typo).unwrap_err().to_string();
        assert!(e.contains("checksum"), "{e}");
        assert!(RecoveryKey::parse("ABCD").is_err());
        assert!(RecoveryKey::parse(&format!("{}U", &text[1..])).is_err());
    }
}
