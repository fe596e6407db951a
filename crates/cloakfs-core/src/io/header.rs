//! Where a backing file's header is read and written: its first bytes (of the volume's header
//! length, sections 8.1 and 18.1), or, for a suite that keeps the backing file at the
//! plaintext's exact size (AES-256-XTS), an extended attribute of the backing file (docs/FORMAT.md
//! section 20). What the header means (a file ID, or wrapped file keys) is the codec's.

use crate::error::{Error, Result};
use crate::format::content::{ContentCodec, ContentSuite, FileHeader, FileId, HeaderPlace};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// The header bytes of a backing file of `len` bytes, or `None` for an empty one (it has none).
pub fn read(codec: &ContentCodec, file: &File, len: u64) -> Result<Option<Vec<u8>>> {
    if len == 0 {
        return Ok(None);
    }
    match codec.suite().header_place() {
        HeaderPlace::InFile => {
            let header_len = codec.layout().header_len();
            if len < header_len {
                return Err(Error::Tampered("file header truncated".into()));
            }
            let mut h = vec![0u8; header_len as usize];
            file.read_exact_at(&mut h, 0)?;
            Ok(Some(h))
        }
        HeaderPlace::Xattr(name) => {
            let mut h = vec![0u8; XATTR_ROOM];
            match rustix::fs::fgetxattr(file, name, &mut h[..]) {
                Ok(n) => {
                    h.truncate(n);
                    Ok(Some(h))
                }
                Err(rustix::io::Errno::RANGE) => {
                    Err(Error::Tampered(format!("file header ({name}) malformed")))
                }
                Err(rustix::io::Errno::NODATA) => Err(Error::Tampered(format!(
                    "file has data but no {name} xattr (copied without xattrs?)"
                ))),
                Err(e) => Err(std::io::Error::from(e).into()),
            }
        }
    }
}

/// Room for the value of a header xattr: more than its longest version (34 bytes, FORMAT.md
/// section 20); a value that does not fit is malformed.
const XATTR_ROOM: usize = 64;

/// Keeps a new file's `header` bytes where its suite keeps headers: an xattr is written here,
/// before any block is sealed under the header's key; an in-file header is returned, for the
/// caller to write at offset 0 (ahead of, or with, the first blocks).
pub fn place(codec: &ContentCodec, file: &File, header: Vec<u8>) -> Result<Vec<u8>> {
    match codec.suite().header_place() {
        HeaderPlace::InFile => Ok(header),
        HeaderPlace::Xattr(name) => {
            set_xattr(file, name, &header)?;
            Ok(Vec::new())
        }
    }
}

/// Replaces the header of a file that has one with `header`, where its suite keeps headers.
pub fn rewrite(codec: &ContentCodec, file: &File, header: &[u8]) -> Result<()> {
    match codec.suite().header_place() {
        HeaderPlace::InFile => Ok(file.write_all_at(header, 0)?),
        HeaderPlace::Xattr(name) => set_xattr(file, name, header),
    }
}

fn set_xattr(file: &File, name: &str, value: &[u8]) -> Result<()> {
    rustix::fs::fsetxattr(file, name, value, rustix::fs::XattrFlags::empty())
        .map_err(|e| refusal_if_unsupported(e, name))
}

/// Whether the file system of directory `dir` can hold the headers of `suite`: for an xattr,
/// one is written to a scratch file in `dir` and removed again. A file system without user
/// xattrs (ramfs, vfat, some network mounts) gets a clear refusal.
pub fn check_dir(suite: ContentSuite, dir: &Path) -> Result<()> {
    let HeaderPlace::Xattr(name) = suite.header_place() else {
        return Ok(());
    };
    let scratch = tempfile_in(dir)?;
    let r = rustix::fs::fsetxattr(
        scratch.as_file(),
        name,
        &FileHeader {
            id: FileId([0; 16]),
        }
        .to_bytes(),
        rustix::fs::XattrFlags::empty(),
    );
    drop(scratch);
    r.map_err(|e| refusal_if_unsupported(e, name))
}

/// Name prefix of the scratch file [`check_dir`] makes (and removes) in the cipher directory.
pub const SCRATCH_PREFIX: &str = ".cloakfs-xattr-check-";

fn tempfile_in(dir: &Path) -> Result<ScratchFile> {
    for _ in 0..16 {
        let path = dir.join(format!(
            "{SCRATCH_PREFIX}{:016x}",
            u64::from_le_bytes(crate::crypto::random::array())
        ));
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
        {
            Ok(file) => return Ok(ScratchFile { file, path }),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(Error::Refused(format!(
        "cannot make a scratch file in {}",
        dir.display()
    )))
}

/// A file removed when dropped.
struct ScratchFile {
    file: File,
    path: std::path::PathBuf,
}

impl ScratchFile {
    fn as_file(&self) -> &File {
        &self.file
    }
}

impl Drop for ScratchFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn refusal_if_unsupported(e: rustix::io::Errno, name: &str) -> Error {
    if e == rustix::io::Errno::NOTSUP || e == rustix::io::Errno::NOSYS {
        Error::Refused(format!(
            "the cipher directory's file system does not support user xattrs, which \
             aes-256-xts needs (each file's ID is kept in its {name} xattr)"
        ))
    } else {
        std::io::Error::from(e).into()
    }
}
