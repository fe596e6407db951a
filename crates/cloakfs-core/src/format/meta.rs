//! Encryption of symlink targets and extended attributes.
//!
//! - symlink target: base64url(nonce || AES-256-GCM(metadata key, nonce, target,
//!   aad = "symlink") || tag), 12-byte random nonce;
//! - user xattr name `user.N`: stored as `user.` + base64url(SIV(xattr-names key,
//!   headers = ["xattr"], N)); other namespaces (security, system, trusted) pass through;
//! - user xattr value: nonce || AES-256-GCM(metadata key, nonce, value,
//!   aad = "xattr:" || stored name) || tag.

use crate::crypto::locked::{scrubbed, LockedBox};
use crate::crypto::secret::SecretBytes;
use crate::error::{Error, Result};
use crate::format::encoding::{b64, unb64};
use crate::format::names::NameCodec;
use aes_gcm::aead::{AeadInPlace, KeyInit};
use aes_gcm::Aes256Gcm;

const NONCE_LEN: usize = 12;
const TAG_LEN: usize = 16;
/// Longest plaintext symlink target that still fits PATH_MAX once encrypted and encoded.
pub const SYMLINK_MAX: usize = 3000;
/// Namespace prefix of encrypted extended attributes.
pub const USER_XATTR_PREFIX: &str = "user.";
/// Longest plaintext xattr value (the Linux limit minus our overhead).
pub const XATTR_VALUE_MAX: usize = 65536 - NONCE_LEN - TAG_LEN;

/// Seals symlink targets and xattrs.
///
/// The metadata key's schedule is in locked memory: RustCrypto's `Aes256Gcm` holds its AES
/// schedule and GHASH key inline. Each operation is scrubbed, since aes-gcm copies the GHASH
/// key onto the stack and leaves it there.
pub struct MetaCodec {
    aead: LockedBox<Aes256Gcm>,
    xattr_names: NameCodec,
}

impl std::fmt::Debug for MetaCodec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MetaCodec(..)")
    }
}

impl MetaCodec {
    /// A codec from the metadata key and the xattr-names SIV key.
    pub fn new(metadata_key: SecretBytes<32>, xattr_names_key: SecretBytes<64>) -> Self {
        Self {
            aead: LockedBox::new(|| Aes256Gcm::new(metadata_key.expose().into())),
            xattr_names: NameCodec::new(xattr_names_key, usize::MAX),
        }
    }

    fn seal_with_nonce(&self, nonce: &[u8; NONCE_LEN], aad: &[u8], data: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(NONCE_LEN + data.len() + TAG_LEN);
        out.extend_from_slice(nonce);
        out.extend_from_slice(data);
        let tag = scrubbed(|| {
            self.aead
                .encrypt_in_place_detached(nonce.into(), aad, &mut out[NONCE_LEN..])
        })
        .expect("metadata is far below the AEAD length limit");
        out.extend_from_slice(&tag);
        out
    }

    fn seal(&self, aad: &[u8], data: &[u8]) -> Vec<u8> {
        self.seal_with_nonce(&crate::crypto::random::array(), aad, data)
    }

    fn open(&self, aad: &[u8], sealed: &[u8], what: &str) -> Result<Vec<u8>> {
        let bad = || Error::Tampered(format!("{what} does not authenticate"));
        if sealed.len() < NONCE_LEN + TAG_LEN {
            return Err(bad());
        }
        let (nonce, rest) = sealed.split_at(NONCE_LEN);
        let (body, tag) = rest.split_at(rest.len() - TAG_LEN);
        let mut out = body.to_vec();
        scrubbed(|| {
            self.aead
                .decrypt_in_place_detached(nonce.into(), aad, &mut out, tag.into())
        })
        .map_err(|_| bad())?;
        Ok(out)
    }

    /// The backing target for a plaintext symlink target.
    pub fn encrypt_symlink(&self, target: &[u8]) -> Result<String> {
        if target.len() > SYMLINK_MAX {
            return Err(Error::NameTooLong);
        }
        Ok(b64(&self.seal(b"symlink", target)))
    }

    /// Like [`MetaCodec::encrypt_symlink`] with a fixed nonce (test vectors only).
    pub fn encrypt_symlink_with_nonce(&self, nonce: &[u8; NONCE_LEN], target: &[u8]) -> String {
        b64(&self.seal_with_nonce(nonce, b"symlink", target))
    }

    /// The plaintext target of a backing symlink target.
    pub fn decrypt_symlink(&self, stored: &[u8]) -> Result<Vec<u8>> {
        let sealed = unb64(stored)
            .ok_or_else(|| Error::Tampered("symlink target is not base64url".into()))?;
        self.open(b"symlink", &sealed, "symlink target")
    }

    /// The backing xattr name for a plaintext one; `None` for names outside `user.` (passed
    /// through unencrypted, e.g. POSIX ACLs).
    pub fn encrypt_xattr_name(&self, name: &[u8]) -> Result<Option<Vec<u8>>> {
        let Some(rest) = name.strip_prefix(USER_XATTR_PREFIX.as_bytes()) else {
            return Ok(None);
        };
        if rest.is_empty() || rest.contains(&0) {
            return Err(Error::InvalidName);
        }
        let mut out = USER_XATTR_PREFIX.as_bytes().to_vec();
        out.extend_from_slice(b64(&self.xattr_names.seal_raw(b"xattr", rest)).as_bytes());
        if out.len() > 255 {
            return Err(Error::NameTooLong);
        }
        Ok(Some(out))
    }

    /// The plaintext name of a backing xattr name; names outside `user.` pass through.
    pub fn decrypt_xattr_name(&self, stored: &[u8]) -> Result<Vec<u8>> {
        let Some(rest) = stored.strip_prefix(USER_XATTR_PREFIX.as_bytes()) else {
            return Ok(stored.to_vec());
        };
        let bad = || Error::Tampered("xattr name does not decrypt".into());
        let sealed = unb64(rest).ok_or_else(bad)?;
        let plain = self
            .xattr_names
            .open_raw(b"xattr", &sealed)
            .ok_or_else(bad)?;
        let mut out = USER_XATTR_PREFIX.as_bytes().to_vec();
        out.extend_from_slice(&plain);
        Ok(out)
    }

    fn xattr_aad(stored_name: &[u8]) -> Vec<u8> {
        [b"xattr:".as_slice(), stored_name].concat()
    }

    /// Seals an xattr value stored under `stored_name`.
    pub fn encrypt_xattr_value(&self, stored_name: &[u8], value: &[u8]) -> Result<Vec<u8>> {
        if value.len() > XATTR_VALUE_MAX {
            return Err(Error::Io(std::io::Error::from_raw_os_error(libc::E2BIG)));
        }
        Ok(self.seal(&Self::xattr_aad(stored_name), value))
    }

    /// Opens an xattr value stored under `stored_name`.
    pub fn decrypt_xattr_value(&self, stored_name: &[u8], sealed: &[u8]) -> Result<Vec<u8>> {
        self.open(&Self::xattr_aad(stored_name), sealed, "xattr value")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn codec() -> MetaCodec {
        MetaCodec::new(
            SecretBytes::from_slice(&[5; 32]),
            SecretBytes::from_slice(&[6; 64]),
        )
    }

    #[test]
    fn symlinks() {
        let c = codec();
        let s = c.encrypt_symlink(b"../some/where").unwrap();
        assert!(!s.contains("some"));
        assert_eq!(c.decrypt_symlink(s.as_bytes()).unwrap(), b"../some/where");
        let max = c.encrypt_symlink(&[b'a'; SYMLINK_MAX]).unwrap();
        assert!(max.len() < 4096);
        assert!(c.encrypt_symlink(&[b'a'; SYMLINK_MAX + 1]).is_err());
        let mut t = s.into_bytes();
        t[5] ^= 1;
        assert!(c.decrypt_symlink(&t).is_err());
    }

    #[test]
    fn xattrs() {
        let c = codec();
        let n = c.encrypt_xattr_name(b"user.secret").unwrap().unwrap();
        assert!(n.starts_with(b"user."));
        assert_eq!(c.decrypt_xattr_name(&n).unwrap(), b"user.secret");
        assert_eq!(
            c.encrypt_xattr_name(b"system.posix_acl_access").unwrap(),
            None
        );
        let v = c.encrypt_xattr_value(&n, b"value").unwrap();
        assert_eq!(c.decrypt_xattr_value(&n, &v).unwrap(), b"value");
        let other = c.encrypt_xattr_name(b"user.other").unwrap().unwrap();
        assert!(
            c.decrypt_xattr_value(&other, &v).is_err(),
            "value bound to its name"
        );
    }
}
