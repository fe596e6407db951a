//! Directories holding sync clients' copies of their `cloakfs.dirid` (a conflict between two
//! devices that gave one directory different IDs; `sync_folder::is_dir_id_copy`): the IDs of
//! the copies, used by the walk to name the entries made under them, and the merge
//! `fsck --repair` does: each such entry is renamed to its name under the main ID (a name
//! taken under both becomes `NAME (conflict N).EXT`), then the copies nothing is named under
//! any more are removed. Nothing but the now unused copies is ever deleted.

use crate::format::names::{self, DirId, StoredName};
use crate::sync_folder::is_dir_id_copy;
use crate::tools::paths::{parse_dir_id, write_sidecar, DIRID_LEN};
use crate::tools::walk::decrypt_name;
use crate::volume::Volume;
use std::ffi::OsString;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// The ID-file copies in `names` of backing directory `dir`, with their IDs, leaving out those
/// that hold `main` or are not 16 bytes.
pub fn copies(dir: &Path, names: &[OsString], main: &DirId) -> Vec<(PathBuf, DirId)> {
    let mut out: Vec<(PathBuf, DirId)> = Vec::new();
    for n in names.iter().filter(|n| is_dir_id_copy(n.as_bytes())) {
        let path = dir.join(n);
        let mut bytes = Vec::new();
        let read = std::fs::File::open(&path)
            .and_then(|f| f.take(DIRID_LEN as u64 + 1).read_to_end(&mut bytes));
        if let (Ok(_), Ok(id)) = (read, parse_dir_id(&bytes)) {
            if id != *main {
                out.push((path, id));
            }
        }
    }
    out
}

/// The plaintext name `plain` with ` (conflict N)` before its extension.
fn conflict_name(plain: &[u8], n: u32) -> Vec<u8> {
    let dot = plain.iter().rposition(|&b| b == b'.').filter(|&i| i > 0);
    let (stem, ext) = plain.split_at(dot.unwrap_or(plain.len()));
    [stem, format!(" (conflict {n})").as_bytes(), ext].concat()
}

/// Merges backing directory `dir` (ID `main`) with its ID-file copies: renames every entry
/// named under a copy's ID to its name under `main`, then removes the copies. Returns how many
/// entries it renamed.
pub fn merge(volume: &Volume, dir: &Path, main: &DirId) -> std::io::Result<usize> {
    let names: Vec<OsString> = std::fs::read_dir(dir)?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<std::io::Result<_>>()?;
    let copies = copies(dir, &names, main);
    let mut moved = 0;
    for name in names.iter().filter(|n| crate::tools::walk::is_payload(n)) {
        if decrypt_name(volume, main, dir, name).is_ok() {
            continue;
        }
        let Some((plain, id)) = copies.iter().find_map(|(_, id)| {
            decrypt_name(volume, id, dir, name)
                .ok()
                .map(|(p, _)| (p, *id))
        }) else {
            continue;
        };
        let mut target = plain.clone();
        let mut n = 0;
        let stored = loop {
            let stored = volume
                .names()
                .encrypt(main, &target)
                .map_err(|e| std::io::Error::other(e.to_string()))?;
            if dir.join(stored.backing()).symlink_metadata().is_err() {
                break stored;
            }
            n += 1;
            target = conflict_name(&plain, n);
        };
        write_sidecar(dir, &stored).map_err(|e| std::io::Error::other(e.to_string()))?;
        rustix::fs::renameat_with(
            rustix::fs::CWD,
            dir.join(name).as_path(),
            rustix::fs::CWD,
            dir.join(stored.backing()).as_path(),
            rustix::fs::RenameFlags::NOREPLACE,
        )?;
        // The old long name's sidecar, now without its entry.
        let old = volume
            .names()
            .encrypt(&id, &plain)
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        if let StoredName::Long { backing, .. } = old {
            let _ = std::fs::remove_file(dir.join(names::sidecar_name(&backing)));
        }
        moved += 1;
    }
    std::fs::File::open(dir)?.sync_all()?;
    // Only copies nothing is named under any more (every entry was moved above, unless a
    // rename failed, which returned early).
    for (path, _) in &copies {
        std::fs::remove_file(path)?;
    }
    std::fs::File::open(dir)?.sync_all()?;
    Ok(moved)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conflict_names_keep_the_extension() {
        assert_eq!(conflict_name(b"report.txt", 1), b"report (conflict 1).txt");
        assert_eq!(conflict_name(b"notes", 2), b"notes (conflict 2)");
        assert_eq!(conflict_name(b".bashrc", 1), b".bashrc (conflict 1)");
    }
}
