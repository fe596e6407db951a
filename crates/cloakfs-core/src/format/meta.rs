//! Encryption of symlink targets and extended attributes.
//!
//! - symlink target: base64url(nonce || AES-256-GCM(metadata key, nonce, target,
//!   aad = "symlink") || tag), 12-byte random nonce; a target longer than
//!   [`SYMLINK_INLINE_MAX`] keeps those sealed bytes in a file of its own instead (see
//!   `crate::io::long_targets`), and the backing symlink names that file;
//! - user xattr name `user.N`: stored as `user.` + base64url(SIV(xattr-names key,
//!   headers = ["xattr"], N)); other namespaces (security, system, trusted) pass through;
//! - user xattr value: nonce || AES-256-GCM(metadata key, nonce, value,
//!   aad = "xattr:" || stored name) || tag.

use crate::crypto::locked::{scrubbed, LockedBox};
use crate::crypto::secret::SecretBytes;
use crate::error::{Error, Result};
use crate::format::names::NameCodec;
use crate::text::{b64, unb64};
use aes_gcm::aead::{AeadInPlace, KeyInit};
use aes_gcm::Aes256Gcm;

const NONCE_LEN: usize = 12;
const TAG_LEN: usize = 16;
/// Longest plaintext symlink target stored in the backing symlink itself (encoded: at most
/// 4038 characters, below PATH_MAX).
pub const SYMLINK_INLINE_MAX: usize = 3000;
/// Longest plaintext symlink target: PATH_MAX - 1, as on any Linux file system.
pub const SYMLINK_MAX: usize = 4095;
/// The backing target of a symlink whose target is stored apart: this, then the name of the
/// file in [`LONG_TARGETS_DIR`] that holds it.
pub const LONG_TARGET_PREFIX: &str = "cloakfs.symlink.";
/// The directory, in the root of the cipher directory, of the long symlink targets.
pub const LONG_TARGETS_DIR: &str = "cloakfs.symlinks";

/// A symlink target sealed for storage.
#[derive(Debug, Clone, PartialEq)]
pub enum SealedTarget {
    /// Stored as the backing symlink's own target (this text).
    Inline(String),
    /// Stored apart: `sealed` in file `LONG_TARGETS_DIR/name`, where `name` is
    /// base64url(SHA-256(sealed)); the backing symlink's target is [`LONG_TARGET_PREFIX`]
    /// and `name`.
    Long {
        /// The file name: base64url(SHA-256(sealed)).
        name: String,
        /// The sealed target: nonce, ciphertext, tag.
        sealed: Vec<u8>,
    },
}

impl SealedTarget {
    /// What the backing symlink points to.
    pub fn backing_target(&self) -> String {
        match self {
            SealedTarget::Inline(t) => t.clone(),
            SealedTarget::Long { name, .. } => format!("{LONG_TARGET_PREFIX}{name}"),
        }
    }
}

/// The name of the long-target file a backing symlink target points to (`None` for a target
/// stored inline). Checks only the form: 43 base64url characters.
pub fn long_target_name(stored: &[u8]) -> Option<&str> {
    let name = std::str::from_utf8(stored.strip_prefix(LONG_TARGET_PREFIX.as_bytes())?).ok()?;
    (name.len() == 43 && unb64(name.as_bytes()).is_some_and(|h| h.len() == 32)).then_some(name)
}

/// The name a long target's sealed bytes are stored under: base64url(SHA-256(sealed)).
pub fn long_target_file_name(sealed: &[u8]) -> String {
    use sha2::Digest;
    b64(&sha2::Sha256::digest(sealed))
}
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

    /// Seals a plaintext symlink target: inline up to [`SYMLINK_INLINE_MAX`] bytes, apart
    /// up to [`SYMLINK_MAX`]; longer is ENAMETOOLONG, an empty target ENOENT (as symlink(2)).
    pub fn encrypt_symlink(&self, target: &[u8]) -> Result<SealedTarget> {
        self.seal_target(&crate::crypto::random::array(), target)
    }

    /// Like [`MetaCodec::encrypt_symlink`] with a given nonce (test vectors, and the reverse
    /// view's derived nonces).
    pub fn encrypt_symlink_with_nonce(
        &self,
        nonce: &[u8; NONCE_LEN],
        target: &[u8],
    ) -> Result<SealedTarget> {
        self.seal_target(nonce, target)
    }

    fn seal_target(&self, nonce: &[u8; NONCE_LEN], target: &[u8]) -> Result<SealedTarget> {
        if target.is_empty() {
            return Err(Error::Io(std::io::Error::from_raw_os_error(libc::ENOENT)));
        }
        if target.len() > SYMLINK_MAX {
            return Err(Error::NameTooLong);
        }
        let sealed = self.seal_with_nonce(nonce, b"symlink", target);
        if target.len() <= SYMLINK_INLINE_MAX {
            return Ok(SealedTarget::Inline(b64(&sealed)));
        }
        Ok(SealedTarget::Long {
            name: long_target_file_name(&sealed),
            sealed,
        })
    }

    /// The plaintext target of a backing symlink target stored inline.
    pub fn decrypt_symlink(&self, stored: &[u8]) -> Result<Vec<u8>> {
        if long_target_name(stored).is_some() {
            return Err(Error::Tampered(
                "symlink target is stored apart (read it with io::long_targets)".into(),
            ));
        }
        let sealed = unb64(stored)
            .ok_or_else(|| Error::Tampered("symlink target is not base64url".into()))?;
        let t = self.open(b"symlink", &sealed, "symlink target")?;
        if t.is_empty() || t.len() > SYMLINK_INLINE_MAX {
            return Err(Error::Tampered(
                "symlink target of a length not stored inline".into(),
            ));
        }
        Ok(t)
    }

    /// The plaintext of a long target: `sealed`, the content of file `name` of the
    /// long-target directory. The name must be the hash of the content, and the target
    /// longer than what is stored inline (each target has one stored form).
    pub fn open_long_target(&self, name: &str, sealed: &[u8]) -> Result<Vec<u8>> {
        if long_target_file_name(sealed) != name {
            return Err(Error::Tampered(format!(
                "long symlink target {name} does not match its name"
            )));
        }
        let t = self.open(b"symlink", sealed, "symlink target")?;
        if t.len() <= SYMLINK_INLINE_MAX || t.len() > SYMLINK_MAX {
            return Err(Error::Tampered(
                "symlink target of a length not stored apart".into(),
            ));
        }
        Ok(t)
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
        let SealedTarget::Inline(s) = c.encrypt_symlink(b"../some/where").unwrap() else {
            panic!("a short target is stored inline");
        };
        assert!(!s.contains("some"));
        assert_eq!(c.decrypt_symlink(s.as_bytes()).unwrap(), b"../some/where");
        let SealedTarget::Inline(max) = c.encrypt_symlink(&[b'a'; SYMLINK_INLINE_MAX]).unwrap()
        else {
            panic!("{SYMLINK_INLINE_MAX} bytes are stored inline");
        };
        assert!(max.len() < 4096);
        assert!(c.encrypt_symlink(&[b'a'; SYMLINK_MAX + 1]).is_err());
        assert!(c.encrypt_symlink(b"").is_err());
        let mut t = s.into_bytes();
        t[5] ^= 1;
        assert!(c.decrypt_symlink(&t).is_err());
    }

    #[test]
    fn long_symlink_targets_are_stored_apart() {
        let c = codec();
        let target = vec![b'x'; SYMLINK_MAX];
        let long = c.encrypt_symlink(&target).unwrap();
        let SealedTarget::Long { name, sealed } = &long else {
            panic!("{SYMLINK_MAX} bytes do not fit inline");
        };
        let backing = long.backing_target();
        assert_eq!(long_target_name(backing.as_bytes()), Some(name.as_str()));
        assert!(backing.len() < 64);
        assert!(c.decrypt_symlink(backing.as_bytes()).is_err());
        assert_eq!(c.open_long_target(name, sealed).unwrap(), target);
        // Content and name belong together; a flipped bit fails either way.
        let mut bad = sealed.clone();
        bad[20] ^= 1;
        assert!(c.open_long_target(name, &bad).is_err());
        assert!(c
            .open_long_target(&long_target_file_name(&bad), &bad)
            .is_err());
        // A short target sealed into a file is not its stored form.
        let short = c.seal_with_nonce(&[0; 12], b"symlink", b"short");
        assert!(c
            .open_long_target(&long_target_file_name(&short), &short)
            .is_err());
        assert_eq!(long_target_name(b"cloakfs.symlink.short"), None);
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
