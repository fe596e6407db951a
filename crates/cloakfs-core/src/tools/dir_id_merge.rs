//! Directories holding sync clients' copies of their `cloakfs.dirid` (a conflict between two
//! devices that gave one directory different IDs; `sync_folder::is_dir_id_copy`): the IDs of
//! the copies, used by the walk to name the entries made under them, and the merge
//! `fsck --repair` does: each such entry is renamed to its name under the main ID (a name
//! taken under both gets the conflict name every reader lists it under,
//! `sync_folder::conflicts_in_dir`), then the copies nothing is named under
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

/// The ID-file copies of [`copies`] by file name, sorted by it, each ID once: the order in
/// which readers try them (the first that has a name keeps it).
pub fn named_copies(dir: &Path, names: &[OsString], main: &DirId) -> Vec<(String, DirId)> {
    let mut v: Vec<(String, DirId)> = copies(dir, names, main)
        .into_iter()
        .filter_map(|(p, id)| Some((p.file_name()?.to_str()?.to_string(), id)))
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    let mut seen: Vec<DirId> = Vec::new();
    v.retain(|(_, id)| {
        let fresh = !seen.contains(id);
        seen.push(*id);
        fresh
    });
    v
}

/// Merges backing directory `dir` (ID `main`) with its ID-file copies: renames every entry
/// named under a copy's ID to its name under `main`, then removes the copies. Returns how many
/// entries it renamed.
pub fn merge(volume: &Volume, dir: &Path, main: &DirId) -> std::io::Result<usize> {
    let names: Vec<OsString> = std::fs::read_dir(dir)?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<std::io::Result<_>>()?;
    let copies = copies(dir, &names, main);
    let others = named_copies(dir, &names, main);
    // A name taken under both IDs: the one under the copy gets the conflict name every reader
    // shows it under, so nothing changes in the plaintext view.
    let listing: Vec<String> = names
        .iter()
        .filter_map(|n| n.to_str().map(str::to_string))
        .collect();
    let shown =
        crate::sync_folder::conflicts_in_dir(volume.names(), main, &others, &listing, |l| {
            crate::sync_folder::long_name_in(dir, l)
        });
    let mut sorted: Vec<&OsString> = names.iter().collect();
    sorted.sort();
    let mut moved = 0;
    for name in sorted
        .into_iter()
        .filter(|n| crate::tools::walk::is_payload(n))
    {
        if decrypt_name(volume, main, dir, name).is_ok() {
            continue;
        }
        let Some((plain, id)) = others.iter().find_map(|(_, id)| {
            decrypt_name(volume, id, dir, name)
                .ok()
                .map(|(p, _)| (p, *id))
        }) else {
            continue;
        };
        let target = name
            .to_str()
            .and_then(|n| shown.get(n))
            .map_or_else(|| plain.clone(), |c| c.shown.clone());
        let stored = volume
            .names()
            .encrypt(main, &target)
            .map_err(|e| std::io::Error::other(e.to_string()))?;
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
