//! Creating plaintext entries in a cipher directory without a mount: what the FUSE front end
//! does per request, as plain functions on paths. Used to build volumes in tests and by offline
//! tools; the volume must not be mounted at the same time.
//!
//! Every function follows the writer rules of docs/FORMAT.md: a new directory gets its
//! `cloakfs.dirid` (fsynced) before anything is created in it, and a long name's sidecar is
//! written and fsynced before its entry.

use crate::error::{Error, Result};
use crate::format::names::{DirId, StoredName};
use crate::io::file::ContentFile;
use crate::tools::paths::{create_dir_id, read_dir_id, write_sidecar};
use crate::volume::Volume;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// Writes entries into the cipher directory `cipherdir` of an unlocked volume.
#[derive(Debug)]
pub struct Writer<'v> {
    volume: &'v Volume,
    cipherdir: PathBuf,
}

impl<'v> Writer<'v> {
    /// A writer for the volume at `cipherdir`.
    pub fn new(volume: &'v Volume, cipherdir: &Path) -> Self {
        Self {
            volume,
            cipherdir: cipherdir.to_path_buf(),
        }
    }

    /// The backing path that plaintext path `plain` would have: its parent must exist; the
    /// long name's sidecar is written if needed.
    fn prepare(&self, plain: &Path) -> Result<PathBuf> {
        Ok(self.prepare_in(plain)?.0)
    }

    /// [`Self::prepare`], also giving the parent's directory ID.
    fn prepare_in(&self, plain: &Path) -> Result<(PathBuf, DirId)> {
        let name = plain.file_name().ok_or(Error::InvalidName)?;
        let parent = crate::tools::paths::encrypt_path(
            self.volume,
            &self.cipherdir,
            plain.parent().unwrap_or(Path::new("")),
        )?;
        let dir_id = read_dir_id(self.volume, &self.cipherdir, &parent)?;
        let stored = self.volume.names().encrypt(&dir_id, name.as_bytes())?;
        write_sidecar(&parent, &stored)?;
        Ok((parent.join(stored.backing()), dir_id))
    }

    /// The backing path of an existing plaintext path.
    pub fn backing(&self, plain: &Path) -> Result<PathBuf> {
        crate::tools::paths::encrypt_path(self.volume, &self.cipherdir, plain)
    }

    /// Creates directory `plain` with its directory ID; returns the backing path.
    pub fn mkdir(&self, plain: &Path) -> Result<PathBuf> {
        let (b, parent_id) = self.prepare_in(plain)?;
        std::fs::create_dir(&b)?;
        let name = plain.file_name().ok_or(Error::InvalidName)?;
        create_dir_id(&b, self.volume.new_dir_id(&parent_id, name.as_bytes()))?;
        Ok(b)
    }

    /// Creates directory `plain` and its missing parents.
    pub fn mkdir_all(&self, plain: &Path) -> Result<PathBuf> {
        let mut cur = PathBuf::new();
        let mut b = self.cipherdir.clone();
        for c in plain.components() {
            cur.push(c);
            b = self.backing(&cur)?;
            if !b.exists() {
                b = self.mkdir(&cur)?;
            }
        }
        Ok(b)
    }

    /// Creates (or replaces) regular file `plain` with contents `data`.
    pub fn write_file(&self, plain: &Path, data: &[u8]) -> Result<PathBuf> {
        let b = self.prepare(plain)?;
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&b)?;
        let cf = ContentFile::open(self.volume.content().clone(), f)?;
        let mut off = 0;
        for chunk in data.chunks(1 << 20) {
            cf.write_at(off, chunk)?;
            off += chunk.len() as u64;
        }
        Ok(b)
    }

    /// Creates symlink `plain` pointing to `target` (stored encrypted).
    pub fn symlink(&self, plain: &Path, target: &[u8]) -> Result<PathBuf> {
        let b = self.prepare(plain)?;
        let t = self.volume.meta().encrypt_symlink(target)?;
        crate::io::long_targets::store_at(&self.cipherdir, &t)?;
        std::os::unix::fs::symlink(t.backing_target(), &b)?;
        Ok(b)
    }

    /// Creates fifo `plain`.
    pub fn mkfifo(&self, plain: &Path) -> Result<PathBuf> {
        let b = self.prepare(plain)?;
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &b,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o644),
            0,
        )
        .map_err(std::io::Error::from)?;
        Ok(b)
    }

    /// Makes `new` a hard link of existing file `existing`.
    pub fn hard_link(&self, existing: &Path, new: &Path) -> Result<PathBuf> {
        let src = self.backing(existing)?;
        let b = self.prepare(new)?;
        std::fs::hard_link(src, &b)?;
        Ok(b)
    }

    /// Sets extended attribute `name` (`user.` names are encrypted, others stored as they are)
    /// of plaintext entry `plain`.
    pub fn set_xattr(&self, plain: &Path, name: &[u8], value: &[u8]) -> Result<()> {
        let b = self.backing(plain)?;
        match self.volume.meta().encrypt_xattr_name(name)? {
            Some(stored) => {
                let v = self.volume.meta().encrypt_xattr_value(&stored, value)?;
                crate::io::xattrs::set(&b, &stored, &v)?;
            }
            None => crate::io::xattrs::set(&b, name, value)?,
        }
        Ok(())
    }

    /// The stored (encrypted) name of plaintext name `name` in plaintext directory `dir`.
    pub fn stored_name(&self, dir: &Path, name: &OsStr) -> Result<StoredName> {
        let parent = self.backing(dir)?;
        let dir_id = read_dir_id(self.volume, &self.cipherdir, &parent)?;
        self.volume.names().encrypt(&dir_id, name.as_bytes())
    }
}
