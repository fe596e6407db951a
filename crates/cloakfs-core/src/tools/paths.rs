//! Path translation between the plaintext view and the cipher directory, without a mount.
//! Used by offline tools and by tests; the FUSE front end does the same per directory.

use crate::error::{Error, Result};
use crate::format::names::{self, DirId, StoredName, DIRID_FILE};
use crate::volume::Volume;
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

/// Length of a `cloakfs.dirid` file.
pub const DIRID_LEN: usize = 16;

/// Parses the contents of a `cloakfs.dirid` file.
pub fn parse_dir_id(bytes: &[u8]) -> Result<DirId> {
    let id: [u8; DIRID_LEN] = bytes
        .try_into()
        .map_err(|_| Error::Tampered(format!("{DIRID_FILE} is not {DIRID_LEN} bytes")))?;
    Ok(DirId(id))
}

/// Reads the ID of backing directory `dir`; the root's ID comes from the volume.
pub fn read_dir_id(volume: &Volume, cipherdir: &Path, dir: &Path) -> Result<DirId> {
    if dir == cipherdir {
        return Ok(volume.root_dir_id());
    }
    let mut bytes = Vec::new();
    std::fs::File::open(dir.join(DIRID_FILE))?
        .take(DIRID_LEN as u64 + 1)
        .read_to_end(&mut bytes)?;
    parse_dir_id(&bytes)
}

/// Writes `cloakfs.dirid` holding `id` into the new backing directory `dir` and makes it
/// durable.
pub fn create_dir_id(dir: &Path, id: DirId) -> Result<DirId> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(dir.join(DIRID_FILE))?;
    f.write_all(&id.0)?;
    f.sync_all()?;
    std::fs::File::open(dir)?.sync_all()?;
    Ok(id)
}

/// The backing path of plaintext path `plain` (relative to the volume root).
pub fn encrypt_path(volume: &Volume, cipherdir: &Path, plain: &Path) -> Result<PathBuf> {
    let mut backing = cipherdir.to_path_buf();
    for c in plain.components() {
        match c {
            Component::Normal(name) => {
                let dir_id = read_dir_id(volume, cipherdir, &backing)?;
                let stored = volume.names().encrypt(&dir_id, name.as_bytes())?;
                backing.push(stored.backing());
            }
            Component::RootDir | Component::CurDir => {}
            _ => return Err(Error::InvalidName),
        }
    }
    Ok(backing)
}

/// The plaintext name of backing entry `entry` inside backing directory `dir`; `None` for
/// cloakfs's own files.
pub fn decrypt_entry(
    volume: &Volume,
    dir_id: &DirId,
    dir: &Path,
    entry: &str,
) -> Result<Option<Vec<u8>>> {
    match names::classify(entry) {
        names::EntryKind::Internal => Ok(None),
        names::EntryKind::Encrypted(e) => volume.names().decrypt_short(dir_id, e).map(Some),
        names::EntryKind::Long(b) => {
            let full = read_sidecar(&dir.join(names::sidecar_name(b)))?;
            volume
                .names()
                .decrypt_long(dir_id, b, full.trim_end())
                .map(Some)
        }
    }
}

/// Reads the sidecar file at `path`: the full encrypted name, as text (invalid UTF-8 replaced:
/// such a sidecar matches no entry). A file over [`names::SIDECAR_MAX`] bytes is refused
/// (`EFBIG`) without being read into memory.
pub fn read_sidecar(path: &Path) -> std::io::Result<String> {
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(names::SIDECAR_MAX as u64 + 1)
        .read_to_end(&mut bytes)?;
    if bytes.len() > names::SIDECAR_MAX {
        return Err(std::io::Error::from_raw_os_error(libc::EFBIG));
    }
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// Writes the sidecar of a long name (before the entry itself is created).
pub fn write_sidecar(dir: &Path, stored: &StoredName) -> Result<()> {
    if let StoredName::Long { backing, full } = stored {
        let mut f = std::fs::File::create(dir.join(names::sidecar_name(backing)))?;
        f.write_all(full.as_bytes())?;
        f.sync_all()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::keys::MasterKey;
    use crate::format::config::{VolumeConfig, VolumeParams};

    fn volume() -> Volume {
        let mk = MasterKey::generate();
        let mut c = VolumeConfig::new(VolumeParams::new());
        c.seal(&mk);
        Volume::from_master_key(c, &mk).unwrap()
    }

    /// A planted sidecar far larger than any encrypted name is refused before it is read
    /// into memory (the offline tools read it whole before; the FUSE side never did).
    #[test]
    fn oversized_sidecar_is_refused_unread() {
        let v = volume();
        let dir = tempfile::tempdir().unwrap();
        let dir_id = DirId([1; 16]);
        let StoredName::Long { backing, full } = v.names().encrypt(&dir_id, &[b'x'; 255]).unwrap()
        else {
            panic!("255 bytes make a long name")
        };
        let sidecar = dir.path().join(names::sidecar_name(&backing));
        std::fs::write(&sidecar, format!("{full}\n")).unwrap();
        let plain = decrypt_entry(&v, &dir_id, dir.path(), &backing).unwrap();
        assert_eq!(plain, Some(vec![b'x'; 255]));

        let planted = std::fs::File::create(&sidecar).unwrap();
        planted.set_len(1 << 40).unwrap();
        let err = read_sidecar(&sidecar).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EFBIG));
        assert!(decrypt_entry(&v, &dir_id, dir.path(), &backing).is_err());
        let walked = crate::tools::walk::decrypt_name(&v, &dir_id, dir.path(), backing.as_ref());
        assert!(walked.unwrap_err().1.contains("sidecar"));
    }
}
