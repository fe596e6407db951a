//! The file's header: its file ID, and who its key is granted to (a shared file's
//! recipients).
//!
//! Nothing new is sealed under an ID not known to be the file's own (drawn here, or proven by
//! a block of the file that authenticates under it): a file without data, or of holes only,
//! gets a fresh header first ([`ContentFile::new_header`], FORMAT.md 8.4). Shared, a header
//! found on the store is kept: no fresh one replaces it (FORMAT.md 19).

use super::{tampered, ContentFile, State};
use crate::error::{Error, Result};
use crate::format::content::{ContentCodec, FileCipher, FileId, FreshNonce};
use crate::format::filekey::FileKeySource;
use crate::io::header;
use std::os::unix::fs::FileExt;

/// Who a new file's key is granted to on a sharing volume: the member and `defaults` (its
/// directory's default recipients); empty (the member alone) without defaults.
fn first_recipients(
    keys: &crate::format::filekey::WrappedKeys,
    defaults: &[String],
) -> Vec<String> {
    if defaults.is_empty() {
        return Vec::new();
    }
    let mut all: Vec<String> = keys
        .member()
        .map(|m| vec![m.recipient().to_string()])
        .unwrap_or_default();
    for d in defaults {
        if !all.iter().any(|a| crate::format::filekey::same_key(a, d)) {
            all.push(d.clone());
        }
    }
    all
}

/// The header of a new file made with its header already in place (shared storage, FORMAT.md
/// 19: the name appears only once the header is there), with a fresh file ID; on a sharing
/// volume granted as [`ContentFile::inherit`] grants a new file's first data. `None` for a
/// suite that keeps its headers in an xattr (no bytes in the file).
pub fn new_file_header(codec: &ContentCodec, defaults: &[String]) -> Result<Option<Vec<u8>>> {
    if codec.layout().header_len() == 0 {
        return Ok(None);
    }
    let recipients = match codec.key_source() {
        FileKeySource::Wrapped(keys) => first_recipients(keys, defaults),
        FileKeySource::Derived(_) => Vec::new(),
    };
    Ok(Some(codec.fresh_header(&recipients)?.0))
}

impl ContentFile {
    /// The file ID, if the file has a header.
    pub fn file_id(&self) -> Result<Option<FileId>> {
        Ok(self.loaded_state()?.cipher.as_ref().map(FileCipher::id))
    }

    /// A shared file's recipients (empty for a file whose key is derived, or that has no
    /// header yet and no recipients given).
    pub fn recipients(&self) -> Result<Vec<String>> {
        Ok(self.loaded_state()?.recipients.clone())
    }

    /// For a new shared file (no header yet, no recipients): grants its first data to the
    /// member and to `defaults` (its directory's default recipients).
    pub fn inherit(&self, defaults: &[String]) -> Result<()> {
        let FileKeySource::Wrapped(keys) = self.codec.key_source() else {
            return Ok(());
        };
        let mut st = self.write_state();
        if !st.recipients.is_empty() || defaults.is_empty() || self.file.metadata()?.len() > 0 {
            return Ok(());
        }
        st.recipients = first_recipients(keys, defaults);
        Ok(())
    }

    /// Grants a shared file to `more` recipients (keys it has already are skipped); returns
    /// how many were added. The header is re-sealed under the same file key and written in
    /// place; open handles keep their cipher.
    pub fn grant(&self, more: &[String]) -> Result<usize> {
        let FileKeySource::Wrapped(keys) = self.codec.key_source() else {
            return Err(Error::Refused(
                "this volume is not a sharing volume (made without --sharing)".into(),
            ));
        };
        let (_hold, mut st) = self.changing()?;
        let header_len = self.layout().header_len();
        let old = if self.file.metadata()?.len() >= header_len {
            let mut h = vec![0u8; header_len as usize];
            self.file.read_exact_at(&mut h, 0)?;
            Some(h)
        } else {
            None
        };
        let (header, recipients, added) = keys.regrant(old.as_deref(), &st.recipients, more)?;
        if added > 0 {
            match old {
                Some(_) => self.file.write_all_at(&header, 0)?,
                None => self.write_header(&header)?,
            }
            self.file.sync_data()?;
        }
        st.recipients = recipients;
        Ok(added)
    }

    /// Gives a file whose ID is not its own (no data, or holes only) a fresh header and file
    /// ID before anything is sealed under it.
    pub(super) fn ensure_header(&self, st: &mut State) -> Result<()> {
        match self.new_header(st, 0)? {
            Some((header, _)) => self.put_header(st, &header),
            None => Ok(()),
        }
    }

    /// Writes a fresh `header` alone: a file without data becomes header-only; a file of
    /// holes keeps its length, since its holes read as zeros under any ID.
    pub(super) fn put_header(&self, st: &State, header: &[u8]) -> Result<()> {
        if st.size == 0 {
            self.write_header(header)
        } else {
            Ok(self.file.write_all_at(header, 0)?)
        }
    }

    /// For a file whose ID is not its own yet: a fresh header, already keying `st`, for the
    /// caller to write, with `nonces` fresh nonces for the blocks it seals next (`None` if the
    /// file keeps its ID). For a file without data the caller may write it ahead of its first
    /// block in one system call: whatever the backing file holds then (nothing, a header, or a
    /// header and fewer bytes than a sealed block's overhead) lies within that write, so
    /// nothing old survives it.
    pub(super) fn new_header(
        &self,
        st: &mut State,
        nonces: usize,
    ) -> Result<Option<(Vec<u8>, Vec<FreshNonce>)>> {
        // Shared: a header found on the store is kept, whatever the file holds. Other clients
        // may be writing the file at this moment with no lock between us (SFTP): a header
        // written over theirs would leave their blocks failing authentication, so a header,
        // once on the store, is never written again (FORMAT.md 19). `changing` has just read
        // it again if the file has no data.
        if self.sharing.is_shared() && st.cipher.is_some() {
            st.id_owned = true;
            return Ok(None);
        }
        // A file without data gets a fresh ID every time: a failed first write may have
        // taken its header away again (put_back).
        if st.size > 0 && (st.id_owned || self.first_sealed_block_opens(st)?) {
            st.id_owned = true;
            return Ok(None);
        }
        let (bytes, opened, nonces) = self
            .codec
            .fresh_header_with_nonces(&st.recipients, nonces)?;
        // The header's in-file bytes (none where the suite keeps it in an xattr, written here).
        let bytes = header::place(&self.codec, &self.file, bytes)?;
        st.cipher = Some(opened.cipher);
        st.recipients = opened.recipients;
        st.id_owned = true;
        Ok(Some((bytes, nonces)))
    }

    /// Whether the file has a sealed (non-hole) block, after opening the first one: that
    /// proves the ID its header holds is the file's own. `false` for a file of holes only;
    /// an error if that block does not authenticate. Unallocated ranges are skipped where the
    /// backing file system reports them (SEEK_DATA), so a sparse file costs no reads.
    fn first_sealed_block_opens(&self, st: &State) -> Result<bool> {
        let layout = self.layout();
        let cipher = st
            .cipher
            .as_ref()
            .ok_or_else(|| tampered("file has data but no header".into()))?;
        let blocks = layout.block_count(st.size);
        let cbs = layout.cipher_block_size();
        let mut sealed = vec![0u8; cbs as usize];
        let mut plain = vec![0u8; layout.block_size() as usize];
        let mut b = 0;
        while b < blocks {
            match rustix::fs::seek(
                &self.file,
                rustix::fs::SeekFrom::Data(layout.cipher_offset(b)),
            ) {
                Ok(at) => b = b.max(at.saturating_sub(layout.header_len()) / cbs),
                Err(rustix::io::Errno::NXIO) => return Ok(false),
                // No SEEK_DATA here: read every block.
                Err(_) => {}
            }
            if b >= blocks {
                break;
            }
            let len = layout.block_len(b, st.size) as usize;
            let sealed = &mut sealed[..len + layout.overhead() as usize];
            self.read_sealed(b, sealed, layout.cipher_offset(b))?;
            let hole = len as u64 == layout.block_size()
                && !self.codec.strict_holes()
                && sealed.iter().all(|&x| x == 0);
            if !hole {
                cipher.open(b, sealed, &mut plain[..len])?;
                return Ok(true);
            }
            b += 1;
        }
        Ok(false)
    }

    /// Writes `header` alone, leaving a header-only file.
    fn write_header(&self, header: &[u8]) -> Result<()> {
        let len = header.len() as u64;
        self.reserve(self.file.metadata()?.len(), len)?;
        self.file.write_all_at(header, 0)?;
        // Shared, another client may have written blocks meanwhile: they stay.
        if !self.sharing.is_shared() {
            self.file.set_len(len)?;
        }
        Ok(())
    }
}
