//! The bytes of a reverse view (docs/FORMAT.md section 17): each plaintext entry of a
//! directory shown as the backing entry an ordinary volume would hold for it, sealed with the
//! derivations of [`crate::format::reverse`] instead of randomness, so every read of the same
//! plaintext gives the same bytes. Read-only by construction: nothing here writes.
//!
//! The FUSE front end (`cloakfs-fuse`'s `reverse` module) maps requests onto these calls.

use crate::error::{Error, Result};
use crate::format::content::{ContentSuite, FileHeader, FileId};
use crate::format::layout::{Layout, HEADER_LEN};
use crate::format::names::StoredName;
use crate::format::reverse::ReverseKeys;
use crate::Volume;
use std::fs::File;
use std::os::unix::fs::FileExt;

/// An unlocked volume serving as the key of a reverse view.
pub struct ReverseView {
    volume: Volume,
    keys: ReverseKeys,
    layout: Layout,
}

impl std::fmt::Debug for ReverseView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReverseView").finish_non_exhaustive()
    }
}

impl ReverseView {
    /// A view keyed by `volume`, whose content suite must be AES-256-GCM-SIV (the only one
    /// that may seal with derived nonces).
    pub fn new(volume: Volume) -> Result<Self> {
        if volume.content().suite() != ContentSuite::Aes256GcmSiv {
            return Err(Error::Refused(format!(
                "a reverse view needs a config with content cipher aes-256-gcm-siv (this one \
                 has {}): make it with cloakfs init --reverse",
                volume.content().suite().name()
            )));
        }
        let keys = ReverseKeys::new(volume.master_key(), &volume.config().params.volume_id);
        let layout = volume.content().layout();
        Ok(Self {
            volume,
            keys,
            layout,
        })
    }

    /// The volume whose keys seal the view.
    pub fn volume(&self) -> &Volume {
        &self.volume
    }

    /// The stored name of plaintext entry `name` of the directory at relative path `dir`.
    pub fn stored_name(&self, dir: &[u8], name: &[u8]) -> Result<StoredName> {
        self.volume.names().encrypt(&self.keys.dir_id(dir), name)
    }

    /// The plaintext name behind short stored name `stored` in the directory at `dir`.
    pub fn plain_name(&self, dir: &[u8], stored: &str) -> Result<Vec<u8>> {
        self.volume
            .names()
            .decrypt_short(&self.keys.dir_id(dir), stored)
    }

    /// The `cloakfs.dirid` content of the directory at `dir` (not the root).
    pub fn dir_id_bytes(&self, dir: &[u8]) -> [u8; 16] {
        self.keys.dir_id(dir).0
    }

    /// The backing symlink target of the symlink at `rel` pointing to `target`.
    pub fn symlink_target(&self, rel: &[u8], target: &[u8]) -> Result<String> {
        let nonce = self.keys.symlink_nonce(rel, target);
        // A long target would need a file in the view's cloakfs.symlinks/, which the view
        // does not serve: such a symlink is reported, not shown.
        match self
            .volume
            .meta()
            .encrypt_symlink_with_nonce(&nonce, target)?
        {
            crate::format::meta::SealedTarget::Inline(t) => Ok(t),
            crate::format::meta::SealedTarget::Long { .. } => Err(Error::NameTooLong),
        }
    }

    /// The backing size of a regular file of `plain_size` bytes.
    pub fn file_size(&self, plain_size: u64) -> u64 {
        self.layout.cipher_size(plain_size)
    }

    /// The cipher of the regular file at relative path `rel`, for [`ReverseFile::read`].
    pub fn file(&self, rel: &[u8]) -> ReverseFile<'_> {
        let id = self.keys.file_id(rel);
        ReverseFile {
            view: self,
            id,
            cipher: self.volume.content().file_cipher(id),
        }
    }
}

/// One regular file of the view: its derived ID and cipher.
pub struct ReverseFile<'a> {
    view: &'a ReverseView,
    id: FileId,
    cipher: crate::format::content::FileCipher,
}

impl ReverseFile<'_> {
    /// Reads up to `len` backing bytes at backing offset `off` of the view of `plain`, whose
    /// plaintext size is `plain_size` (as the view last reported it). A file that changed
    /// size since then fails with EIO rather than give a mix of two versions in one block.
    pub fn read(&self, plain: &File, plain_size: u64, off: u64, len: usize) -> Result<Vec<u8>> {
        let layout = self.view.layout;
        let size = layout.cipher_size(plain_size);
        let end = size.min(off.saturating_add(len as u64));
        if off >= end {
            return Ok(Vec::new());
        }
        let mut out = Vec::with_capacity((end - off) as usize);
        if off < HEADER_LEN {
            let header = FileHeader { id: self.id }.to_bytes();
            out.extend_from_slice(&header[off as usize..end.min(HEADER_LEN) as usize]);
        }
        if end <= HEADER_LEN {
            return Ok(out);
        }
        let cbs = layout.cipher_block_size();
        let from = off.max(HEADER_LEN) - HEADER_LEN;
        let to = end - HEADER_LEN;
        let first = from / cbs;
        let last = (to - 1) / cbs;
        let bs = layout.block_size() as usize;
        let over = layout.overhead() as usize;
        // Wiped when dropped, on the error paths too.
        let mut plain_buf = zeroize::Zeroizing::new(vec![0u8; bs]);
        let mut sealed = vec![0u8; bs + over];
        for n in first..=last {
            let blen = layout.block_len(n, plain_size) as usize;
            let p = &mut plain_buf[..blen];
            plain
                .read_exact_at(p, layout.plain_offset(n))
                .map_err(|e| match e.kind() {
                    std::io::ErrorKind::UnexpectedEof => Error::Io(std::io::Error::other(
                        "plaintext file shrank while it was read",
                    )),
                    _ => Error::Io(e),
                })?;
            let s = &mut sealed[..blen + over];
            let nonce = self.view.keys.block_nonce(&self.id, n);
            self.cipher.seal_derived(n, &nonce, p, s)?;
            let block_start = n * cbs;
            let lo = from.max(block_start) - block_start;
            let hi = to.min(block_start + s.len() as u64) - block_start;
            out.extend_from_slice(&s[lo as usize..hi as usize]);
        }
        Ok(out)
    }
}
